"""How far torchvision v2's PIL kernels are from its tensor kernels (which Stoker matches), on
scikit-image's photos center-cropped to 224x224: what a user who runs a recipe on PIL images, as
torchvision's reference script does, sees against Stoker (docs/recipes.md quotes it).

    .venv/bin/python tools/torchvision_backends.py
"""
import numpy as np
from PIL import Image
import skimage.data as d

from torchvision.transforms.v2 import functional as F
imgs = [Image.fromarray(f()).convert("RGB") for f in (d.astronaut, d.coffee, d.chelsea)]
imgs = [F.center_crop(im, [224, 224]) for im in imgs]
ops = {
  "brightness 1.5": lambda x: F.adjust_brightness(x, 1.5),
  "contrast 0.5": lambda x: F.adjust_contrast(x, 0.5),
  "saturation 1.5": lambda x: F.adjust_saturation(x, 1.5),
  "hue 0.1": lambda x: F.adjust_hue(x, 0.1),
  "sharpness 1.9": lambda x: F.adjust_sharpness(x, 1.9),
  "posterize 4": lambda x: F.posterize(x, 4),
  "solarize 128": lambda x: F.solarize(x, 128),
  "autocontrast": F.autocontrast,
  "equalize": F.equalize,
  "rotate 30 nearest": lambda x: F.rotate(x, 30.0),
  "rotate 30 bilinear": lambda x: F.rotate(x, 30.0, interpolation=F.InterpolationMode.BILINEAR),
  "shear_x 0.3 nearest": lambda x: F.affine(x, 0.0, [0, 0], 1.0, [16.7, 0.0], center=[0, 0]),
  "translate 20": lambda x: F.affine(x, 0.0, [20, 0], 1.0, [0.0, 0.0]),
}
for name, op in ops.items():
    m = []
    for im in imgs:
        a = np.asarray(op(im), np.float64)
        b = op(F.pil_to_tensor(im)).permute(1, 2, 0).numpy().astype(np.float64)
        m.append(np.abs(a - b).mean())
    print(f"{name:22s} mean |PIL - tensor| = {np.mean(m):.3f}  (max over images {np.max(m):.3f})")
