"""GPU JPEG decode, measured on a GPU: images/s into CUDA batches, and the CPU each image costs.

RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize into a CUDA float32 batch
of 256 (--batch-size), on the same files, three ways side by side:

- stoker_gpu: ``ImageFolder(decode="cuda")`` + ``DataLoader(device="cuda")``: worker threads read
  and stage the files, nvJPEG (the hardware decoder where there is one) and Stoker's kernels do
  the rest on the GPU.
- stoker_cpu: ``ImageFolder()`` + ``DataLoader(device="cuda", num_workers=<all cores>)``: decode
  and augmentation on every core, batches copied to the GPU.
- torchvision_gpu: file bytes read by a thread pool, ``torchvision.io.decode_jpeg(list,
  device="cuda")`` (batched nvJPEG), then ``transforms.v2`` RandomResizedCrop (antialiased) and
  RandomHorizontalFlip per image on the GPU, stacked, ToDtype(float32, scale=True), Normalize.

For each: images/s (the GPU synchronized before the clock stops), the process's CPU time per
image and the cores busy on average (getrusage: user + system time over wall time).
Targets (issue 12): stoker_gpu >= 3x stoker_cpu and >= 1.5x torchvision_gpu.

Data: --data DIR (an ImageFolder tree), else Stoker's built-in sample data (needs scikit-image),
else synthetic 500x375 JPEGs (bench_gpu.py's).

  python bench/bench_gpu_decode.py --json gpu_decode.json   # on the GPU machine (~3 minutes)
  python bench/bench_gpu_decode.py --quick                  # fewer batches
  python bench/bench_gpu_decode.py --cpu-smoke              # no GPU: every path reachable on the
      # CPU (decode="cuda" staging and GPU stage emulated, the CPU path, torchvision on the CPU
      # when installed), tiny sizes; the figures mean nothing
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time

import torch

import stoker
from stoker.gpu import decode as gpu_decode
from stoker import transforms as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu import image_root  # noqa: E402
from harness import MEAN, STD, cpu_seconds, write_json  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import gpu_emulation  # noqa: E402  (the emulated GPU stage of --cpu-smoke: a test double)



def train_transform():
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


def measure(name, batches, count, warmup, sync):
    """Images/s over `count` batches after `warmup`, and CPU per image."""
    it = iter(batches)
    for _ in range(warmup):
        next(it)
    sync()
    # This process's CPU time: every pipeline here runs in it (threads, no worker processes).
    t0, c0, images = time.perf_counter(), cpu_seconds(children=False), 0
    for _ in range(count):
        x, _ = next(it)
        images += x.shape[0]
    sync()
    wall, cpu = time.perf_counter() - t0, cpu_seconds(children=False) - c0
    r = {"images_per_s": images / wall, "cpu_ms_per_image": 1000 * cpu / images,
         "cores_busy": cpu / wall, "images": images, "seconds": wall}
    print(f"  {name:16s} {r['images_per_s']:9.0f} img/s   {r['cpu_ms_per_image']:6.3f} CPU-ms/img"
          f"   {r['cores_busy']:5.1f} cores busy", flush=True)
    return r


def forever(make_epoch):
    """Batches across epochs (the clock runs over epoch boundaries too)."""
    epoch = 0
    while True:
        yield from make_epoch(epoch)
        epoch += 1


def stoker_gpu(root, args, device):
    if args.cpu_smoke:  # the decode="cuda" path with its GPU stage emulated on the CPU
        with gpu_emulation.emulation():
            ds = stoker.ImageFolder(root, transform=train_transform(), decode="cuda")
        loader = gpu_emulation.emulated_loader(ds, batch_size=args.batch_size, shuffle=True)
        return forever(lambda e: loader), loader
    ds = stoker.ImageFolder(root, transform=train_transform(), decode="cuda")
    loader = stoker.DataLoader(ds, batch_size=args.batch_size, shuffle=True, device=device)

    def epoch(e):
        loader.set_epoch(e)
        return loader
    return forever(epoch), loader


def stoker_cpu(root, args, device):
    ds = stoker.ImageFolder(root, transform=train_transform())
    loader = stoker.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                               num_workers=args.cores, device=device)

    def epoch(e):
        loader.set_epoch(e)
        return loader
    return forever(epoch), loader


def have_torchvision():
    try:
        import torchvision  # noqa: F401
        from torchvision.transforms import v2  # noqa: F401
    except ImportError:
        return False
    return True


def torchvision_gpu(root, args, device):
    """The peer: torchvision's batched GPU decode and its v2 transforms on the GPU."""
    import torchvision
    from torchvision.io import decode_jpeg, ImageReadMode
    from torchvision.transforms import v2

    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                   if f.lower().endswith((".jpg", ".jpeg")))
    dev = device if device is not None else torch.device("cpu")
    per_image = v2.Compose([v2.RandomResizedCrop(224, antialias=True),
                            v2.RandomHorizontalFlip()])
    finish = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    pool = concurrent.futures.ThreadPoolExecutor(min(16, args.cores))
    g = torch.Generator().manual_seed(0)

    def read(path):
        return torchvision.io.read_file(path)

    def epoch(e):
        order = torch.randperm(len(files), generator=g).tolist()
        chunks = [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]
        pending = pool.map(lambda c: list(map(read, (files[i] for i in c))), chunks)
        for data in pending:  # reading runs ahead on the pool while the GPU decodes
            images = decode_jpeg(data, mode=ImageReadMode.RGB, device=dev)
            x = torch.stack([per_image(im) for im in images])
            yield finish(x), torch.zeros(len(data), dtype=torch.int64, device=dev)
    return forever(epoch), None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="an ImageFolder tree (default: sample data or synthetic)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=60, help="batches timed per pipeline")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cores", type=int, default=os.cpu_count(),
                   help="worker threads of the CPU path (default: every core)")
    p.add_argument("--quick", action="store_true", help="fewer batches")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="no GPU: run every path reachable on the CPU, tiny sizes")
    p.add_argument("--json", help="write every figure to this file")
    args = p.parse_args()
    if args.quick:
        args.batches, args.warmup = 15, 3
    if args.cpu_smoke:
        args.batch_size, args.batches, args.warmup = 16, 3, 1
        device = None
        sync = lambda: None  # noqa: E731
        try:
            gpu_decode.require_gpu_decode()
        except RuntimeError as e:  # what a user without CUDA is told
            print(f"(no GPU decode here, as expected: {e})")
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_gpu_decode.py needs a CUDA GPU (or --cpu-smoke to check the script)")
        device = torch.device("cuda", torch.cuda.current_device())
        sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
        print("nvJPEG, NVRTC:", gpu_decode.require_gpu_decode())
    root = image_root(args)
    name = torch.cuda.get_device_name(device) if device is not None else "cpu (smoke)"
    print(f"{name}; data {root}; batch {args.batch_size}; {args.batches} batches timed; CPU path "
          f"on {args.cores} cores", flush=True)
    results = {"device": name, "cpu_smoke": args.cpu_smoke, "batch_size": args.batch_size,
               "cores": args.cores, "data": root}

    batches, loader = stoker_gpu(root, args, device)
    results["stoker_gpu"] = measure("stoker_gpu", batches, args.batches, args.warmup, sync)
    if loader is not None:
        s = loader.stats()
        results["stoker_gpu"]["gpu_decode"] = s.get("gpu_decode")
        results["stoker_gpu"]["gpu_memory_bytes"] = s.get("gpu_memory_bytes")
        print(f"    routes {s['gpu_decode']['routes']}, backend {s['gpu_decode']['backend']}, "
              f"decode calls {s['gpu_decode']['host_seconds']:.2f} s on the consumer thread")
    batches, _ = stoker_cpu(root, args, device)
    results["stoker_cpu"] = measure("stoker_cpu", batches, args.batches, args.warmup, sync)
    if have_torchvision():
        batches, _ = torchvision_gpu(root, args, device)
        results["torchvision_gpu"] = measure("torchvision_gpu", batches, args.batches,
                                             args.warmup, sync)
    else:
        print("  torchvision_gpu  skipped: torchvision is not installed")

    g = results["stoker_gpu"]["images_per_s"]
    ratios = {"gpu_vs_cpu": g / results["stoker_cpu"]["images_per_s"]}
    if "torchvision_gpu" in results:
        ratios["gpu_vs_torchvision"] = g / results["torchvision_gpu"]["images_per_s"]
    results["ratios"] = ratios
    print(f"stoker_gpu / stoker_cpu({args.cores} cores): {ratios['gpu_vs_cpu']:.2f}x "
          f"(target >= 3)")
    if "gpu_vs_torchvision" in ratios:
        print(f"stoker_gpu / torchvision_gpu: {ratios['gpu_vs_torchvision']:.2f}x (target >= 1.5)")
    if args.cpu_smoke:
        print("(--cpu-smoke: every path ran; the figures mean nothing)")
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
