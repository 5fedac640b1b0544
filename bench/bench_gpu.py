"""The GPU feed, measured on a GPU: host-to-device bandwidth, data stall in training, diagnosis.

Sections (all by default; pick with --sections):

- h2d: bandwidth of batches delivered by ``stoker.DataLoader(device="cuda")`` against the bound,
  a pinned torch tensor's ``copy_(non_blocking=True)`` of the same size, and against a pageable
  tensor's copy. Batches of 8, 32 and 128 MiB (uint8 rows, no transform: the loader's work is a
  memcpy per sample). Target: >= 0.9x the pinned bound for batches >= 8 MiB. The CPU-only rate
  of the same loader (device=None) is printed too: when it is below the bound, the CPU, not the
  copy path, is the limit.
- train: ResNet-50 (torchvision, channels_last, bf16 autocast, SGD) fed by (a) synthetic batches
  already on the GPU (the upper bound), (b) Stoker ImageFolder + RandomResizedCrop(224) + flip +
  ToTensor + Normalize with device="cuda", (c) torch DataLoader(pin_memory=True) over
  torchvision's ImageFolder with the same torchvision transforms, at its best num_workers (a
  quick CPU-only sweep picks it), copying with ``non_blocking=True``. Reported: images/s, the
  fraction of GPU time idle between steps (CUDA events: the end of one step's work to the start
  of the next one's, i.e. the GPU waiting for the host to bring data), and the host's time
  blocked in next(). Targets: (b) >= 0.98x (a) when the CPU keeps up (Stoker's CPU-only rate
  above (a)'s); otherwise (b)/(c) >= the ratio of their CPU-only rates.
- diagnose: ``stoker.diagnose`` on (b)'s loader with the ResNet-50 step (expected
  "compute-bound" when the CPU keeps up) and with a tiny model (expected "input-bound"), with the
  GPU utilization NVML reported.

Data: --data DIR (an ImageFolder tree), else Stoker's built-in sample data (needs scikit-image),
else synthetic JPEGs (500x375, quality 90) written once under ~/.cache/stoker/bench-gpu-jpegs.

  python bench/bench_gpu.py                # the full run on a GPU machine (~10 minutes)
  python bench/bench_gpu.py --quick        # a short run: one size, fewer steps
  python bench/bench_gpu.py --cpu-smoke    # every code path on the CPU, tiny sizes (no GPU
                                           # needed; the figures mean nothing)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

import stoker
from stoker import transforms as T

from harness import MEAN, STD, write_json  # bench/harness.py, beside this file

MiB = 1 << 20


class Bench:
    """Where the bench runs: a CUDA device, or the CPU for --cpu-smoke."""

    def __init__(self, smoke):
        self.smoke = smoke
        if smoke:
            self.device = torch.device("cpu")
        else:
            if not torch.cuda.is_available():
                sys.exit("bench_gpu.py needs a CUDA GPU (or --cpu-smoke to check the script)")
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.loader_device = None if smoke else self.device

    def sync(self):
        if not self.smoke:
            torch.cuda.synchronize(self.device)

    def event(self):
        return torch.cuda.Event(enable_timing=True) if not self.smoke else _HostEvent()


class _HostEvent:
    """A stand-in for torch.cuda.Event on the CPU (--cpu-smoke)."""

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0


def epochs_of(loader):
    """The loader's batches, epoch after epoch, as training runs them."""
    epoch = 0
    while True:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        elif hasattr(getattr(loader, "sampler", None), "set_epoch"):
            loader.sampler.set_epoch(epoch)
        epoch += 1
        yield from loader


# ---- h2d -----------------------------------------------------------------------------------------

def copy_bandwidth(bench, nbytes, pinned, repeats):
    """GB/s of `repeats` copies of one host tensor into one device tensor (the bound)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned and not bench.smoke)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=bench.device)
    dst.copy_(src, non_blocking=True)
    bench.sync()
    start, end = bench.event(), bench.event()
    start.record()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=True)
    end.record()
    bench.sync()
    return repeats * nbytes / (start.elapsed_time(end) / 1000.0) / 1e9


def loader_bandwidth(bench, dataset, batch, batches, device, workers):
    """GB/s of batches delivered by stoker.DataLoader (into GPU memory with a device)."""
    loader = stoker.DataLoader(dataset, batch_size=batch, num_workers=workers, device=device,
                               memory_budget=8 * batch * dataset_row_bytes(dataset) + MiB)
    it = epochs_of(loader)
    first = next(it)
    nbytes = first.numel() * first.element_size()
    del first
    bench.sync()
    start = time.perf_counter()
    for _ in range(batches):
        x = next(it)
        del x
    bench.sync()
    elapsed = time.perf_counter() - start
    it.close()
    return batches * nbytes / elapsed / 1e9


def dataset_row_bytes(dataset):
    return dataset._row_bytes


def run_h2d(bench, args):
    sizes = [8] if args.quick else [8, 32, 128]
    if bench.smoke:
        sizes = [1]
    workers = stoker.usable_cores()
    rows = []
    print(f"\n== h2d: batches delivered into {'GPU' if not bench.smoke else 'CPU'} memory, "
          f"{workers} workers")
    print(f"{'batch':>9} {'pinned copy_':>13} {'pageable':>10} {'stoker cuda':>12} "
          f"{'vs pinned':>10} {'stoker CPU-only':>16}")
    for mib in sizes:
        nbytes = mib * MiB
        batch = 8
        row = nbytes // batch
        per_epoch = 16
        data = np.empty((batch * per_epoch, row), dtype=np.uint8)
        for i in range(len(data)):
            data[i] = i % 251
        dataset = stoker.ArrayDataset(data)
        dataset._row_bytes = row
        repeats = 20 if args.quick or bench.smoke else 50
        batches = 40 if args.quick or bench.smoke else 200
        pinned = copy_bandwidth(bench, nbytes, True, repeats)
        pageable = copy_bandwidth(bench, nbytes, False, repeats)
        fed = loader_bandwidth(bench, dataset, batch, batches, bench.loader_device, workers)
        cpu_only = loader_bandwidth(bench, dataset, batch, batches, None, workers)
        ratio = fed / pinned
        rows.append({"batch_mib": mib, "pinned_gbps": pinned, "pageable_gbps": pageable,
                     "stoker_device_gbps": fed, "stoker_cpu_only_gbps": cpu_only,
                     "ratio_vs_pinned": ratio})
        print(f"{mib:>6} MiB {pinned:>10.1f} GB/s {pageable:>6.1f} GB/s {fed:>8.1f} GB/s "
              f"{ratio:>9.2f}x {cpu_only:>11.1f} GB/s")
    for r in rows:
        verdict = "PASS" if r["ratio_vs_pinned"] >= 0.9 else "FAIL"
        note = ""
        if r["stoker_cpu_only_gbps"] < r["pinned_gbps"]:
            note = " (the CPU-only loader is below the bound: the CPU limits this size)"
        print(f"h2d {r['batch_mib']} MiB: stoker device=\"cuda\" {r['ratio_vs_pinned']:.2f}x the "
              f"pinned copy_ bound [target >= 0.9x] {verdict}{note}")
    return rows


# ---- train ---------------------------------------------------------------------------------------

def image_root(args):
    if args.data:
        return args.data
    try:
        from stoker.sample_data import default_sample_root, make_sample
        make_sample(default_sample_root())
        return os.path.join(default_sample_root(), "train")
    except Exception as e:  # scikit-image missing (the GPU machine), or no photos
        print(f"(built-in sample data unavailable: {type(e).__name__}: {e}; using synthetic "
              f"JPEGs)")
    return synthetic_jpegs(os.path.expanduser("~/.cache/stoker/bench-gpu-jpegs"),
                           200 if args.quick or args.cpu_smoke else 2000)


def synthetic_jpegs(root, count, classes=10):
    """500x375 JPEGs (quality 90) of smooth random structure plus noise: ~100 KB each, decoded
    at the cost of a photo of that size."""
    from PIL import Image
    done = os.path.join(root, f".complete-{count}")
    if os.path.exists(done):
        return root
    rng = np.random.default_rng(0)
    for i in range(count):
        d = os.path.join(root, f"class{i % classes:02d}")
        os.makedirs(d, exist_ok=True)
        coarse = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        img = Image.fromarray(coarse).resize((500, 375), Image.BICUBIC)
        pixels = np.asarray(img, dtype=np.int16) + rng.integers(-20, 21, (375, 500, 3))
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            os.path.join(d, f"{i:06d}.jpg"), quality=90)
    open(done, "w").close()
    return root


def make_model(bench, tiny=False):
    if tiny:
        model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(8), torch.nn.Flatten(),
                                    torch.nn.Linear(3 * 64, 10))
    else:
        try:
            import torchvision
            model = torchvision.models.resnet50()
        except ImportError:
            if not bench.smoke:
                raise
            model = torch.nn.Sequential(  # --cpu-smoke without torchvision: a small CNN
                torch.nn.Conv2d(3, 8, 7, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(), torch.nn.Linear(8, 10))
    model = model.to(bench.device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        x = x.to(bench.device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = y.to(bench.device, non_blocking=True)
        with torch.autocast(bench.device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def train_run(bench, step, batches, warmup, steps):
    """images/s, GPU idle fraction between steps, host fraction blocked in next()."""
    for _ in range(warmup):
        step(*next(batches))
    bench.sync()
    starts = [bench.event() for _ in range(steps)]
    ends = [bench.event() for _ in range(steps)]
    waited = 0.0
    images = 0
    t0 = time.perf_counter()
    for k in range(steps):
        w = time.perf_counter()
        x, y = next(batches)
        waited += time.perf_counter() - w
        starts[k].record()
        step(x, y)
        ends[k].record()
        images += len(y)
        del x, y
    bench.sync()
    wall = time.perf_counter() - t0
    total_ms = starts[0].elapsed_time(ends[-1])
    idle_ms = sum(ends[k].elapsed_time(starts[k + 1]) for k in range(steps - 1))
    return {"images_per_s": images / wall, "gpu_idle_between_steps": idle_ms / total_ms,
            "host_wait_fraction": waited / wall, "steps": steps}


def cpu_rate(batches, count):
    """images/s of a loader alone (no model, no copy): what the CPU can feed."""
    next(batches)
    images, t0 = 0, time.perf_counter()
    for _ in range(count):
        x, y = next(batches)
        images += len(y)
    return images / (time.perf_counter() - t0)


def stoker_images(root, batch, device):
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    return stoker.DataLoader(stoker.ImageFolder(root, transform=transform), batch_size=batch,
                             shuffle=True, drop_last=True, device=device)


def torch_images(root, batch, workers, pin):
    import torchvision
    from torchvision import transforms as TV
    transform = TV.Compose([TV.RandomResizedCrop(224), TV.RandomHorizontalFlip(), TV.ToTensor(),
                            TV.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(root, transform=transform)
    kw = dict(persistent_workers=True, prefetch_factor=2) if workers else {}
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, drop_last=True,
                                       num_workers=workers, pin_memory=pin, **kw)


def have_torchvision():
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


def synthetic_batches(bench, batch):
    x = torch.randn(batch, 3, 224, 224, device=bench.device)
    y = torch.randint(0, 10, (batch,), device=bench.device)
    while True:
        yield x, y


def run_train(bench, args, root):
    batch = 4 if bench.smoke else args.batch_size
    warmup, steps = (2, 4) if bench.smoke else ((10, 40) if args.quick else (20, 200))
    sweep_batches = 3 if bench.smoke else (20 if args.quick else 60)
    cores = stoker.usable_cores()
    out = {"batch_size": batch, "steps": steps, "cores": cores}
    if not bench.smoke:
        torch.backends.cudnn.benchmark = True
    print(f"\n== train: ResNet-50 (channels_last, bf16 autocast, SGD), batch {batch}, "
          f"{warmup} warm-up + {steps} timed steps, {cores} cores, data {root}")

    step = make_model(bench)
    a = train_run(bench, step, synthetic_batches(bench, batch), warmup, steps)
    out["synthetic"] = a

    stoker_cpu = cpu_rate(epochs_of(stoker_images(root, batch, None)), sweep_batches)
    b = train_run(bench, step, epochs_of(stoker_images(root, batch, bench.loader_device)),
                  warmup, steps)
    out["stoker"] = dict(b, cpu_only_images_per_s=stoker_cpu)

    if have_torchvision():
        best, best_rate, sweep = 0, 0.0, {}
        for w in sorted({max(1, cores // 2), cores, min(2 * cores, 32)} if not bench.smoke
                        else {1}):
            rate = cpu_rate(epochs_of(torch_images(root, batch, w, False)), sweep_batches)
            sweep[w] = rate
            if rate > best_rate:
                best, best_rate = w, rate
        pin = not bench.smoke
        c = train_run(bench, step, epochs_of(torch_images(root, batch, best, pin)), warmup, steps)
        out["torch"] = dict(c, num_workers=best, cpu_only_images_per_s=best_rate,
                            cpu_sweep=sweep)
    else:
        print("(torchvision is not installed: side (c) skipped)")

    print(f"{'feed':<44} {'images/s':>9} {'GPU idle':>9} {'host wait':>10} {'CPU-only':>9}")
    rows = [("(a) synthetic, on the GPU (upper bound)", a, None),
            ('(b) stoker ImageFolder, device="cuda"', b, stoker_cpu)]
    if "torch" in out:
        rows.append((f"(c) torch DataLoader, pin_memory, {out['torch']['num_workers']} workers",
                     out["torch"], out["torch"]["cpu_only_images_per_s"]))
    for name, r, cpu in rows:
        cpu_s = f"{cpu:>9,.0f}" if cpu else f"{'-':>9}"
        print(f"{name:<44} {r['images_per_s']:>9,.0f} {r['gpu_idle_between_steps']:>8.1%} "
              f"{r['host_wait_fraction']:>9.1%} {cpu_s}")
    keeps_up = stoker_cpu >= a["images_per_s"]
    ratio_a = b["images_per_s"] / a["images_per_s"]
    if keeps_up:
        print(f"train: stoker {ratio_a:.3f}x the synthetic bound; the CPU keeps up "
              f"({stoker_cpu:,.0f} images/s CPU-only) [target >= 0.98x] "
              f"{'PASS' if ratio_a >= 0.98 else 'FAIL'}")
    elif "torch" in out:
        ratio_c = b["images_per_s"] / out["torch"]["images_per_s"]
        cpu_ratio = stoker_cpu / out["torch"]["cpu_only_images_per_s"]
        print(f"train: the CPU cannot keep up ({stoker_cpu:,.0f} images/s CPU-only < "
              f"{a['images_per_s']:,.0f}); stoker/torch {ratio_c:.2f}x on the GPU [target >= "
              f"{cpu_ratio:.2f}x, their CPU-only ratio] {'PASS' if ratio_c >= cpu_ratio else 'FAIL'}")
    out["stoker_vs_synthetic"] = ratio_a
    return out


# ---- diagnose ------------------------------------------------------------------------------------

def run_diagnose(bench, args, root):
    batch = 4 if bench.smoke else args.batch_size
    seconds = 1.0 if bench.smoke else (5.0 if args.quick else 10.0)
    out = {}
    print("\n== diagnose: stoker.diagnose with a real step")
    for name, tiny, want in (("ResNet-50 step", False, "compute-bound"),
                             ("tiny model step", True, "input-bound")):
        step = make_model(bench, tiny=tiny)
        loader = stoker_images(root, batch, bench.loader_device)
        report = stoker.diagnose(loader, lambda b: step(*b), seconds=seconds)
        f = report["figures"]
        gpu = (f"GPU {f['gpu_utilization']:.0%} busy over {f['gpu_samples']} NVML readings"
               if f["gpu_present"] else "no NVML figures")
        verdict = "PASS" if report.verdict == want else "FAIL"
        print(f"{name}: {report.verdict} (wait {report['wait_fraction']:.0%}, {gpu}) "
              f"[expected {want}] {verdict}")
        print("  " + report.summary().replace("\n", "\n  "))
        out[name] = {"verdict": report.verdict, "expected": want,
                     "wait_fraction": report["wait_fraction"],
                     "gpu_utilization": f["gpu_utilization"], "gpu_present": f["gpu_present"]}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short run: one size, fewer steps")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="every code path on the CPU at tiny sizes (checks the script only)")
    p.add_argument("--sections", default="h2d,train,diagnose")
    p.add_argument("--data", help="an ImageFolder tree (default: sample data or synthetic)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--json", help="write every figure to this file")
    args = p.parse_args()
    bench = Bench(args.cpu_smoke)
    sections = set(args.sections.split(","))
    name = torch.cuda.get_device_name(bench.device) if not bench.smoke else "CPU (smoke run)"
    print(f"stoker {stoker.__version__}, torch {torch.__version__}, python "
          f"{sys.version.split()[0]}; device {name}; {stoker.usable_cores()} usable cores")
    results = {"device": name, "cpu_smoke": bench.smoke}
    if "h2d" in sections:
        results["h2d"] = run_h2d(bench, args)
    root = image_root(args) if sections & {"train", "diagnose"} else None
    if "train" in sections:
        results["train"] = run_train(bench, args, root)
    if "diagnose" in sections:
        results["diagnose"] = run_diagnose(bench, args, root)
    if args.json:
        write_json(args.json, results)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
