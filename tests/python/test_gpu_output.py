"""device="cuda" with an image pipeline that ends in a float ToTensor (and Normalize): uint8
over the copy, the conversion on the device (stoker/gpu/output.py). No GPU here: the
conversion's torch code runs on CPU tensors, and the loader's device path with a copy stage
whose "device" is the CPU; both must give the CPU path's batches bit for bit."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stoker  # noqa: E402
from gpu_emulation import CpuCopyStage  # noqa: E402
from stoker import batch_transforms as B  # noqa: E402
from stoker import transforms as T  # noqa: E402
from stoker.sample_data import make_sample  # noqa: E402
from stoker.gpu import feed as _feed  # noqa: E402
from stoker.gpu.output import convert_images  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "sample"
    make_sample(root, num_classes=3, images_per_class=6, shards=2)
    return str(root / "train")


def pipeline(dtype="float32", layout="CHW", normalize=True, tail=()):
    ts = [T.RandomResizedCrop((24, 20)), T.RandomHorizontalFlip(), T.ColorJitter(0.3),
          T.ToTensor(dtype=dtype, layout=layout)]
    if normalize:
        ts.append(T.Normalize(MEAN, STD))
    return T.Compose(ts + list(tail))


def test_the_uint8_variant_converted_equals_the_float_output(sample):
    for dtype, layout, normalize in (("float32", "CHW", True), ("float16", "HWC", True),
                                     ("bfloat16", "CHW", False), ("float32", "HWC", False)):
        ds = stoker.ImageFolder(sample, transform=pipeline(dtype, layout, normalize))
        source, output = ds._device_output()
        assert output.dtype == dtype and output.layout == layout
        for i in range(len(ds)):
            raw, _ = source.sample(i, 5, 1)
            u8 = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(tuple(ds._images.cpu_source.image_shape))
            want_bytes, _ = ds._images.cpu_source.sample(i, 5, 1)
            got = convert_images(u8[None], dtype, True, output.mean, output.std, layout)[0]
            assert got.dtype == getattr(torch, dtype)
            assert bytes(got.contiguous().view(torch.uint8).numpy().tobytes()) == want_bytes, i


def test_what_cannot_move_stays_on_the_workers(sample):
    erase_after = pipeline(tail=[T.RandomErasing()])
    u8 = T.Compose([T.CenterCrop(16), T.ToTensor("uint8")])
    for t in (erase_after, u8):
        assert stoker.ImageFolder(sample, transform=t)._device_output() is None
    # ToDtype(float, scale=False): the values themselves, then Normalize.
    ds = stoker.ImageFolder(sample, transform=T.Compose([T.CenterCrop(16), T.ToDtype("float32"),
                                                         T.Normalize(100, 50)]))
    source, output = ds._device_output()
    assert output.scale is False
    raw, _ = source.sample(0, 0, 0)
    u8 = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(tuple(ds._images.cpu_source.image_shape))
    want, _ = ds._images.cpu_source.sample(0, 0, 0)
    got = convert_images(u8[None], "float32", False, output.mean, output.std, "CHW")[0]
    assert got.numpy().tobytes() == want


class FakeDevice:
    type = "cuda"
    index = 0

    def __str__(self):
        return "cuda:0"


@pytest.mark.parametrize("mixed", [False, True])
def test_the_device_path_gives_the_cpu_paths_batches(sample, monkeypatch, mixed):
    ds = stoker.ImageFolder(sample, transform=pipeline("float16", "CHW"))
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=2)
    if mixed:
        kw["batch_transform"] = B.MixUp(alpha=1.0, num_classes=3)
    want = [(x.clone(), y.clone()) for x, y in stoker.DataLoader(ds, **kw)]
    monkeypatch.setattr(_feed, "resolve_device", lambda device: FakeDevice())
    loader = stoker.DataLoader(ds, device="cuda", **kw)
    loader._copy_stage = CpuCopyStage()
    got = [(x.clone(), y.clone()) for x, y in loader]
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want):
        assert a.dtype == torch.float16 and torch.equal(a, b) and torch.equal(la, lb)
    stats = loader.stats()
    assert stats["device_output"] == "uint8 over the copy; ToTensor(float16, Normalize) on the GPU"
    # The workers' buffers hold uint8 images: under the float16 images' own bytes.
    images = want[0][0]
    assert images.numel() <= stats["batch_bytes"] < images.numel() * images.element_size()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_cuda_batches_equal_the_cpu_paths(sample):
    """On a GPU: uint8 over the copy, the conversion there; the batches are the CPU path's."""
    for dtype in ("float32", "bfloat16"):
        ds = stoker.ImageFolder(sample, transform=pipeline(dtype, "CHW"))
        kw = dict(batch_size=4, shuffle=True, seed=3)
        cpu = [(x.clone(), y.clone()) for x, y in stoker.DataLoader(ds, **kw)]
        loader = stoker.DataLoader(ds, device="cuda", **kw)
        gpu = [(x.cpu(), y.cpu()) for x, y in loader]
        assert loader.stats()["device_output"].startswith("uint8 over the copy")
        assert len(gpu) == len(cpu)
        for (a, la), (b, lb) in zip(gpu, cpu):
            assert torch.equal(a, b) and torch.equal(la, lb), dtype
