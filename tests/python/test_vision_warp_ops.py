"""The geometric operations of stoker/image/ops.h (warp.cc) against torchvision.transforms.v2 itself.

Each case runs torchvision's kernel (``F.affine``, ``F.rotate``, ``F.pad`` on a uint8 CHW tensor)
and Stoker's (``_native.testing.image_op`` on the same pixels, HWC) and compares: the mean
absolute difference must stay <= 1 of 255 everywhere, and where torch's CPU kernels are the
vectorized ones that warp.cc reproduces (fused multiply-adds in grid_sample: the AVX2 and AVX512
builds) the output must be identical. The parameters are the ones the auto-augment policies draw
(TrivialAugmentWide, RandAugment, AutoAugment) plus random affine maps; the images are noise of
odd and even sizes and photographs. Run with ``-s`` to see the largest difference per operation.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
from torchvision.transforms.v2 import functional as F  # noqa: E402

from stoker import _native  # noqa: E402

if not hasattr(_native, "testing"):
    pytest.skip("the extension was built without STOKER_TESTING", allow_module_level=True)

# torch's grid_sample kernel uses fused multiply-adds only where it is compiled for AVX2 or
# AVX512; elsewhere its roundings differ from warp.cc's in the last bit, and only the mean bound
# is asserted.
EXACT = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _noise(height, width, seed):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _photos():
    try:
        from skimage import data
    except ImportError:  # Pillow-made stand-ins: gradients, shapes and text, odd and even sides
        from PIL import Image, ImageDraw

        photos = []
        for w, h in ((512, 512), (600, 400), (451, 300)):
            img = Image.linear_gradient("L").resize((w, h)).convert("RGB")
            draw = ImageDraw.Draw(img)
            draw.ellipse((w // 5, h // 6, w // 2, h // 2), fill=(200, 40, 90))
            draw.rectangle((w // 2, h // 3, w - 20, h - 30), outline=(10, 220, 30), width=7)
            draw.text((20, h - 40), "stoker warp", fill=(250, 250, 0))
            photos.append(np.asarray(img))
        return photos
    return [data.astronaut(), data.coffee(), data.chelsea()]  # 512x512, 400x600, 300x451


_NOISE_SIZES = [(1, 1), (2, 3), (16, 17), (31, 47), (32, 48), (48, 32)]
IMAGES = {f"noise{h}x{w}": _noise(h, w, 10 * h + w) for h, w in _NOISE_SIZES}
IMAGES.update(zip(("astronaut", "coffee", "chelsea"), _photos()))
PHOTOS = ("astronaut", "coffee", "chelsea")

INTERPOLATIONS = ("nearest", "bilinear")
# fill=None (zero padding, no mask channel), a scalar-like fill and a per-channel one (half
# values round to even).
FILLS = (None, [128.0, 128.0, 128.0], [124.0, 116.5, 104.0])

_stats = {}  # operation -> [cases, differing pixels, max abs diff, largest mean abs diff]


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    for op, (cases, pixels, worst, mean) in sorted(_stats.items()):
        print(f"\n{op}: {cases} cases, {pixels} differing pixels, max abs diff {worst}, "
              f"largest mean abs diff {mean:.5f}")


def _torch(image):
    return torch.from_numpy(image).permute(2, 0, 1).contiguous()


def _compare(op, ours, theirs, what):
    theirs = theirs.permute(1, 2, 0).numpy()
    assert ours.shape == theirs.shape, what
    diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    differing = int((diff.max(axis=2) > 0).sum())
    mean = float(diff.mean())
    s = _stats.setdefault(op, [0, 0, 0, 0.0])
    s[0] += 1
    s[1] += differing
    s[2] = max(s[2], int(diff.max()))
    s[3] = max(s[3], mean)
    assert mean <= 1.0, f"{what}: mean abs diff {mean}"
    if EXACT:
        assert differing == 0, f"{what}: {differing} pixels differ, max {diff.max()}"


def _affine(name, image, interpolation, fill, center, angle=0.0, translate=(0, 0), scale=1.0,
            shear=(0.0, 0.0)):
    theirs = F.affine(_torch(image), angle=angle, translate=list(translate), scale=scale,
                      shear=list(shear), interpolation=F.InterpolationMode(interpolation),
                      fill=fill, center=center)
    ours = _native.testing.image_op(
        "affine", image, dict(angle=angle, translate=list(translate), scale=scale,
                              shear=list(shear), interpolation=interpolation, fill=fill,
                              center=center))
    what = (f"{name} affine(angle={angle}, translate={translate}, scale={scale}, shear={shear}, "
            f"{interpolation}, fill={fill}, center={center})")
    _compare(f"affine {interpolation}", ours, theirs, what)


def _rotate(name, image, angle, interpolation, fill, center):
    theirs = F.rotate(_torch(image), angle=angle, interpolation=F.InterpolationMode(interpolation),
                      fill=fill, center=center)
    ours = _native.testing.image_op(
        "rotate", image, dict(angle=angle, interpolation=interpolation, fill=fill, center=center))
    what = f"{name} rotate({angle}, {interpolation}, fill={fill}, center={center})"
    _compare(f"rotate {interpolation}", ours, theirs, what)


def _bins(end, num_bins, count):
    """`count` magnitudes as the policies draw them, up to the largest: bins of a float32
    linspace, both signs."""
    values = torch.linspace(0.0, end, num_bins)
    picked = sorted({int(i) for i in np.linspace(num_bins - 1, 1, count).round()})
    return [float(values[i]) for i in picked] + [-float(values[i]) for i in picked]


# (policy, ShearX/Y magnitude end, TranslateX/Y end as a function of the side, bins); Rotate's
# ends (135 and 30 degrees) are in test_rotate.
POLICIES = [
    ("TrivialAugmentWide", 0.99, lambda side: 32.0, 31),
    ("RandAugment", 0.3, lambda side: 150.0 / 331.0 * side, 31),
    ("AutoAugment", 0.3, lambda side: 150.0 / 331.0 * side, 10),
]


# AutoAugment's magnitudes lie in RandAugment's ranges: on the (larger) photos, RandAugment's.
@pytest.mark.parametrize("name, policy", [
    pytest.param(name, policy, id=f"{name}-{policy[0]}")
    for name in IMAGES for policy in POLICIES
    if not (name in PHOTOS and policy[0] == "AutoAugment")])
def test_auto_augment_shears_and_translations(name, policy):
    _, shear_end, translate_end, num_bins = policy
    image = IMAGES[name]
    height, width = image.shape[:2]
    # The policies shear about center=[0, 0] and translate about the default centre (None); on
    # noise both centres are checked for both, on the (larger) photos the policies' own.
    photo = name in PHOTOS
    shear_count, translate_count = (1, 1) if photo else (3, 2)
    shear_centers = ([0, 0],) if photo else ([0, 0], None)
    translate_centers = (None,) if photo else (None, [0, 0])
    for interpolation in INTERPOLATIONS:
        for fill in FILLS[::2] if photo else FILLS:
            for center in shear_centers:
                for m in _bins(shear_end, num_bins, shear_count):
                    degrees = math.degrees(math.atan(m))
                    _affine(name, image, interpolation, fill, center, shear=(degrees, 0.0))
                    _affine(name, image, interpolation, fill, center, shear=(0.0, degrees))
            for center in translate_centers:
                for m in _bins(translate_end(width), num_bins, translate_count):
                    _affine(name, image, interpolation, fill, center, translate=(int(m), 0))
                for m in _bins(translate_end(height), num_bins, translate_count):
                    _affine(name, image, interpolation, fill, center, translate=(0, int(m)))


@pytest.mark.parametrize("name", list(IMAGES))
def test_rotate(name):
    image = IMAGES[name]
    photo = name in PHOTOS
    angles = set(_bins(135.0, 31, 4) + _bins(30.0, 31, 2))  # TrivialAugmentWide, RandAugment
    # Quarter turns: an index permutation on square images, a warp with half-pixel ties on
    # others; 0 and 360 are the copy path; -1e-20 % 360 is 360.0 in Python, not 0.
    angles |= {0.0, 90.0, 180.0, 270.0, -90.0, 360.0, 450.0, 1e-20, -1e-20}
    if photo:
        angles = {135.0, -30.0, 90.0, 180.0}
    for angle in sorted(angles):
        for interpolation in INTERPOLATIONS:
            for fill in FILLS[::2] if photo else FILLS:
                for center in (None, [0, 0], [image.shape[1] / 2, image.shape[0] / 2]):
                    _rotate(name, image, angle, interpolation, fill, center)


@pytest.mark.parametrize("name", [n for n in IMAGES if n not in PHOTOS] + ["chelsea"])
def test_affine_random_parameters(name):
    """Angles, fractional translations, scales, both shears and arbitrary centres together."""
    image = IMAGES[name]
    height, width = image.shape[:2]
    rng = np.random.default_rng(len(name) * 1000 + width)
    for trial in range(24 if name != "chelsea" else 6):
        center = [None, [0, 0], [float(rng.uniform(-5, width + 5)), float(rng.uniform(0, height))]][
            trial % 3]
        _affine(name, image, INTERPOLATIONS[trial % 2], FILLS[(trial // 2) % 3], center,
                angle=float(rng.uniform(-180, 180)),
                translate=(float(rng.uniform(-0.5, 0.5) * width), float(rng.uniform(-40, 40))),
                scale=float(rng.uniform(0.5, 2.0)),
                shear=(float(rng.uniform(-60, 60)), float(rng.uniform(-30, 30))))


def _paddings(height, width, mode):
    """Asymmetric [left, top, right, bottom] up to what the mode allows (reflect < side,
    symmetric <= side, edge and constant beyond)."""
    limit_w = width - 1 if mode == "reflect" else width if mode == "symmetric" else 2 * width
    limit_h = height - 1 if mode == "reflect" else height if mode == "symmetric" else 2 * height
    one_w, one_h = min(1, limit_w), min(1, limit_h)
    return [[limit_w, 0, 0, 0], [0, limit_h, 0, 0], [0, 0, limit_w, 0], [0, 0, 0, limit_h],
            [limit_w, limit_h, limit_w // 2, one_h], [one_w, 0, limit_w, limit_h], [0, 0, 0, 0]]


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
@pytest.mark.parametrize("name", list(IMAGES))
def test_pad(name, mode):
    image = IMAGES[name]
    height, width = image.shape[:2]
    fills = [0, 7, [3, 150, 255]] if mode == "constant" else [0]
    for padding in _paddings(height, width, mode):
        for fill in fills:
            theirs = F.pad(_torch(image), padding=padding, fill=fill, padding_mode=mode)
            per_channel = fill if isinstance(fill, list) else [fill] * 3
            ours = _native.testing.image_op(
                "pad", image, dict(padding=padding, mode=mode, fill=per_channel))
            what = f"{name} pad({padding}, {mode}, fill={fill})"
            theirs = theirs.permute(1, 2, 0).numpy()
            assert ours.shape == theirs.shape, what
            np.testing.assert_array_equal(ours, theirs, err_msg=what)
            s = _stats.setdefault("pad", [0, 0, 0, 0.0])
            s[0] += 1


@pytest.mark.parametrize("mode", ["reflect", "symmetric"])
def test_pad_rejects_what_torch_rejects(mode):
    image = IMAGES["noise16x17"]
    too_far = 16 if mode == "reflect" else 17  # along the height of 16
    with pytest.raises(Exception):
        F.pad(_torch(image), padding=[0, too_far, 0, 0], padding_mode=mode)
    with pytest.raises(ValueError, match=f"{mode} padding must be"):
        _native.testing.image_op("pad", image, dict(padding=[0, too_far, 0, 0], mode=mode))
    F.pad(_torch(image), padding=[0, too_far - 1, 0, 0], padding_mode=mode)
    _native.testing.image_op("pad", image, dict(padding=[0, too_far - 1, 0, 0], mode=mode))
