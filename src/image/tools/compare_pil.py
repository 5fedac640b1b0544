"""Compares stoker's Resize+CenterCrop with PIL's (torchvision's PIL path).

Usage: python compare_pil.py TOOL_BINARY IMAGE... [--resize 256] [--crop 224]
Needs Pillow and numpy. Prints, per image and DCT setting, the mean/max absolute difference.
"""
import argparse
import os
import subprocess
import tempfile

import numpy as np
from PIL import Image


def pil_reference(path, resize, crop):
    img = Image.open(path).convert("RGB")
    w, h = img.size
    # torchvision Resize(int): shorter side to `resize`, longer = int(resize * long / short).
    if w <= h:
        size = (resize, int(resize * h / w))
    else:
        size = (int(resize * w / h), resize)
    img = img.resize(size, Image.BILINEAR)
    w, h = img.size
    top = int(round((h - crop) / 2.0))
    left = int(round((w - crop) / 2.0))
    return np.asarray(img.crop((left, top, left + crop, top + crop)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tool")
    ap.add_argument("images", nargs="+")
    ap.add_argument("--resize", type=int, default=256)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--dct", type=float, nargs="+", default=[0.0, 2.0])
    args = ap.parse_args()
    for path in args.images:
        ref = pil_reference(path, args.resize, args.crop).astype(np.int32)
        row = [f"{os.path.basename(path):24s} {Image.open(path).size}"]
        for dct in args.dct:
            with tempfile.NamedTemporaryFile(suffix=".raw") as out:
                subprocess.run([args.tool, "run", path, out.name, str(args.resize),
                                str(args.crop), str(dct)], check=True)
                got = np.fromfile(out.name, np.uint8).reshape(args.crop, args.crop, 3)
            d = np.abs(got.astype(np.int32) - ref)
            row.append(f"dct_min_ratio={dct}: MAD {d.mean():.3f} max {d.max()}")
        print("  ".join(row))


if __name__ == "__main__":
    main()
