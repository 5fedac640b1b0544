"""GPU JPEG decode (ImageFolder/TarShards(decode="cuda") with DataLoader(device="cuda")).

Without a GPU: the API and its errors, the header classifier against PIL's view of the sample
data, and the whole decode="cuda" path with its GPU stage emulated on the CPU (the staging the
workers do, the stage's chunks, fallbacks, errors and replacement, the kernels' own code) against
the CPU path. With a GPU (skipped here): the same through nvJPEG and the NVRTC kernels, and the
accuracy target of the issue (mean absolute difference <= 2 on the 0-255 scale).
"""

import io
import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
import gpu_emulation
from stoker import _native
from stoker.gpu import decode as gpu_decode
from stoker import transforms as T
from stoker.sample_data import make_sample

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
HAS_CUDA = torch.cuda.is_available() and _native.gpu.cuda_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.fixture(scope="session")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_decode") / "sample"
    make_sample(root, num_classes=3, images_per_class=14, shards=2)
    return root


def eval_transform(dtype="float32"):
    return T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(dtype=dtype),
                      T.Normalize(MEAN, STD)])


def train_transform():
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def to_255(x):
    """Normalized CHW float batches back to the 0-255 scale."""
    m = torch.tensor(MEAN).view(1, 3, 1, 1)
    s = torch.tensor(STD).view(1, 3, 1, 1)
    return (x.float().cpu() * s + m) * 255


def emulated_dataset(cls, *args, **kwargs):
    with gpu_emulation.emulation():
        return cls(*args, decode="cuda", **kwargs)


def corrupt(data):
    """A Huffman table whose counts add up to more than 256 codes: markers intact (the header
    checks pass), every decoder refuses it."""
    data = bytearray(data)
    at = data.find(b"\xff\xc4")
    data[at + 5:at + 21] = b"\xff" * 16
    return bytes(data)


# ---- API and errors ------------------------------------------------------------------------------

def test_decode_cpu_is_the_default_and_changes_nothing(sample):
    root = str(sample / "train")
    a = stoker.ImageFolder(root, transform=train_transform())
    b = stoker.ImageFolder(root, transform=train_transform(), decode="cpu")
    assert a.decode == b.decode == "cpu"
    assert not b._decodes_on_gpu and b._copy_stage(None, "raise") is None
    for x, y in zip(stoker.DataLoader(a, batch_size=8, seed=2, shuffle=True),
                    stoker.DataLoader(b, batch_size=8, seed=2, shuffle=True)):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])


@pytest.mark.parametrize("decode", ["gpu", "CUDA", None, "nvjpeg"])
def test_decode_rejects_what_it_does_not_know(sample, decode):
    with pytest.raises(ValueError, match='decode must be "cpu" or "cuda"'):
        stoker.ImageFolder(str(sample / "train"), transform=train_transform(), decode=decode)


@pytest.mark.skipif(_native.gpu.cuda_available(), reason="CUDA is available")
@pytest.mark.parametrize("make", ["folder", "shards"])
def test_decode_cuda_without_cuda_raises_a_clear_error(sample, make):
    with pytest.raises(RuntimeError, match=r'decode="cuda" needs CUDA and nvJPEG, but CUDA is not '
                                           r"available"):
        if make == "folder":
            stoker.ImageFolder(str(sample / "train"), transform=train_transform(), decode="cuda")
        else:
            stoker.TarShards(str(sample / "shards" / "train-*.tar"), transform=train_transform(),
                             decode="cuda")


def test_a_gpu_decode_dataset_needs_a_cuda_loader(sample):
    ds = emulated_dataset(stoker.ImageFolder, str(sample / "train"), transform=train_transform())
    with pytest.raises(ValueError, match=r'ImageFolder\(decode="cuda"\) decodes into GPU batches: '
                                         r'pass device="cuda"'):
        stoker.DataLoader(ds, batch_size=4)
    # Indexing gives the CPU path's sample.
    cpu = stoker.ImageFolder(str(sample / "train"), transform=train_transform())
    assert np.array_equal(ds[3][0], cpu[3][0]) and ds[3][1] == cpu[3][1]


def test_library_search_directories_exist_and_without_cuda_nothing_is_claimed():
    for d in gpu_decode.library_dirs():
        assert os.path.isdir(d)
    if not _native.gpu.cuda_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            gpu_decode.require_gpu_decode()


# ---- the header classifier on real files -----------------------------------------------------------

def test_classifier_agrees_with_pil_on_the_sample_data(sample):
    routes = {}
    for dirpath, _, names in os.walk(sample / "train"):
        for name in names:
            path = os.path.join(dirpath, name)
            data = open(path, "rb").read()
            route = _native.testing.classify_jpeg(data)
            with Image.open(path) as im:
                expected = "not_baseline" if im.info.get("progressive") else "gpu"
                assert im.mode in ("RGB", "L")
            assert route == expected, path
            routes[route] = routes.get(route, 0) + 1
            # Truncated files never go to the GPU.
            assert _native.testing.classify_jpeg(data[:len(data) // 2]) != "gpu"
    assert routes.get("gpu", 0) > 0


def test_classifier_routes_png_cmyk_and_damage_to_the_cpu():
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8))
    def encode(im, fmt, **kw):
        buf = io.BytesIO()
        im.save(buf, fmt, **kw)
        return buf.getvalue()
    assert _native.testing.classify_jpeg(encode(rgb, "JPEG", quality=90)) == "gpu"
    assert _native.testing.classify_jpeg(encode(rgb, "JPEG", quality=90, subsampling=0)) == "gpu"
    assert _native.testing.classify_jpeg(encode(rgb, "JPEG", progressive=True)) == "not_baseline"
    assert _native.testing.classify_jpeg(encode(rgb.convert("CMYK"), "JPEG")) == "color_space"
    assert _native.testing.classify_jpeg(encode(rgb, "PNG")) == "not_jpeg"
    assert _native.testing.classify_jpeg(b"") == "not_jpeg"
    assert _native.testing.classify_jpeg(encode(rgb, "JPEG")[:300]) in ("bad_header", "no_end_marker")


# ---- the decode="cuda" path with its GPU stage emulated on the CPU ---------------------------------

def per_sample_mad(a, b):
    return (to_255(a) - to_255(b)).abs().flatten(1).mean(1)


@pytest.mark.parametrize("make", ["folder", "shards"])
def test_emulated_gpu_path_gives_the_cpu_paths_batches(sample, make):
    if make == "folder":
        args = (stoker.ImageFolder, str(sample / "train"))
    else:
        args = (stoker.TarShards, str(sample / "shards" / "train-*.tar"))
    ds = emulated_dataset(*args, transform=train_transform())
    cpu = args[0](*args[1:], transform=train_transform())
    kw = dict(batch_size=8, shuffle=True, seed=5, num_workers=2)
    loader = gpu_emulation.emulated_loader(ds, **kw)
    exact = total = 0
    for (x, y), (cx, cy) in zip(loader, stoker.DataLoader(cpu, **kw)):
        assert x.shape == cx.shape and x.dtype == cx.dtype
        assert torch.equal(y, cy)  # same samples, same order
        mad = per_sample_mad(x, cx)
        # Same crop and flip: only the CPU path's DCT-scaled decode of large crops differs.
        assert mad.max() < 2.0, mad
        exact += int((mad == 0).sum())
        total += len(y)
    assert total == len(cpu)
    assert exact >= total * 0.7
    s = loader.stats()["gpu_decode"]
    assert s["backend"] == "emulated"
    assert sum(s["routes"].values()) == total
    assert s["routes"]["gpu"] > 0


def test_emulated_gpu_path_on_png_and_small_crops(sample):
    # PNGs take the CPU path itself (exact, through the GPU's output table); JPEG crops small
    # enough that the CPU path decodes them at full size (under 2x the output: no DCT scaling)
    # match it too, bar the CPU path's cropped decode at chroma edges (it decodes a region; the
    # GPU path the whole image, as PIL).
    root = sample.parent / "png_mix"
    if not root.exists():
        shutil.copytree(sample / "train", root)
        for i, path in enumerate(sorted(root.rglob("*.JPEG"))):
            if i % 3 == 0:
                with Image.open(path) as im:
                    im.convert("RGB").save(path, "PNG")
    t = T.Compose([T.RandomResizedCrop(64, scale=(0.02, 0.05)), T.RandomHorizontalFlip(),
                   T.ToTensor(dtype="uint8", layout="HWC")])
    ds = emulated_dataset(stoker.ImageFolder, str(root), transform=t)
    cpu = stoker.ImageFolder(str(root), transform=t)
    png = [open(p, "rb").read(4) == b"\x89PNG" for p, _ in cpu.samples]
    kw = dict(batch_size=6, seed=1, num_workers=1)
    loader = gpu_emulation.emulated_loader(ds, **kw)
    exact = 0
    for b, ((x, y), (cx, cy)) in enumerate(zip(loader, stoker.DataLoader(cpu, **kw))):
        assert torch.equal(y, cy)
        for s in range(len(y)):
            diff = (x[s].int() - cx[s].int()).abs()
            if png[b * 6 + s]:
                assert torch.equal(x[s], cx[s])
            else:
                assert diff.float().mean() < 1.0
            exact += int(diff.max() == 0)
    assert exact >= len(cpu) - 3
    assert loader.stats()["gpu_decode"]["routes"]["not_jpeg"] == sum(png) == 14


@pytest.fixture(scope="session")
def damaged(sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged") / "train"
    shutil.copytree(sample / "train", root)
    paths = sorted(root.rglob("*.JPEG"))
    # A file whose header passes (it goes to the GPU stage) but whose Huffman table is bogus.
    victim = next(p for p in paths if _native.testing.classify_jpeg(p.read_bytes()) == "gpu")
    victim.write_bytes(corrupt(victim.read_bytes()))
    assert _native.testing.classify_jpeg(victim.read_bytes()) == "gpu"
    return root, str(victim)


def test_a_corrupt_file_on_the_gpu_path_raises_a_sample_error_naming_it(damaged):
    root, victim = damaged
    ds = emulated_dataset(stoker.ImageFolder, str(root), transform=train_transform())
    with pytest.raises(stoker.SampleError, match=victim) as info:
        for _ in gpu_emulation.emulated_loader(ds, batch_size=8, num_workers=2):
            pass
    assert info.value.path == victim
    assert "JPEG" in str(info.value.__cause__)


def outcomes(loader):
    """Each batch's labels, or the SampleError raised at its turn; iteration goes on after it."""
    out, it = [], iter(loader)
    while True:
        try:
            out.append(next(it)[1].tolist())
        except StopIteration:
            return out
        except stoker.SampleError as e:
            out.append(e.path)


def test_the_error_comes_at_its_batchs_turn_and_the_epoch_goes_on(damaged):
    root, victim = damaged
    ds = emulated_dataset(stoker.ImageFolder, str(root), transform=train_transform())
    cpu = stoker.ImageFolder(str(root), transform=train_transform())
    kw = dict(batch_size=4, shuffle=True, seed=8, num_workers=2)
    got = outcomes(gpu_emulation.emulated_loader(ds, **kw))
    assert got == outcomes(stoker.DataLoader(cpu, **kw))
    assert got.count(victim) == 1 and len(got) == len(cpu) // 4 + (len(cpu) % 4 > 0)


def test_skip_replaces_a_corrupt_file_as_the_cpu_loader_does(damaged):
    root, victim = damaged
    ds = emulated_dataset(stoker.ImageFolder, str(root), transform=eval_transform())
    cpu = stoker.ImageFolder(str(root), transform=eval_transform())
    kw = dict(batch_size=8, shuffle=True, seed=3, num_workers=2, on_error="skip")
    loader = gpu_emulation.emulated_loader(ds, **kw)
    cpu_loader = stoker.DataLoader(cpu, **kw)
    got = list(loader)
    want = list(cpu_loader)
    assert len(got) == len(want)
    for (x, y), (cx, cy) in zip(got, want):
        assert torch.equal(y, cy)
        assert per_sample_mad(x, cx).max() < 2.0
    s = loader.stats()
    assert s["skipped"] == 1 == cpu_loader.stats()["skipped"]
    assert victim in s["skipped_samples"][0]
    assert s["gpu_decode"]["skipped"] == 1


def test_a_file_the_gpu_refuses_takes_the_cpu_path_transparently(sample):
    ds = emulated_dataset(stoker.ImageFolder, str(sample / "train"), transform=eval_transform())
    cpu = stoker.ImageFolder(str(sample / "train"), transform=eval_transform())
    kw = dict(batch_size=7, num_workers=0)
    loader = gpu_emulation.emulated_loader(ds, reject=range(0, 42, 2), **kw)
    for (x, y), (cx, cy) in zip(loader, stoker.DataLoader(cpu, **kw)):
        assert torch.equal(y, cy)
        assert per_sample_mad(x, cx).max() < 2.0
    s = loader.stats()
    assert s["gpu_decode"]["routes"]["gpu_failed"] > 0
    assert s["skipped"] == 0


# ---- on a GPU ------------------------------------------------------------------------------------

def gpu_batches(ds, **kw):
    out = []
    for x, y in stoker.DataLoader(ds, device="cuda", **kw):
        assert x.is_cuda and y.is_cuda
        out.append((x.cpu(), y.cpu()))
    return out


@needs_cuda
def test_gpu_accuracy_against_the_cpu_path_resize_center_crop(sample):
    """The issue's accuracy target: mean absolute difference <= 2 on the 0-255 scale."""
    root = str(sample / "train")
    ds = stoker.ImageFolder(root, transform=eval_transform(), decode="cuda")
    cpu = stoker.ImageFolder(root, transform=eval_transform())
    kw = dict(batch_size=16, num_workers=2)
    diffs = []
    for (x, y), (cx, cy) in zip(gpu_batches(ds, **kw), stoker.DataLoader(cpu, **kw)):
        assert torch.equal(y, cy)
        diffs.append(per_sample_mad(x, cx))
    d = torch.cat(diffs)
    assert d.mean() <= 2.0, d
    assert d.max() <= 4.0, d


@needs_cuda
def test_gpu_crops_and_flips_are_the_cpu_paths(sample):
    # A different crop or flip gives tens of levels of difference; IDCTs differ by about one.
    root = str(sample / "train")
    ds = stoker.ImageFolder(root, transform=train_transform(), decode="cuda")
    cpu = stoker.ImageFolder(root, transform=train_transform())
    kw = dict(batch_size=16, shuffle=True, seed=9, num_workers=2)
    for (x, y), (cx, cy) in zip(gpu_batches(ds, **kw), stoker.DataLoader(cpu, **kw)):
        assert torch.equal(y, cy)
        assert per_sample_mad(x, cx).max() <= 4.0


@needs_cuda
def test_gpu_path_matches_its_emulation_bit_for_bit_on_exactly_decodable_files(tmp_path):
    # Grayscale JPEGs of flat 8x8 blocks decode to the same pixels in any IDCT: the kernels'
    # resample, flip and normalize must then give the emulation's (the CPU reference's) bytes.
    rng = np.random.default_rng(4)
    for c in range(2):
        os.makedirs(tmp_path / f"c{c}")
        for i in range(12):
            h, w = 8 * int(rng.integers(20, 60)), 8 * int(rng.integers(20, 60))
            blocks = rng.integers(16, 240, (h // 8, w // 8), dtype=np.uint8)
            Image.fromarray(np.kron(blocks, np.ones((8, 8), np.uint8))).save(
                tmp_path / f"c{c}" / f"{i}.jpg", quality=100)
    t = train_transform()
    ds = stoker.ImageFolder(str(tmp_path), transform=t, decode="cuda")
    with gpu_emulation.emulation():
        em = stoker.ImageFolder(str(tmp_path), transform=t, decode="cuda")
    kw = dict(batch_size=8, shuffle=True, seed=2, num_workers=1)
    for (x, y), (ex, ey) in zip(gpu_batches(ds, **kw), gpu_emulation.emulated_loader(em, **kw)):
        assert torch.equal(y, ey)
        assert torch.equal(x, ex)


@needs_cuda
def test_gpu_png_fallback_is_the_cpu_paths_exactly(sample, tmp_path):
    # PNGs are decoded and resampled by the CPU path in the workers; the GPU only applies the
    # output table: the batches must be the CPU loader's, bit for bit.
    root = tmp_path / "png"
    shutil.copytree(sample / "train", root)
    for path in root.rglob("*.JPEG"):
        with Image.open(path) as im:
            im.convert("RGB").save(path, "PNG")
    for t in (train_transform(), eval_transform("bfloat16")):
        ds = stoker.ImageFolder(str(root), transform=t, decode="cuda")
        cpu = stoker.ImageFolder(str(root), transform=t)
        kw = dict(batch_size=8, shuffle=True, seed=6, num_workers=2)
        loader = stoker.DataLoader(ds, device="cuda", **kw)
        for (x, y), (cx, cy) in zip(loader, stoker.DataLoader(cpu, **kw)):
            assert torch.equal(y.cpu(), cy)
            assert torch.equal(x.cpu(), cx)
        assert loader.stats()["gpu_decode"]["routes"] == {"not_jpeg": len(ds)}


@needs_cuda
def test_gpu_corrupt_files_get_on_error_and_memory_is_reported(damaged):
    root, victim = damaged
    with pytest.raises(stoker.SampleError, match=victim):
        gpu_batches(stoker.ImageFolder(str(root), transform=eval_transform(), decode="cuda"),
                    batch_size=8)
    ds = stoker.ImageFolder(str(root), transform=eval_transform(), decode="cuda")
    loader = stoker.DataLoader(ds, batch_size=8, device="cuda", on_error="skip")
    n = sum(len(y) for _, y in loader)
    assert n == len(ds)
    s = loader.stats()
    assert s["skipped"] == 1 and victim in s["skipped_samples"][0]
    assert s["gpu_decode"]["backend"] in ("hardware", "gpu_hybrid")
    assert 0 < s["gpu_memory_bytes"]
    assert s["gpu_decode"]["device_bytes_peak"] <= (
        gpu_decode.DEFAULT_DECODE_BUFFER_BYTES + (256 << 20)), s["gpu_decode"]
