"""Batch transforms (MixUp, CutMix, RandomChoice): DataLoader(batch_transform=...) against
torchvision v2's own code on the unmixed batch, determinism, the GPU path's torch code on CPU
tensors, and the inputs they refuse."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import stoker  # noqa: E402
from gpu_emulation import CpuCopyStage  # noqa: E402
from stoker import _native, _state  # noqa: E402
from stoker import batch_transforms as B  # noqa: E402
from stoker import transforms as T  # noqa: E402
from stoker.sample_data import make_sample  # noqa: E402
from stoker.gpu import batch_transform as gpu_mix  # noqa: E402
from stoker.gpu.feed import DeviceFeed  # noqa: E402

CLASSES = 3
PER_CLASS = 8
SIZE = (20, 28)  # H, W of the images the tests make


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "sample"
    make_sample(root, num_classes=CLASSES, images_per_class=PER_CLASS, shards=2)
    return root


def folder(sample, dtype="float32", layout="CHW"):
    t = T.Compose([T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip(),
                   T.ToTensor(dtype=dtype, layout=layout)])
    return stoker.ImageFolder(str(sample / "train"), transform=t)


def load(ds, **kw):
    kw.setdefault("batch_size", 5)
    kw.setdefault("shuffle", True)
    kw.setdefault("seed", 11)
    kw.setdefault("num_workers", 2)
    return stoker.DataLoader(ds, **kw)


def drawn(loader, batch_transform, layout, epoch, b):
    """The parameters the C++ engine draws for batch b of the loader's epoch."""
    native = B.parse(batch_transform).native(layout)
    plan = _state.plan(loader)
    return native.draw(loader.seed, epoch, plan.first_position(b), *SIZE)


def torchvision_mix(images, labels, params, layout):
    """torchvision v2's MixUp / CutMix code (their transform()) on a copy of the unmixed batch,
    with Stoker's drawn parameters."""
    from torchvision.transforms import v2
    x = images.clone()
    if layout == "HWC":
        x = x.permute(0, 3, 1, 2)  # torchvision's images are [..., H, W]
    n = len(labels)
    if params.kind == "MixUp":
        tv = v2.MixUp(num_classes=CLASSES)
        p = {"lam": params.lam, "labels": labels, "batch_size": n}
    else:
        tv = v2.CutMix(num_classes=CLASSES)
        p = {"box": tuple(params.box), "lam_adjusted": params.label_lam, "labels": labels,
             "batch_size": n}
    out = tv.transform(x, p)
    soft = tv.transform(labels, p)
    if layout == "HWC":
        out = out.permute(0, 2, 3, 1)
    return out, soft


def pairs(loader_a, loader_b):
    """Batches of two loaders, side by side (copies: the buffers go back to the pool)."""
    return [((a[0].clone(), a[1].clone()), (b[0].clone(), b[1].clone()))
            for a, b in zip(loader_a, loader_b)]


# ---- semantics: torchvision's code on the unmixed batch ------------------------------------------

@pytest.mark.parametrize("dtype, layout", [("float32", "CHW"), ("float16", "CHW"),
                                           ("bfloat16", "HWC"), ("float32", "HWC")])
def test_batches_are_torchvisions_mix_of_the_unmixed_batch(sample, dtype, layout):
    pytest.importorskip("torchvision")
    bt = B.RandomChoice([B.MixUp(alpha=0.8, num_classes=CLASSES),
                         B.CutMix(alpha=1.0, num_classes=CLASSES)])
    ds = folder(sample, dtype, layout)
    mixed = load(ds, batch_transform=bt)
    plain = load(ds)
    kinds = set()
    for epoch in range(3):
        mixed.set_epoch(epoch)
        plain.set_epoch(epoch)
        for b, ((images, soft), (raw, labels)) in enumerate(pairs(mixed, plain)):
            params = drawn(mixed, bt, layout, epoch, b)
            kinds.add(params.kind)
            want_images, want_soft = torchvision_mix(raw, labels, params, layout)
            assert images.dtype == raw.dtype and images.shape == raw.shape
            assert torch.equal(images, want_images), (epoch, b, params)
            assert soft.dtype == torch.float32 and soft.shape == (len(labels), CLASSES)
            assert torch.equal(soft, want_soft), (epoch, b, params)
    assert kinds == {"MixUp", "CutMix"}


def test_soft_labels_hold_the_two_classes_with_lambda_and_its_complement(sample):
    bt = B.MixUp(alpha=0.4, num_classes=CLASSES)
    ds = folder(sample)
    mixed, plain = load(ds, batch_transform=bt), load(ds)
    for b, ((_, soft), (_, labels)) in enumerate(pairs(mixed, plain)):
        lam = drawn(mixed, bt, "CHW", 0, b).label_lam
        a, w = np.float32(1 - lam), np.float32(lam)
        np.testing.assert_allclose(soft.sum(1).numpy(), 1.0, atol=1e-6)
        for i in range(len(labels)):
            own, prev = int(labels[i]), int(labels[i - 1])  # row 0 mixes with the last row
            want = np.zeros(CLASSES, np.float32)
            want[prev] = a
            want[own] = a + w if own == prev else w
            np.testing.assert_array_equal(soft[i].numpy(), want)


def test_cutmix_works_on_uint8_and_matches_torchvision(sample):
    pytest.importorskip("torchvision")
    bt = B.CutMix(alpha=0.7, num_classes=CLASSES)
    ds = folder(sample, "uint8")
    mixed, plain = load(ds, batch_transform=bt), load(ds)
    pasted = 0
    for b, ((images, soft), (raw, labels)) in enumerate(pairs(mixed, plain)):
        params = drawn(mixed, bt, "CHW", 0, b)
        want_images, want_soft = torchvision_mix(raw, labels, params, "CHW")
        assert images.dtype == torch.uint8
        assert torch.equal(images, want_images) and torch.equal(soft, want_soft)
        pasted += not torch.equal(images, raw)
    assert pasted > 0


def test_torchvisions_objects_give_the_same_batches_as_stokers(sample):
    v2 = pytest.importorskip("torchvision.transforms.v2")
    ds = folder(sample)
    for theirs, ours in [
            (v2.MixUp(alpha=0.5, num_classes=CLASSES), B.MixUp(alpha=0.5, num_classes=CLASSES)),
            (v2.CutMix(num_classes=CLASSES), B.CutMix(num_classes=CLASSES)),
            (v2.RandomChoice([v2.MixUp(alpha=0.3, num_classes=CLASSES),
                              v2.CutMix(alpha=2.0, num_classes=CLASSES)], p=[1, 3]),
             B.RandomChoice([B.MixUp(alpha=0.3, num_classes=CLASSES),
                             B.CutMix(alpha=2.0, num_classes=CLASSES)], p=[0.25, 0.75]))]:
        assert B.parse(theirs).choices == B.parse(ours).choices
        for (x, y), (u, v) in pairs(load(ds, batch_transform=theirs),
                                    load(ds, batch_transform=ours)):
            assert torch.equal(x, u) and torch.equal(y, v)


def test_random_choice_picks_with_p_and_the_loader_follows_the_draws(sample):
    bt = B.RandomChoice([B.MixUp(num_classes=CLASSES), B.CutMix(num_classes=CLASSES)],
                        p=[0.2, 0.8])
    native = B.parse(bt).native("CHW")
    n = 8000
    cutmix = sum(native.draw(5, e, key, *SIZE).kind == "CutMix"
                 for e in range(4) for key in range(n // 4))
    assert abs(cutmix / n - 0.8) < 0.015  # 4.5 standard deviations
    # Each loader batch is the kind drawn for it: CutMix leaves the pixels outside its box.
    ds = folder(sample)
    mixed, plain = load(ds, batch_transform=bt, batch_size=4), load(ds, batch_size=4)
    for b, ((images, _), (raw, _)) in enumerate(pairs(mixed, plain)):
        params = drawn(mixed, bt, "CHW", 0, b)
        x1, y1, x2, y2 = params.box
        outside = torch.ones(SIZE, dtype=torch.bool)
        outside[y1:y2, x1:x2] = False
        same_outside = torch.equal(images[..., outside], raw[..., outside])
        assert same_outside == (params.kind == "CutMix") or params.lam == 1.0


# ---- determinism ---------------------------------------------------------------------------------

def test_batches_are_bit_identical_whatever_num_workers_and_after_resume(sample):
    bt = B.RandomChoice([B.MixUp(alpha=0.8, num_classes=CLASSES),
                         B.CutMix(alpha=1.0, num_classes=CLASSES)])
    ds = folder(sample)

    def run(loader, epochs=(0, 1)):
        out = []
        for e in epochs:
            loader.set_epoch(e)
            out += [(x.clone(), y.clone()) for x, y in loader]
        return out

    reference = run(load(ds, batch_transform=bt, num_workers=0))
    assert len(reference) == 10
    for workers in (1, 2):
        got = run(load(ds, batch_transform=bt, num_workers=workers))
        assert all(torch.equal(a, c) and torch.equal(b, d)
                   for (a, b), (c, d) in zip(got, reference)), workers
    # Resume in epoch 1 after 2 batches, with another worker count.
    first = load(ds, batch_transform=bt, num_workers=2)
    first.set_epoch(1)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    resumed = load(ds, batch_transform=bt, num_workers=1)
    resumed.load_state_dict(state)
    rest = [(x.clone(), y.clone()) for x, y in resumed]
    assert len(rest) == 3
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(rest,
                                                                              reference[7:]))
    # Another seed draws other parameters (and crops).
    other = run(load(ds, batch_transform=bt, seed=12), epochs=(0,))
    assert not all(torch.equal(a[1], c[1]) for a, c in zip(other, reference))


def test_tar_shards_and_tables_mix_as_the_folder_does(sample):
    bt = B.CutMix(num_classes=CLASSES)
    t = T.Compose([T.Resize(SIZE), T.ToTensor()])
    tars = stoker.TarShards(str(sample / "shards" / "train-*.tar"), transform=t)
    x, soft = next(iter(load(tars, batch_transform=bt)))
    assert x.shape == (5, 3, *SIZE) and soft.shape == (5, CLASSES)
    pa = pytest.importorskip("pyarrow")
    files = stoker.ImageFolder(str(sample / "train"))
    table = pa.table({"jpg": [open(p, "rb").read() for p, _ in files.samples],
                      "cls": [c for _, c in files.samples]})
    ds = stoker.TableDataset(table, image="jpg", label="cls", transform=t)
    images, soft = next(iter(load(ds, batch_transform=bt)))
    raw, labels = next(iter(load(ds)))
    params = drawn(load(ds), bt, "CHW", 0, 0)
    x1, y1, x2, y2 = params.box
    want = raw.clone()
    want[..., y1:y2, x1:x2] = raw.roll(1, 0)[..., y1:y2, x1:x2]
    assert torch.equal(images, want)
    unlabelled = stoker.TableDataset(table, image="jpg", transform=t)
    with pytest.raises(ValueError, match=r"needs labels: this TableDataset has images but no "
                                         r"label column"):
        load(unlabelled, batch_transform=bt)


# ---- the GPU path's code, on CPU tensors ---------------------------------------------------------

def test_the_gpu_path_gives_the_cpu_paths_batches(sample):
    bt = B.RandomChoice([B.MixUp(alpha=0.8, num_classes=CLASSES),
                         B.CutMix(alpha=1.0, num_classes=CLASSES)])
    for dtype, layout in (("float32", "CHW"), ("float16", "HWC"), ("bfloat16", "CHW")):
        ds = folder(sample, dtype, layout)
        cpu = load(ds, batch_transform=bt)
        # mix_batch itself on the unmixed batches.
        plain = load(ds)
        native = B.parse(bt).native(layout)
        for b, ((images, soft), (raw, labels)) in enumerate(pairs(cpu, plain)):
            params = drawn(cpu, bt, layout, 0, b)
            got_images, got_soft = gpu_mix.mix_batch(raw.clone(), labels, params, CLASSES,
                                                     layout)
            assert torch.equal(got_images, images) and torch.equal(got_soft, soft), (dtype, b)
        # The whole device path (tag, copy stage, feed, mix after hand-over), with the feed
        # pulling batches ahead: the cursor it rewinds must not shift the batch keys.
        device = load(ds)
        device._device, device._copy_stage = "fake-gpu", CpuCopyStage()
        device._producer.device_mixing = gpu_mix.DeviceMixing(
            native, device.seed, layout, tuple(ds._images.cpu_source.image_shape),
            lambda cursor: _state.plan(device, cursor.start))
        for epoch in (0, 1):
            cpu.set_epoch(epoch)
            device.set_epoch(epoch)
            want = [(x.clone(), y.clone()) for x, y in cpu]
            it = iter(device)
            assert len(it) == len(want)
            got = [(x.clone(), y.clone()) for x, y in it]
            assert len(got) == len(want)
            for (a, b_), (c, d) in zip(got, want):
                assert torch.equal(a, c) and torch.equal(b_, d), (dtype, epoch)
        # A resumed device iteration keys its batches from the resume point.
        device.load_state_dict({**device.state_dict(), "epoch": 1, "batch": 3})
        rest = [x.clone() for x, _ in device]
        assert all(torch.equal(a, c[0]) for a, c in zip(rest, want[3:])) and len(rest) == 2


def test_the_gpu_path_checks_labels_on_the_cpu():
    native = B.parse(B.MixUp(num_classes=4)).native("CHW")
    mixing = gpu_mix.DeviceMixing(native, 0, "CHW", (3, 2, 2),
                                  lambda cursor: _native.engine.BatchPlan(6, 3, False, 0, 1))
    batches = iter([(torch.zeros(3, 3, 2, 2), torch.tensor([0, 1, 3])),
                    (torch.zeros(3, 3, 2, 2), torch.tensor([2, 4, 1]))])
    cursor = _state.Cursor(0, 0, 0, 2)
    feed = DeviceFeed(mixing.tag(batches, cursor), None, stage=mixing.stage(CpuCopyStage()))
    out = mixing.finish(feed)
    images, soft = next(out)
    assert soft.shape == (3, 4)
    with pytest.raises(ValueError, match=r"label 4 \(row 1 of the batch\) is not a class of "
                                         r"MixUp\(alpha=1, num_classes=4\)"):
        next(out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_cuda_batches_equal_the_cpu_paths(sample):
    bt = B.RandomChoice([B.MixUp(alpha=0.8, num_classes=CLASSES),
                         B.CutMix(alpha=1.0, num_classes=CLASSES)])
    for dtype in ("float32", "float16"):
        ds = folder(sample, dtype)
        cpu = [(x.clone(), y.clone()) for x, y in load(ds, batch_transform=bt)]
        gpu = [(x.cpu(), y.cpu()) for x, y in load(ds, batch_transform=bt, device="cuda")]
        assert len(gpu) == len(cpu)
        for (a, b), (c, d) in zip(gpu, cpu):
            assert torch.equal(b, d)
            assert torch.equal(a, c) if dtype == "float32" else torch.allclose(
                a.float(), c.float(), atol=2e-3)


# ---- what they refuse ----------------------------------------------------------------------------

def test_a_label_without_a_class_fails_its_batch_naming_sample_and_label(sample):
    ds = folder(sample)
    loader = load(ds, batch_transform=B.MixUp(num_classes=2), shuffle=False, batch_size=8)
    # Unshuffled, batch 0 holds class 0 only, batch 1 class 1, batch 2 class 2.
    it = iter(loader)
    assert next(it)[1].shape == (8, 2)
    assert next(it)[1].shape == (8, 2)
    with pytest.raises(stoker.SampleError, match=r"label 2 is not a class of MixUp\(alpha=1, "
                                                 r"num_classes=2\)") as e:
        next(it)
    assert e.value.index == 16 and e.value.path == ds.samples[16][0]


def test_mixup_on_uint8_and_bad_settings_are_refused(sample):
    ds = folder(sample, "uint8")
    with pytest.raises(ValueError, match=r"MixUp blends images, which uint8 cannot hold"):
        load(ds, batch_transform=B.MixUp(num_classes=CLASSES))
    with pytest.raises(ValueError, match=r"MixUp blends images, which uint8 cannot hold"):
        load(ds, batch_transform=B.RandomChoice([B.CutMix(num_classes=CLASSES),
                                                 B.MixUp(num_classes=CLASSES)]))
    for alpha in (0, -1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match=r"MixUp alpha must be a positive finite number"):
            B.MixUp(alpha=alpha, num_classes=3)
    with pytest.raises(ValueError, match=r"CutMix needs num_classes"):
        B.CutMix()
    with pytest.raises(ValueError, match=r"num_classes must be a positive integer"):
        B.MixUp(num_classes=0)
    with pytest.raises(ValueError, match=r"labels_getter=.* is not supported"):
        B.MixUp(num_classes=3, labels_getter=lambda batch: batch[1])
    with pytest.raises(ValueError, match=r"p must not sum to 0"):
        B.RandomChoice([B.MixUp(num_classes=3)], p=[0])
    with pytest.raises(ValueError, match=r"Length of p doesn't match"):
        B.RandomChoice([B.MixUp(num_classes=3)], p=[1, 2])
    with pytest.raises(ValueError, match=r"must share num_classes"):
        load(folder(sample), batch_transform=B.RandomChoice(
            [B.MixUp(num_classes=3), B.CutMix(num_classes=4)]))
    with pytest.raises(ValueError, match=r"a RandomChoice inside a RandomChoice"):
        load(folder(sample), batch_transform=B.RandomChoice(
            [B.RandomChoice([B.MixUp(num_classes=3)]), B.CutMix(num_classes=3)]))
    with pytest.raises(ValueError, match=r"batch_transform takes MixUp, CutMix or a "
                                         r"RandomChoice"):
        load(folder(sample), batch_transform=T.RandomHorizontalFlip())


def test_torchvision_options_stoker_cannot_honour_are_refused(sample):
    v2 = pytest.importorskip("torchvision.transforms.v2")
    ds = folder(sample)
    with pytest.raises(ValueError, match=r"torchvision's MixUp has a custom labels_getter"):
        load(ds, batch_transform=v2.MixUp(num_classes=CLASSES, labels_getter=lambda x: x[1]))
    with pytest.raises(ValueError, match=r"torchvision's CutMix has a custom labels_getter"):
        load(ds, batch_transform=v2.RandomChoice([v2.CutMix(num_classes=CLASSES,
                                                            labels_getter=None)]))
    with pytest.raises(ValueError, match=r"torchvision's MixUp needs num_classes"):
        load(ds, batch_transform=v2.MixUp())
    with pytest.raises(ValueError, match=r"batch_transform takes MixUp, CutMix"):
        load(ds, batch_transform=v2.Compose([v2.MixUp(num_classes=CLASSES)]))


def test_datasets_without_image_batches_are_refused():
    arrays = stoker.ArrayDataset(np.zeros((10, 3, 4, 4), np.float32), np.zeros(10, np.int64))
    with pytest.raises(ValueError, match=r"mixes batches of \(images, labels\): it is for "
                                         r"ImageFolder, TarShards and TableDataset"):
        stoker.DataLoader(arrays, batch_size=2, batch_transform=B.MixUp(num_classes=3))
    with pytest.raises(ValueError, match=r"batch_transform=MixUp.* is for Stoker's image "
                                         r"datasets"):
        stoker.DataLoader([(torch.zeros(3, 4, 4), 0)] * 4, batch_size=2,
                          batch_transform=B.MixUp(num_classes=3))
