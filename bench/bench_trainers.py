"""Image classification input inside a trainer: Stoker against torch's DataLoader, both in
Lightning, and Stoker in its own plain loop, side by side.

Workload: the built-in ImageNet-like sample data (bench_images.py's "imagenet" profile), decode a
JPEG, RandomResizedCrop(224), random horizontal flip, ToTensor, Normalize, batch of 64, shuffled;
the model is trivial (a linear layer on the images' channel means, SGD), so the loader is the
bottleneck and what a trainer adds around it shows.

Configurations, each in a fresh process (no configuration inherits another's heap, workers or
warm caches), all on the same files (page-cached) and the same cores in one invocation:
- stoker, Lightning: ``stoker.DataLoader(stoker.ImageFolder(root, transform=...))``,
  num_workers "auto", returned by a LightningDataModule, trained by ``Trainer.fit`` (CPU);
- stoker, own loop: the same loader in a plain loop doing the same training step;
- torch, Lightning: ``torch.utils.data.DataLoader`` over ``torchvision.datasets.ImageFolder`` with
  torchvision's transforms on Pillow, num_workers 0 to the usable cores (persistent workers,
  prefetch_factor 2), in the same Lightning program; its best num_workers is the comparison.

Each configuration runs a warm-up epoch, then whole timed epochs: images/s from the end of the
warm-up epoch to the end of the last (inside Lightning: its epoch-end hook, so every epoch's
``iter()``, ``set_epoch`` and per-step hooks are in the time), CPU ms per image (all processes
of the configuration), peak RSS summed over them (polled by the parent). torch uses one thread
for its CPU ops in every configuration (the training step; torchvision's transforms).

Targets: Stoker in Lightning >= 0.95x Stoker in its own loop (Lightning costs the loader almost
nothing); the ratio Stoker / torch's best, both in Lightning, is reported.

Usage:
    python bench/bench_trainers.py --quick      # smoke run: 256 images, one repeat (~1 min)
    python bench/bench_trainers.py              # the full run (a quiet machine: ~4 min)
    python bench/bench_trainers.py --json out.json --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_images import import_torchvision, samples_of  # noqa: E402
from harness import (MEAN, STD, cores, cpu_seconds, emit, link_files, machine_line,  # noqa: E402
                     median_of, read_files, run_measured, write_json)

BATCH = 64
QUICK_IMAGES = 256  # --quick: the first images of the sample data (4 batches an epoch)
TARGET_LIGHTNING_VS_LOOP = 0.95


# ---- measurement, in the child process -------------------------------------------------------

def stoker_loader(root):
    import stoker
    from stoker import transforms as T
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    return stoker.DataLoader(stoker.ImageFolder(root, transform=transform), batch_size=BATCH,
                             shuffle=True, num_workers="auto")


def torch_loader(root, workers):
    import torch
    torchvision = import_torchvision()
    from torchvision import transforms as T
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    kw = dict(prefetch_factor=2, persistent_workers=True) if workers else {}
    return torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root, transform=transform),
                                       batch_size=BATCH, shuffle=True, num_workers=workers, **kw)


def num_classes(root):
    return len({label for _, label in samples_of(root)})


def training_step(head, batch):
    """The trivial model: a linear layer on each image's channel means."""
    import torch.nn.functional as F
    x, y = batch
    return F.cross_entropy(head(x.mean((2, 3))), y)


class Clock:
    """Images and seconds from the end of the warm-up epoch (0) to the end of the last."""

    def __init__(self):
        self.t0 = self.t1 = self.cpu0 = self.cpu1 = None
        self.images = 0

    def batch(self, epoch, batch):
        if epoch > 0:
            self.images += len(batch[1])

    def epoch_end(self, epoch):
        now, cpu = time.perf_counter(), cpu_seconds()
        if epoch == 0:
            self.t0, self.cpu0 = now, cpu
        self.t1, self.cpu1 = now, cpu

    def figures(self):
        return {"images_per_s": self.images / (self.t1 - self.t0),
                "cpu_ms_per_image": (self.cpu1 - self.cpu0) / self.images * 1e3}


def in_lightning(make_loader, classes, epochs):
    import logging

    import lightning.pytorch as pl
    import torch
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):  # their banners
        logging.getLogger(name).setLevel(logging.ERROR)

    clock = Clock()

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(3, classes)

        def training_step(self, batch, batch_idx):
            return training_step(self.head, batch)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            clock.batch(self.current_epoch, batch)

        def on_train_epoch_end(self):
            clock.epoch_end(self.current_epoch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Data(pl.LightningDataModule):
        def train_dataloader(self):
            return make_loader()

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1 + epochs, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, log_every_n_steps=1)
    trainer.fit(Tiny(), datamodule=Data())
    return clock.figures()


def own_loop(make_loader, classes, epochs):
    import torch
    clock = Clock()
    loader = make_loader()
    head = torch.nn.Linear(3, classes)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.01)
    for epoch in range(1 + epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            loss = training_step(head, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            clock.batch(epoch, batch)
        clock.epoch_end(epoch)
    return clock.figures()


def child(spec, root, epochs):
    """One measurement in a fresh process; prints its figures as JSON (the last line)."""
    import warnings
    warnings.simplefilter("ignore")
    import torch
    torch.set_num_threads(1)
    kind, _, arg = spec.partition(":")
    classes = num_classes(root)
    if kind == "stoker-lightning":
        out = in_lightning(lambda: stoker_loader(root), classes, epochs)
    elif kind == "stoker-loop":
        out = own_loop(lambda: stoker_loader(root), classes, epochs)
    elif kind == "torch-lightning":
        out = in_lightning(lambda: torch_loader(root, int(arg)), classes, epochs)
    else:
        raise ValueError(f"unknown configuration {spec!r}")
    emit(out)


# ---- the parent: the data, the configurations, the table ---------------------------------------

def configurations():
    return ([("stoker-loop", "auto"), ("stoker-lightning", "auto")]
            + [("torch-lightning", str(w)) for w in range(cores() + 1)])


def label(kind, arg):
    return {"stoker-loop": "stoker num_workers=auto, own loop",
            "stoker-lightning": "stoker num_workers=auto, in Lightning",
            "torch-lightning": f"torch DataLoader num_workers={arg}, in Lightning"}[kind]


def measure(kind, arg, root, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{kind}:{arg}", "--root",
           str(root), "--epochs", str(args.epochs)]
    try:
        return run_measured(cmd, timeout=args.timeout)
    except RuntimeError as e:
        return {"error": str(e)}


def report(results):
    res = {k: median_of(v) for k, v in results.items()}
    print(f"   {'configuration':<46} {'images/s':>9} {'(min-max)':>13} {'CPU ms/img':>10} "
          f"{'peak RSS':>9}")
    for key, r in res.items():
        if "error" in r:
            print(f"   {label(*key):<46} failed: {r['error'][:60]}")
            continue
        spread = f"{r['images_per_s_min']:,.0f}-{r['images_per_s_max']:,.0f}"
        print(f"   {label(*key):<46} {r['images_per_s']:>9,.0f} {spread:>13} "
              f"{r['cpu_ms_per_image']:>10.2f} {r.get('peak_rss', 0) / 2**20:>7.0f}MB")
    ok = {k: r for k, r in res.items() if "error" not in r}
    torch_keys = [k for k in ok if k[0] == "torch-lightning"]
    lightning, loop = ok.get(("stoker-lightning", "auto")), ok.get(("stoker-loop", "auto"))
    checks = []
    if lightning and torch_keys:
        best = max(torch_keys, key=lambda k: ok[k]["images_per_s"])
        checks.append((f"stoker in Lightning vs torch's best in Lightning ({best[1]} workers)",
                       lightning["images_per_s"] / ok[best]["images_per_s"], None))
    if lightning and loop:
        checks.append(("stoker in Lightning vs stoker in its own loop",
                       lightning["images_per_s"] / loop["images_per_s"],
                       TARGET_LIGHTNING_VS_LOOP))
    print("   summary:")
    for name, value, target in checks:
        verdict = "" if target is None else \
            f"  target >= {target:<5} {'PASS' if value >= target else 'FAIL'}"
        print(f"     {name:<66} {value:6.2f}x{verdict}")
    return {"results": {f"{k}:{a}": r for (k, a), r in res.items()},
            "checks": [{"name": n, "value": v, "target": None if t is None else f">= {t}"}
                       for n, v, t in checks]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help=f"a short smoke run: {QUICK_IMAGES} images, one repeat, one timed epoch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=None, help="timed epochs (default 5)")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds a configuration may run before it is killed (default 600)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.root, args.epochs)
    if args.quick:
        args.repeats = 1
    args.epochs = args.epochs or (1 if args.quick else 5)

    import stoker
    from stoker.sample_data import default_sample_root, make_sample
    make_sample(default_sample_root("imagenet"), profile="imagenet")
    root = default_sample_root("imagenet") / "train"
    files = samples_of(root)
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            files = files[:QUICK_IMAGES]
            root = link_files([p for p, _ in files], root, Path(tmp) / "quick")
        read_files(p for p, _ in files)  # every loader reads from RAM
        print(f"{machine_line()}\n\n== {len(files)} JPEGs in {root}; {cores()} cores, batch "
              f"{BATCH}, a warm-up epoch and {args.epochs} timed; stoker {stoker.__version__}",
              flush=True)
        results = {}
        for _ in range(args.repeats):  # rounds interleaved: a slow spell hits every one alike
            for kind, arg in configurations():
                r = measure(kind, arg, root, args)
                results.setdefault((kind, arg), []).append(r)
                print("." if "error" not in r else "x", end="", flush=True)
        print()
    out = report(results)
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
