"""stoker.image_text.ImageProcessor: Hugging Face's CLIP, SigLIP and Qwen2-VL image processors,
natively, against transformers' own (its PIL processors, and the torchvision ones); and PIL's
bicubic resampling, which they all use."""

import io
import json
import tarfile

import numpy as np
import pytest

import stoker
from stoker.image_text import Image, ImageProcessor, Label, PatchImageProcessor

PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("stoker._text")
transformers = pytest.importorskip("transformers")

# Stated tolerances (docs/image-text.md, "Processors"): the uint8 resize is PIL's bit for bit and
# the rescale and normalize round as numpy's float32 does, so against the PIL processors the
# measured difference is 0 (asserted within 1e-6); torchvision's bicubic on tensors (the default,
# "fast" processors) is another resampler: measured at most 0.03 (a level or two of 255 over std).
SLOW_ATOL = 1e-6
FAST_ATOL = 0.05

LLAVA = {"crop_size": {"height": 336, "width": 336}, "do_center_crop": True,
         "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
         "image_mean": [0.48145466, 0.4578275, 0.40821073],
         "image_processor_type": "CLIPImageProcessor",
         "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaProcessor",
         "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}}
SMALL_CLIP = {**LLAVA, "crop_size": {"height": 24, "width": 24}, "size": {"shortest_edge": 24}}
SIGLIP = {"image_processor_type": "SiglipImageProcessor", "do_resize": True, "resample": 3,
          "size": {"height": 20, "width": 28}, "do_rescale": True, "rescale_factor": 1 / 255,
          "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
QWEN = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 4 * 28 * 28,
        "max_pixels": 24 * 28 * 28, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711]}

# (width, height, format): landscape, portrait, odd, tiny, large beyond QWEN's max_pixels, tall
# (its height shrinks by more than twice the width's pixels: Pillow 13 resizes it vertically
# first), and one whose CLIP crop offset is 1.5 (HF floors it, torchvision rounds it to 2).
IMAGES = [(64, 48, "JPEG"), (37, 53, "PNG"), (90, 31, "JPEG"), (9, 7, "PNG"), (300, 170, "JPEG"),
          (40, 600, "JPEG"), (54, 48, "PNG")]  # the last: 27 wide at 24, a crop offset of 1.5


def encode(w, h, fmt, seed):
    rng = np.random.default_rng(seed)
    # smooth content plus noise, as photographs: JPEG keeps it
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)),
                     ((x + y) * 3) % 256], -1)
    a = np.clip(base + rng.integers(-40, 40, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    PIL.fromarray(a).save(buf, fmt)
    return buf.getvalue()


# The PNG kinds with transparency that PIL writes: an alpha channel (RGBA, LA), palette alphas
# (P), one transparent palette index (P1), a transparent colour (RGBt, Lt) and 1-bit's (1t).
TRANSPARENT = ("RGBA", "LA", "P", "P1", "RGBt", "Lt", "1t")


def encode_transparent(w, h, kind, seed):
    """A PNG of `kind` (TRANSPARENT) whose transparency covers every alpha from 0 to 255."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
    a[:, :, 3] = np.arange(w * h, dtype=np.uint32).reshape(h, w) * 7 % 256
    rgb = np.ascontiguousarray(a[:, :, :3])
    rgb[: h // 3] = (10, 20, 30)  # the transparent colour's rows
    gray = np.ascontiguousarray(a[:, :, 0])
    gray[: h // 3] = 77
    palette = PIL.fromarray(rgb).quantize(64)
    image, options = {
        "RGBA": (PIL.fromarray(a, "RGBA"), {}),
        "LA": (PIL.fromarray(np.ascontiguousarray(a[:, :, [0, 3]]), "LA"), {}),
        "P": (palette, {"transparency": bytes(rng.integers(0, 256, 64, dtype=np.uint8))}),
        "P1": (palette, {"transparency": int(np.asarray(palette)[0, 0])}),
        "RGBt": (PIL.fromarray(rgb), {"transparency": (10, 20, 30)}),
        "Lt": (PIL.fromarray(gray), {"transparency": 77}),
        "1t": (PIL.fromarray(gray > 128).convert("1"), {"transparency": 0}),
    }[kind]
    buf = io.BytesIO()
    image.save(buf, "PNG", **options)
    return buf.getvalue()


def hf_processor(cfg, fast=False):
    from transformers.models.clip import image_processing_pil_clip as clip_pil
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as qwen_pil
    from transformers.models.siglip import image_processing_pil_siglip as siglip_pil
    kind = cfg["image_processor_type"]
    args = {k: v for k, v in cfg.items() if k not in ("image_processor_type", "processor_class")}
    if fast:
        return getattr(transformers, kind)(**args)
    cls = {"CLIPImageProcessor": clip_pil.CLIPImageProcessorPil,
           "SiglipImageProcessor": siglip_pil.SiglipImageProcessorPil,
           "Qwen2VLImageProcessor": qwen_pil.Qwen2VLImageProcessorPil}[kind]
    return cls(**args)


def hf_pixels(proc, data):
    with PIL.open(io.BytesIO(data)) as im:
        out = proc(images=im.convert("RGB"), return_tensors="np")
    return out


def write_tar(path, images):
    with tarfile.open(path, "w") as tar:
        for i, data in enumerate(images):
            for ext, payload in (("png" if data[:4] == b"\x89PNG" else "jpg", data),
                                 ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return str(path)


def native_pixels(tmp_path, processor, images):
    path = write_tar(tmp_path / "p.tar", images)
    ds = stoker.TarShards(path, fields={"pixel_values": Image(processor), "labels": Label()})
    # one sample per batch: the images' sizes differ, the outputs do not
    out = {}
    for b in stoker.DataLoader(ds, batch_size=1, output="numpy", num_workers=1):
        out[int(b["labels"][0])] = b["pixel_values"][0]
    return [out[i] for i in range(len(images))]


# ------------------------------------------------------------------------- PIL bicubic, exactly


def test_bicubic_resize_is_pils_bit_for_bit_up_and_down():
    from stoker._native import testing
    rng = np.random.default_rng(0)
    for trial in range(120):
        h, w = (int(v) for v in rng.integers(1, 60, 2))
        oh, ow = (int(v) for v in rng.integers(1, 90, 2))
        a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        box = (0.0, 0.0, float(w), float(h))
        if trial % 2:
            x0, x1 = sorted(rng.uniform(0, w, 2))
            y0, y1 = sorted(rng.uniform(0, h, 2))
            if x0 == x1 or y0 == y1:
                continue
            box = (float(x0), float(y0), float(x1), float(y1))
        want = np.asarray(PIL.fromarray(a).resize((ow, oh), PIL.BICUBIC, box=box))
        got = testing.image_op("resize", a, {"size": (ow, oh), "box": box, "filter": "bicubic"})
        np.testing.assert_array_equal(got, want, err_msg=f"{w}x{h} -> {ow}x{oh} box {box}")


def test_bicubic_resize_and_random_resized_crop_in_the_pipeline_are_pils(tmp_path):
    """Through the fused decode + resample (a tall PNG, resized vertically first by Pillow 13):
    Resize((h, w), bicubic), and a RandomResizedCrop whose draw is the whole image."""
    from stoker import transforms as T
    w, h = 40, 600
    data = encode(w, h, "PNG", 3)
    want = np.asarray(PIL.open(io.BytesIO(data)).convert("RGB").resize((24, 30), PIL.BICUBIC))
    for t in (T.Resize((30, 24), interpolation="bicubic"),
              T.RandomResizedCrop((30, 24), scale=(1.0, 1.0), ratio=(w / h, w / h),
                                  interpolation="bicubic")):
        got = native_pixels(tmp_path, T.Compose([t, T.ToTensor("uint8", "HWC")]), [data])[0]
        np.testing.assert_array_equal(got, want, err_msg=repr(t))


# ------------------------------------------------------------------ fixed resolution: CLIP, SigLIP


@pytest.mark.parametrize("cfg", [SMALL_CLIP, SIGLIP], ids=["clip", "siglip"])
def test_fixed_processors_equal_hugging_faces(tmp_path, cfg):
    images = [encode(w, h, fmt, i) for i, (w, h, fmt) in enumerate(IMAGES)]
    processor = ImageProcessor.from_pretrained(cfg)
    got = native_pixels(tmp_path, processor, images)
    slow, fast = hf_processor(cfg), hf_processor(cfg, fast=True)
    worst_fast = 0.0
    for data, g in zip(images, got):
        want = hf_pixels(slow, data)["pixel_values"][0]
        assert g.shape == want.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, want, rtol=0, atol=SLOW_ATOL)
        worst_fast = max(worst_fast, float(np.abs(g - hf_pixels(fast, data)["pixel_values"][0])
                                           .max()))
    assert worst_fast < FAST_ATOL


def test_transparency_is_composited_on_white_as_transformers_does(tmp_path):
    """Hugging Face's processors composite a PNG's transparency on white (convert_to_rgb), where
    torchvision's loader drops it: the native decode does either, bit for bit."""
    import warnings
    from transformers.image_transforms import convert_to_rgb
    from stoker import _native
    images = [encode_transparent(29 + 3 * i, 23 + 2 * i, kind, i)
              for i, kind in enumerate(TRANSPARENT)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PIL's advice to store palette alphas as RGBA
        for kind, data in zip(TRANSPARENT, images):
            with PIL.open(io.BytesIO(data)) as im:
                white = convert_to_rgb(im, return_numpy=True)
                dropped = np.asarray(im.convert("RGB"))
            assert not np.array_equal(white, dropped), kind  # the test would tell them apart
            np.testing.assert_array_equal(_native.image.decode_file(data, alpha="white"), white,
                                          err_msg=kind)
            np.testing.assert_array_equal(_native.image.decode_file(data), dropped, err_msg=kind)
        with pytest.raises(ValueError, match='alpha is "drop" or "white"'):
            _native.image.decode_file(images[0], alpha="black")

        # The processors: CLIP's pipeline in a TarShards field and in an ImageFolder, Qwen2-VL's
        # patches from bytes and from a PIL image, each equal to the HF processor given the
        # image as opened (it composites).
        clip, slow = ImageProcessor.from_pretrained(SMALL_CLIP), hf_processor(SMALL_CLIP)
        assert clip.decode_alpha == "white"
        want = []
        for data in images:
            with PIL.open(io.BytesIO(data)) as im:
                want.append(slow(images=im, return_tensors="np")["pixel_values"][0])
        for got, w, kind in zip(native_pixels(tmp_path, clip, images), want, TRANSPARENT):
            np.testing.assert_allclose(got, w, rtol=0, atol=SLOW_ATOL, err_msg=kind)
        for i, data in enumerate(images):
            (tmp_path / "folder" / f"c{i}").mkdir(parents=True)
            (tmp_path / "folder" / f"c{i}" / "x.png").write_bytes(data)
        folder = stoker.ImageFolder(tmp_path / "folder", transform=clip)
        for b in stoker.DataLoader(folder, batch_size=1, output="numpy"):
            label = int(b[1][0])
            np.testing.assert_allclose(b[0][0], want[label], rtol=0, atol=SLOW_ATOL,
                                       err_msg=TRANSPARENT[label])
        qwen, qwen_slow = ImageProcessor.from_pretrained(QWEN), hf_processor(QWEN)
        for kind, data in zip(TRANSPARENT, images):
            with PIL.open(io.BytesIO(data)) as im:
                ref = qwen_slow(images=im, return_tensors="np")["pixel_values"]
                from_pil = qwen(im)[0]
            np.testing.assert_array_equal(qwen(data)[0], ref, err_msg=kind)
            np.testing.assert_array_equal(from_pil, ref, err_msg=kind)


def test_llava_config_from_a_directory_and_an_hf_object(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "preprocessor_config.json").write_text(json.dumps(LLAVA))
    from_dir = ImageProcessor.from_pretrained(tmp_path / "m")
    from_obj = ImageProcessor.from_pretrained(hf_processor(LLAVA))
    assert from_dir._specs() == from_obj._specs()
    assert [s[0] for s in from_dir._specs()] == ["Resize", "CenterCrop", "ToTensor", "Normalize"]
    assert repr(from_dir).startswith("FixedImageProcessor(CLIPImageProcessor:\n    Resize(size=336, "
                                     "interpolation=bicubic)\n    CenterCrop(size=(336, 336), "
                                     "rounding='floor')")
    data = encode(120, 90, "JPEG", 7)
    got = native_pixels(tmp_path, from_dir, [data])[0]
    assert got.shape == (3, 336, 336)
    np.testing.assert_allclose(got, hf_pixels(hf_processor(LLAVA), data)["pixel_values"][0],
                               rtol=0, atol=SLOW_ATOL)


@pytest.mark.parametrize("change, option", [
    ({"resample": 1}, "resample=1"),
    ({"do_normalize": False}, "do_normalize=False"),
    ({"do_convert_rgb": False}, "do_convert_rgb=False"),
    ({"size": {"longest_edge": 30}}, "size="),
    ({"crop_size": {"height": 400, "width": 400}}, "crop_size"),
    ({"do_pad": True}, "do_pad=True"),
    ({"image_processor_type": "Idefics3ImageProcessor"}, "Idefics3ImageProcessor"),
    ({"image_processor_type": "LlavaNextImageProcessor",
      "crop_size": {"height": 300, "width": 300}}, "a square crop of the size's side"),
    ({"image_processor_type": "LlavaNextImageProcessor", "image_grid_pinpoints": [[336, 500]]},
     "multiples of crop_size"),
    ({"image_mean": [0.5, 0.5]}, "image_mean"),
])
def test_options_not_reproduced_are_value_errors_naming_them(change, option):
    with pytest.raises(ValueError, match=option):
        ImageProcessor.from_pretrained({**LLAVA, **change})


def test_an_image_that_does_not_decode_names_the_sample_or_is_a_counted_skip(tmp_path):
    images = [encode(40, 30, "JPEG", i) for i in range(3)]
    images[1] = images[1][:40]  # truncated
    path = write_tar(tmp_path / "bad.tar", images)
    fields = {"pixel_values": Image(ImageProcessor.from_pretrained(SMALL_CLIP)),
              "labels": Label()}
    ds = stoker.TarShards(path, fields=fields)
    with pytest.raises(stoker.SampleError) as e:
        list(stoker.DataLoader(ds, batch_size=3, output="numpy", num_workers=1))
    assert f"{path}:k1" in str(e.value)
    loader = stoker.DataLoader(ds, batch_size=3, output="numpy", on_error="skip")
    labels = [int(v) for b in loader for v in b["labels"]]
    assert len(labels) == 3 and set(labels) == {0, 2}  # the skipped slot refilled by another
    assert loader.stats()["skipped"] == 1


# ------------------------------------------------------------------ dynamic resolution: Qwen2-VL


def test_qwen2_vl_patches_and_grid_equal_hugging_faces():
    processor = ImageProcessor.from_pretrained(QWEN)
    assert isinstance(processor, PatchImageProcessor)
    slow, fast = hf_processor(QWEN), hf_processor(QWEN, fast=True)
    seen = set()
    for i, (w, h, fmt) in enumerate(IMAGES):
        data = encode(w, h, fmt, i)
        patches, grid = processor(data)
        want = hf_pixels(slow, data)
        np.testing.assert_array_equal(grid, want["image_grid_thw"][0])
        assert tuple(grid) == processor.grid(h, w)
        assert processor.num_image_tokens(h, w) == slow.get_number_of_image_patches(h, w) // 4
        assert patches.shape == want["pixel_values"].shape and patches.dtype == np.float32
        np.testing.assert_array_equal(patches, want["pixel_values"])  # the same float32 ops
        assert np.abs(patches - hf_pixels(fast, data)["pixel_values"]).max() < FAST_ATOL
        assert grid[1] * grid[2] <= processor.max_patches
        seen.add(int(grid[1] * grid[2]))
    assert len(seen) >= 3  # the patch count follows the image size
    # tiny (below min_pixels) and large (beyond max_pixels) images are scaled into the range
    assert processor.grid(7, 9) == (1, 4, 6)  # 7x9 scaled up to 56x84
    assert 4 * 28 * 28 <= 14 * 14 * np.prod(processor.grid(170, 300)) <= 24 * 28 * 28


def test_qwen2_vl_config_forms_and_bad_options():
    hf_obj = ImageProcessor.from_pretrained(hf_processor(QWEN))
    by_size = ImageProcessor.from_pretrained(
        {**{k: v for k, v in QWEN.items() if not k.endswith("_pixels")},
         "size": {"shortest_edge": 4 * 28 * 28, "longest_edge": 24 * 28 * 28}})
    assert hf_obj.options == by_size.options == ImageProcessor.from_pretrained(QWEN).options
    import pickle
    assert pickle.loads(pickle.dumps(hf_obj)).grid(480, 640) == hf_obj.grid(480, 640)
    with pytest.raises(ValueError, match="min_pixels"):
        ImageProcessor.from_pretrained({**QWEN, "min_pixels": 10 ** 6})
    with pytest.raises(ValueError, match="aspect ratio"):
        ImageProcessor.from_pretrained(QWEN).grid(1, 300)
    with pytest.raises(ValueError, match="resample"):
        ImageProcessor.from_pretrained({**QWEN, "resample": 2})
    with pytest.raises(stoker.DecodeError):
        ImageProcessor.from_pretrained(QWEN)(b"not an image")


def test_qwen2_vl_field_of_tar_shards_is_ragged_patches_and_a_grid(tmp_path):
    images = [encode(w, h, fmt, i) for i, (w, h, fmt) in enumerate(IMAGES)]
    # a truncated JPEG: its header still reads, its pixels do not; the largest image, so that any
    # replacement fits its batch's padded length (on_error="skip" needs one that does)
    images.append(images[4][:len(images[4]) // 3])
    bad = len(images) - 1
    path = write_tar(tmp_path / "q.tar", images)
    processor = ImageProcessor.from_pretrained(QWEN)
    ds = stoker.TarShards(path, fields={"pixel_values": Image(processor), "labels": Label()})
    assert list(ds._source.field_shapes[0]) == [processor.max_patches, processor.patch_dim]
    slow = hf_processor(QWEN)

    def check(batches):
        seen = set()
        for b in batches:
            assert b["pixel_values"].shape[1] >= b["lengths"].max()  # a skip keeps the padding
            for row, label in enumerate(b["labels"].tolist()):
                want = hf_pixels(slow, images[label])
                n = int(b["lengths"][row])
                np.testing.assert_array_equal(b["image_grid_thw"][row], want["image_grid_thw"][0])
                np.testing.assert_array_equal(b["pixel_values"][row, :n], want["pixel_values"])
                assert not b["pixel_values"][row, n:].any()  # padding
                seen.add(label)
        return seen

    with pytest.raises(stoker.SampleError) as e:
        list(stoker.DataLoader(ds, batch_size=2, output="numpy", num_workers=1))
    assert f"{path}:k{bad}" in str(e.value)
    one = list(stoker.DataLoader(ds, batch_size=2, output="numpy", num_workers=1,
                                 on_error="skip"))
    two = list(stoker.DataLoader(ds, batch_size=2, output="numpy", num_workers=2,
                                 on_error="skip"))
    assert check(one) == set(range(bad))
    for a, b in zip(one, two, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_qwen2_vl_patches_beside_variable_length_captions(tmp_path):
    """Two ragged groups in one batch: the captions padded to their longest (``lengths``), the
    patches to theirs (``pixel_values_lengths``), each equal to Hugging Face's."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    from stoker.image_text import Text
    captions = ["a cat", "two dogs in the snow at night", "a boat", "city lights at dusk, wide",
                "x", "a bowl of soup on a table", "an owl"]
    images = [encode(w, h, fmt, i) for i, (w, h, fmt) in enumerate(IMAGES)]
    path = tmp_path / "qc.tar"
    with tarfile.open(path, "w") as tar:
        for i, data in enumerate(images):
            for ext, payload in (("png" if data[:4] == b"\x89PNG" else "jpg", data),
                                 ("txt", captions[i].encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"k{i}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(captions * 2, trainer=trainers.BpeTrainer(
        vocab_size=300, show_progress=False, special_tokens=["<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    processor = ImageProcessor.from_pretrained(QWEN)
    ds = stoker.TarShards(str(path), fields={
        "pixel_values": Image(processor),
        "input_ids": Text(tok, padding="longest", max_length=None, pad_id=0),
        "labels": Label()})
    slow = hf_processor(QWEN)
    ref = tokenizers.Tokenizer.from_str(tok.to_str())
    ref.enable_padding(pad_id=0, pad_token="<pad>")
    seen = []
    for b in stoker.DataLoader(ds, batch_size=3, shuffle=True, seed=2, num_workers=2,
                               output="numpy"):
        labels = b["labels"].tolist()
        want = ref.encode_batch([captions[i] for i in labels])
        assert b["input_ids"].tolist() == [e.ids for e in want]
        assert b["lengths"].tolist() == [sum(e.attention_mask) for e in want]
        assert b["pixel_values"].shape[1] == b["pixel_values_lengths"].max()
        for row, label in enumerate(labels):
            n = int(b["pixel_values_lengths"][row])
            px = hf_pixels(slow, images[label])
            np.testing.assert_array_equal(b["pixel_values"][row, :n], px["pixel_values"])
            np.testing.assert_array_equal(b["image_grid_thw"][row], px["image_grid_thw"][0])
        seen += labels
    assert sorted(seen) == list(range(len(IMAGES)))
