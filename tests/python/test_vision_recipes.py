"""torchvision.transforms.v2 pipelines through Stoker's image datasets: what compiles natively,
the native pipeline against torchvision on the same pixels, determinism whatever the workers,
and the Python fallback for a transform Stoker does not know.

The kernels themselves are held against torchvision op by op in test_vision_color_ops.py and
test_vision_warp_ops.py; here the parameters (torchvision's sampling rules and magnitude tables)
and the wiring of the stages are."""

import math
import warnings

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker import transforms as T
from stoker.sample_data import make_sample
from stoker.sources.images import PythonTransformWarning

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes") / "sample"
    make_sample(root, num_classes=3, images_per_class=6, shards=2)
    return root


def folder(sample):
    return str(sample / "train")


def reference_train(crop=176):
    """torchvision's ImageNet reference training transform (references/classification)."""
    return v2.Compose([
        v2.RandomResizedCrop(crop, interpolation=v2.InterpolationMode.BILINEAR, antialias=True),
        v2.RandomHorizontalFlip(0.5),
        v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR),
        v2.PILToTensor(),
        v2.ToDtype(torch.float, scale=True),
        v2.Normalize(mean=MEAN, std=STD),
        v2.RandomErasing(0.1),
        v2.ToPureTensor(),
    ])


def reference_val():
    return v2.Compose([v2.Resize(232, interpolation=v2.InterpolationMode.BILINEAR,
                                 antialias=True),
                       v2.CenterCrop(224), v2.PILToTensor(), v2.ToDtype(torch.float, scale=True),
                       v2.Normalize(mean=MEAN, std=STD)])


def decoded(path):
    """The file's pixels as torchvision sees them (PIL; Stoker's decoder gives the same)."""
    return np.asarray(Image.open(path).convert("RGB"))


def chw(hwc):
    return torch.from_numpy(np.ascontiguousarray(hwc)).permute(2, 0, 1).contiguous()


def mad(a, b):
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).mean())


# --------------------------------------------------------------------------- compiling


def test_the_reference_recipes_compile_to_native_pipelines():
    for recipe in (reference_train(), reference_val()):
        c = T.compile_transform(recipe)
        assert c.python == []
        assert "PILToTensor" in c.native_names or c.native_names  # skipped no-ops are not listed
    c = T.compile_transform(reference_train())
    assert [type(t).__name__ for t in c.native] == [
        "RandomResizedCrop", "RandomHorizontalFlip", "TrivialAugmentWide", "ToDtype",
        "Normalize", "RandomErasing"]
    tw = c.native[2]
    assert tw.interpolation == "bilinear" and tw.num_magnitude_bins == 31 and tw.fill is None


def test_every_supported_v2_transform_compiles_with_its_parameters():
    cases = [
        (v2.RandomResizedCrop((100, 120), scale=(0.2, 0.9), ratio=(0.5, 2.0), antialias=False),
         {"height": 100, "width": 120, "scale": (0.2, 0.9), "ratio": (0.5, 2.0),
          "antialias": False}),
        (v2.Resize(80), {"shorter_side": 80, "antialias": True}),
        (v2.Resize((30, 40)), {"height": 30, "width": 40}),
        (v2.CenterCrop(50), {"height": 50, "width": 50}),
        (v2.RandomHorizontalFlip(0.25), {"p": 0.25}),
        (v2.RandomVerticalFlip(0.75), {"p": 0.75}),
        (v2.Pad([1, 2, 3, 4], fill=7, padding_mode="constant"),
         {"left": 1, "top": 2, "right": 3, "bottom": 4, "fill": [7, 7, 7], "mode": "constant"}),
        (v2.Pad(5, padding_mode="reflect"), {"left": 5, "top": 5, "mode": "reflect"}),
        (v2.RandomCrop(32, padding=[1, 2, 3, 4], pad_if_needed=True, fill=(1, 2, 3),
                       padding_mode="edge"),
         {"height": 32, "left": 1, "top": 2, "right": 3, "bottom": 4, "fill": [1, 2, 3],
          "mode": "edge", "pad_if_needed": True}),
        (v2.ColorJitter(0.4, 0.3, 0.2, 0.1),
         {"brightness": (0.6, 1.4), "contrast": (0.7, 1.3), "saturation": (0.8, 1.2),
          "hue": (-0.1, 0.1)}),
        (v2.ColorJitter(brightness=(0.5, 0.9)), {"brightness": (0.5, 0.9), "hue": None}),
        (v2.RandomGrayscale(0.3), {"p": 0.3}),
        (v2.GaussianBlur((3, 5), sigma=(0.5, 1.5)),
         {"kernel_width": 3, "kernel_height": 5, "sigma": (0.5, 1.5)}),
        (v2.RandomRotation(15, interpolation=v2.InterpolationMode.BILINEAR, fill=9),
         {"degrees": (-15.0, 15.0), "interpolation": "bilinear", "fill": (9.0, 9.0, 9.0)}),
        (v2.RandomAffine(10, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(1, 2, 3, 4)),
         {"degrees": (-10.0, 10.0), "translate": (0.1, 0.2), "scale": (0.8, 1.2),
          "shear_x": (1.0, 2.0), "shear_y": (3.0, 4.0), "interpolation": "nearest",
          "fill": (0.0, 0.0, 0.0)}),
        (v2.TrivialAugmentWide(num_magnitude_bins=15), {"num_magnitude_bins": 15, "fill": None}),
        (v2.RandAugment(num_ops=3, magnitude=5, fill=[1, 2, 3]),
         {"num_ops": 3, "magnitude": 5, "fill": (1.0, 2.0, 3.0), "interpolation": "nearest"}),
        (v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10), {"policy": "cifar10"}),
        (v2.RandomErasing(p=0.3, scale=(0.1, 0.2), ratio=(0.5, 1.5), value=(1, 2, 3)),
         {"p": 0.3, "scale": (0.1, 0.2), "value": [1.0, 2.0, 3.0], "random_value": False}),
        (v2.RandomErasing(value="random"), {"random_value": True}),
        (v2.ToDtype(torch.float16, scale=True), {"dtype": "float16", "scale": True}),
        (v2.ToDtype({tv.tv_tensors.Image: torch.float32, "others": None}, scale=False),
         {"dtype": "float32", "scale": False}),
        (v2.Normalize(MEAN, STD), {"mean": MEAN, "std": STD}),
    ]
    for t, expected in cases:
        c = T.compile_transform(t)
        assert c.python == [], t
        (name, params), = c.specs[-1:]
        assert name in (type(t).__name__, "ToTensor"), (t, name)
        for key, value in expected.items():
            got = params[key]
            if isinstance(value, tuple) and got is not None:
                got = tuple(got)
            assert got == pytest.approx(value) if value is not None else got is None, (t, key)


def test_random_apply_and_nested_compose_compile():
    c = T.compile_transform(v2.Compose([
        v2.Compose([v2.CenterCrop(40)]),
        v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
        v2.RandomGrayscale(0.2),
    ]))
    assert c.python == []
    assert [s[0] for s in c.specs] == ["CenterCrop", "RandomApply", "ColorJitter",
                                        "RandomGrayscale"]
    assert c.specs[1][1] == {"p": 0.8, "count": 1}


def test_unsupported_parameters_fall_back_to_python():
    for t in (v2.RandomResizedCrop(32, interpolation=v2.InterpolationMode.BICUBIC,
                                   antialias=False),
              v2.Resize(32, interpolation=v2.InterpolationMode.LANCZOS),
              v2.RandomRotation(10, expand=True),
              v2.Resize(32, max_size=40),
              v2.RandomPerspective(),
              v2.RandomApply([v2.RandomPerspective()])):
        c = T.compile_transform(v2.Compose([v2.CenterCrop(64), t]))
        assert c.native_names == ["CenterCrop"] and c.python == [t]


def test_bicubic_resizes_run_natively():
    """torchvision's BICUBIC (antialiased, as on PIL images) is PIL's bicubic, run natively."""
    c = T.compile_transform(v2.Compose([
        v2.Resize(40, interpolation=v2.InterpolationMode.BICUBIC),
        v2.RandomResizedCrop(32, interpolation=v2.InterpolationMode.BICUBIC)]))
    assert c.python == []
    assert [s[1]["interpolation"] for s in c.specs] == ["bicubic", "bicubic"]
    with pytest.raises(ValueError, match="antialias=False is bilinear only"):
        T.Resize(8, interpolation="bicubic", antialias=False)
    with pytest.raises(ValueError, match="interpolation must be"):
        T.Resize(8, interpolation="lanczos")


def test_stoker_transform_after_a_python_one_is_an_error():
    with pytest.raises(ValueError, match="RandomPerspective"):
        T.compile_transform([v2.RandomPerspective(), T.CenterCrop(8)])


# --------------------------------------------------------------------------- native vs torchvision


def first_image(sample):
    ds = stoker.ImageFolder(folder(sample))
    return ds.samples[0][0]


def native_item(sample, transform, index=0):
    ds = stoker.ImageFolder(folder(sample), transform=transform)
    return np.asarray(ds[index][0])


def test_deterministic_pipeline_matches_torchvision_on_the_same_pixels(sample):
    """Fixed parameters (degenerate ranges): Stoker's output against torchvision's tensor
    kernels on the same decoded, cropped image."""
    path = first_image(sample)
    cases = [
        ([v2.ColorJitter(brightness=(1.3, 1.3))], lambda x: F.adjust_brightness(x, 1.3)),
        ([v2.ColorJitter(contrast=(0.6, 0.6))], lambda x: F.adjust_contrast(x, 0.6)),
        ([v2.ColorJitter(saturation=(1.7, 1.7))], lambda x: F.adjust_saturation(x, 1.7)),
        ([v2.ColorJitter(hue=(0.2, 0.2))], lambda x: F.adjust_hue(x, 0.2)),
        ([v2.RandomGrayscale(1.0)], lambda x: F.rgb_to_grayscale(x, 3)),
        ([v2.GaussianBlur(7, sigma=(1.5, 1.5))], lambda x: F.gaussian_blur(x, [7, 7], [1.5, 1.5])),
        ([v2.RandomRotation((25, 25), interpolation=v2.InterpolationMode.BILINEAR)],
         lambda x: F.rotate(x, 25.0, interpolation=v2.InterpolationMode.BILINEAR, fill=0)),
        ([v2.RandomAffine((0, 0), shear=(10, 10))],
         lambda x: F.affine(x, 0.0, [0, 0], 1.0, [10.0, 0.0], fill=0)),
        ([v2.Pad([3, 4, 5, 6], padding_mode="symmetric"), v2.CenterCrop(120)],
         lambda x: F.center_crop(F.pad(x, [3, 4, 5, 6], padding_mode="symmetric"), [120, 120])),
        ([v2.RandomVerticalFlip(1.0)], lambda x: F.vertical_flip(x)),
    ]
    base = F.center_crop(chw(decoded(path)), [128, 128])
    for ops, reference in cases:
        got = native_item(sample, v2.Compose([v2.CenterCrop(128), *ops]))
        want = reference(base).numpy()
        assert got.shape == want.shape, ops
        assert mad(got, want) <= 1.0, (ops, mad(got, want))


def test_erasing_after_normalize_writes_zeros_in_normalized_units(sample):
    t = v2.Compose([v2.CenterCrop(64), v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                    v2.Normalize(MEAN, STD), v2.RandomErasing(p=1.0, scale=(0.2, 0.2),
                                                              ratio=(1.0, 1.0), value=0)])
    no_erase = v2.Compose(t.transforms[:-1])
    got = native_item(sample, t)
    plain = native_item(sample, no_erase)
    changed = np.any(got != plain, axis=0)
    ys, xs = np.nonzero(changed)
    h, w = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
    assert (h, w) == (29, 29)  # round(sqrt(0.2 * 64 * 64)) on each side
    assert np.all(got[:, ys.min():ys.max() + 1, xs.min():xs.max() + 1] == 0)
    # Before Normalize, the value is normalized with the rest: 2.0 (no pixel's value) becomes
    # (2 - mean) / std.
    t2 = v2.Compose([v2.CenterCrop(64), v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                     v2.RandomErasing(p=1.0, scale=(0.2, 0.2), ratio=(1.0, 1.0), value=2.0),
                     v2.Normalize(MEAN, STD)])
    got2 = native_item(sample, t2)
    erased = np.isclose(got2, ((2 - np.array(MEAN)) / np.array(STD))[:, None, None]).all(0)
    assert erased.sum() == 29 * 29


def test_to_dtype_and_normalize_match_the_native_to_tensor(sample):
    a = native_item(sample, v2.Compose([v2.CenterCrop(48), v2.ToImage(),
                                        v2.ToDtype(torch.float32, scale=True),
                                        v2.Normalize(MEAN, STD)]))
    b = native_item(sample, T.Compose([T.CenterCrop(48), T.ToTensor(), T.Normalize(MEAN, STD)]))
    assert np.array_equal(a, b)
    c = native_item(sample, v2.Compose([v2.CenterCrop(48), v2.ToDtype(torch.float32)]))
    assert c.max() > 1.0 and np.array_equal(c, native_item(sample, T.CenterCrop(48)))


def candidates_rand_augment(x, magnitude, bins):
    """Every image RandAugment(num_ops=1, magnitude) can make of x, by torchvision itself."""
    space = v2.RandAugment._AUGMENTATION_SPACE
    h, w = x.shape[-2:]
    ra = v2.RandAugment(num_ops=1, magnitude=magnitude, num_magnitude_bins=bins)
    out = []
    for op, (fn, signed) in space.items():
        mags = fn(bins, h, w)
        m = 0.0 if mags is None else float(mags[magnitude])
        for sign in ((1, -1) if signed and mags is not None else (1,)):
            out.append((op, ra._apply_image_or_video_transform(
                x, op, sign * m, interpolation=v2.InterpolationMode.NEAREST, fill=ra._fill)))
    return out


def test_rand_augment_draws_an_operation_of_torchvisions_space(sample):
    """Each native output is one of torchvision's candidates (within the kernels' tolerance):
    the operation table, magnitudes, signs and wiring are torchvision's."""
    ds = stoker.ImageFolder(folder(sample), transform=v2.Compose([
        v2.CenterCrop(64), v2.RandAugment(num_ops=1, magnitude=20)]))
    seen = set()
    for i in range(len(ds)):
        got = np.asarray(ds[i][0])
        base = F.center_crop(chw(decoded(ds.samples[i][0])), [64, 64])
        best = min(candidates_rand_augment(base, 20, 31), key=lambda c: mad(got, c[1].numpy()))
        assert mad(got, best[1].numpy()) <= 1.0, (i, best[0])
        seen.add(best[0])
    assert len(seen) >= 5  # the draws spread over the space


def test_trivial_augment_stays_within_torchvisions_outputs(sample):
    tw = v2.TrivialAugmentWide(num_magnitude_bins=4)
    ds = stoker.ImageFolder(folder(sample), transform=v2.Compose([v2.CenterCrop(48), tw]))
    for i in range(len(ds)):
        got = np.asarray(ds[i][0])
        base = F.center_crop(chw(decoded(ds.samples[i][0])), [48, 48])
        cands = []
        for op, (fn, signed) in tw._AUGMENTATION_SPACE.items():
            mags = fn(4, 48, 48)
            for k in range(4 if mags is not None else 1):
                m = 0.0 if mags is None else float(mags[k])
                for sign in ((1, -1) if signed and mags is not None else (1,)):
                    cands.append(tw._apply_image_or_video_transform(
                        base, op, sign * m, interpolation=v2.InterpolationMode.NEAREST,
                        fill=tw._fill).numpy())
        assert min(mad(got, c) for c in cands) <= 1.0, i


def test_auto_augment_applies_a_sub_policy_of_torchvisions(sample):
    aa = v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET)
    ds = stoker.ImageFolder(folder(sample), transform=v2.Compose([v2.CenterCrop(40), aa]))

    def variants(x, op, idx):
        fn, signed = aa._AUGMENTATION_SPACE[op]
        mags = fn(10, 40, 40)
        m = 0.0 if mags is None else float(mags[idx])
        signs = (1, -1) if signed and mags is not None else (1,)
        return [aa._apply_image_or_video_transform(x, op, s * m, interpolation=aa.interpolation,
                                                   fill=aa._fill) for s in signs]

    for i in range(len(ds)):
        got = np.asarray(ds[i][0])
        base = F.center_crop(chw(decoded(ds.samples[i][0])), [40, 40])
        cands = [base]
        for (op1, _, m1), (op2, _, m2) in aa._policies:
            firsts = variants(base, op1, m1)
            cands += firsts
            for x in [base] + firsts:
                cands += variants(x, op2, m2)
        assert min(mad(got, c.numpy()) for c in cands) <= 1.0, i


def test_random_grayscale_and_flips_follow_their_probability(sample):
    ds = stoker.ImageFolder(folder(sample), transform=v2.Compose([
        v2.CenterCrop(16), v2.RandomGrayscale(0.3)]))
    loader = stoker.DataLoader(ds, batch_size=len(ds), output="numpy")
    gray = 0
    total = 0
    for epoch in range(40):
        loader.set_epoch(epoch)
        images, _ = next(iter(loader))
        gray += int(np.sum(np.all(images[:, 0] == images[:, 1], axis=(1, 2))
                           & np.all(images[:, 1] == images[:, 2], axis=(1, 2))))
        total += len(images)
    assert abs(gray / total - 0.3) < 0.06  # 720 draws: 4 standard deviations


# --------------------------------------------------------------------------- the loader


def test_recipe_batches_are_identical_whatever_the_workers(sample):
    ds = stoker.ImageFolder(folder(sample), transform=reference_train(64))
    runs = []
    for workers in (0, 1, 2):
        loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=5, num_workers=workers,
                                   output="numpy")
        runs.append([(x.copy(), y.copy()) for x, y in loader])
    for other in runs[1:]:
        for (a, la), (b, lb) in zip(runs[0], other):
            assert np.array_equal(a, b) and np.array_equal(la, lb)
    stats = stoker.DataLoader(ds, batch_size=4).stats()
    assert stats["transforms"]["python"] == []
    assert "TrivialAugmentWide" in stats["transforms"]["native"]


def test_recipe_resumes_mid_epoch_bit_identically(sample):
    ds = stoker.ImageFolder(folder(sample), transform=reference_train(48))
    full = [x.copy() for x, _ in stoker.DataLoader(ds, batch_size=3, shuffle=True, seed=1,
                                                   output="numpy")]
    loader = stoker.DataLoader(ds, batch_size=3, shuffle=True, seed=1, output="numpy")
    it = iter(loader)
    next(it)
    next(it)
    state = loader.state_dict()
    del it
    again = stoker.DataLoader(ds, batch_size=3, shuffle=True, seed=1, output="numpy",
                              num_workers=1)
    again.load_state_dict(state)
    rest = [x.copy() for x, _ in again]
    assert len(rest) == len(full) - 2
    for a, b in zip(full[2:], rest):
        assert np.array_equal(a, b)


def test_gpu_decode_refuses_image_transforms(sample):
    with pytest.raises((ValueError, RuntimeError)):
        stoker.ImageFolder(folder(sample), transform=reference_train(), decode="cuda")


# --------------------------------------------------------------------------- the Python fallback


class AddOne:
    """A transform Stoker does not know (deterministic), written for PIL images as torchvision's
    ImageFolder hands them: +1 as an array."""

    def __call__(self, x):
        assert isinstance(x, Image.Image)
        return np.asarray(x).astype(np.int16) + 1


def test_an_unknown_transform_runs_in_python_with_a_notice(sample):
    t = v2.Compose([v2.RandomResizedCrop(32), v2.ColorJitter(0.3), v2.RandomPerspective(p=1.0),
                    v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    with pytest.warns(PythonTransformWarning, match="RandomPerspective") as record:
        ds = stoker.ImageFolder(folder(sample), transform=t)
    assert len(record) == 1
    message = str(record[0].message)
    assert "3 transform(s) after it" not in message and "2 transform(s) after it" in message
    assert "RandomResizedCrop, ColorJitter" in message and "ms in Python" in message
    loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=2, num_workers=0)
    first = [(x.clone(), y.clone()) for x, y in loader]
    assert first[0][0].shape == (4, 3, 32, 32) and first[0][0].dtype == torch.float32
    for workers in (1, 2):
        loader2 = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=2, num_workers=workers)
        for (a, la), (b, lb) in zip(first, loader2):
            assert torch.equal(a, b) and torch.equal(la, lb)
    s = stoker.DataLoader(ds, batch_size=4).stats()["transforms"]
    assert s == {"native": ["RandomResizedCrop", "ColorJitter"],
                 "python": ["RandomPerspective", "ToDtype", "Normalize"]}


def test_the_python_part_sees_the_native_image(sample):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PythonTransformWarning)
        ds = stoker.ImageFolder(folder(sample), transform=v2.Compose([
            v2.CenterCrop(40), AddOne()]))
    got = ds[0][0]  # not a v2 transform first: it was handed a PIL image, as torchvision does
    base = F.center_crop(chw(decoded(ds.samples[0][0])), [40, 40])
    assert np.array_equal(got, base.permute(1, 2, 0).numpy().astype(np.int16) + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PythonTransformWarning)
        ds2 = stoker.ImageFolder(folder(sample), transform=v2.Compose([
            v2.CenterCrop(40), v2.Lambda(lambda x: x + 1)]))
    x = ds2[0][0]  # a v2 transform first: handed a tv_tensors.Image (x + 1 unwraps it)
    assert torch.equal(x.as_subclass(torch.Tensor), base + 1)


def test_a_pickled_dataset_gives_no_second_notice(sample):
    import pickle
    with pytest.warns(PythonTransformWarning):
        ds = stoker.ImageFolder(folder(sample), transform=v2.Compose([
            v2.CenterCrop(40), v2.RandomPerspective()]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PythonTransformWarning)
        clone = pickle.loads(pickle.dumps(ds))
    assert len(clone) == len(ds)
