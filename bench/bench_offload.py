"""Offloading the input pipeline to Ray actors (stoker.RayOffload) against local threads.

One invocation, one machine, a local Ray instance with as many CPUs as the machine's usable
cores, the same data (the built-in ImageNet-like sample data, page-cached) and the same cores:

(a) the JPEG pipeline (decode, RandomResizedCrop 224, flip, ToTensor, Normalize; batch 64,
    shuffled): images/s in steady state, and a batch's latency (a fresh iterator positioned at
    a random batch, threads or actors already running: the time to that batch), through local
    threads (num_workers = cores), 1 actor of all cores and one actor a core. Each number is
    the median of --repeats interleaved runs. A transport row moves batches of the same size
    with no work (an ArrayDataset of float32 [3, 224, 224] rows) to show what the hand-off
    alone costs a batch.
(b) the CPU time the training process itself spends per image: CPU time of this process, all
    its threads, per image delivered (local: it runs the pipeline; offload: it receives). Also
    shown: the actors' CPU per image and Ray's own processes' (raylet, GCS, ...). Target:
    offload <= 0.1x local.
(c) a paper model, from the measured per-image costs and transfer sizes: the actor cores and
    network bandwidth that a node with 8 H100s training ResNet-50 at ~3,000 images/s per GPU
    needs, for float32 batches (as here) and for uint8 ones (normalize on the GPU).

Run it when the machine is quiet: `python bench/bench_offload.py` (`--quick`: a smoke run).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import warnings

import numpy as np
import psutil

import stoker
from stoker import transforms as T
from stoker.sample_data import default_sample_root, make_sample

from harness import MEAN, STD, median_of, read_files, write_json  # bench/harness.py

BATCH = 64
GPUS, IMAGES_PER_GPU = 8, 3000  # the node of the paper model: 8 H100s, ResNet-50


def cpu_of(pids):
    """{pid: CPU seconds} of the processes still there."""
    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def cpu_since(before, pids):
    """CPU seconds the processes spent since ``before`` (cpu_of), those that came or went
    meanwhile included as far as they can be seen."""
    now = cpu_of(pids)
    return sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in now.items())


def ray_system_pids(exclude):
    """Ray's own processes (raylet, GCS, agents, idle workers): this process's descendants that
    are not actors of ours."""
    return [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in exclude]


def ray_get(refs):
    import ray
    return ray.get(refs)


def jpeg_dataset(root):
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    return stoker.ImageFolder(root, transform=transform)


def transport_dataset(n=256):
    """Rows of the pipeline's output size and no work: what moving a batch costs."""
    rng = np.random.default_rng(0)
    return stoker.ArrayDataset(rng.standard_normal((n, 3, 224, 224), dtype=np.float32),
                               np.arange(n, dtype=np.int64))


def make_loader(dataset, config, cores):
    kind, a = config
    kw = dict(batch_size=BATCH, shuffle=True, seed=0)
    if kind == "local":
        return stoker.DataLoader(dataset, num_workers=cores, **kw)
    return stoker.DataLoader(dataset, offload=stoker.RayOffload(
        actors=a, cpus_per_actor=cores // a), **kw)


def label(config, cores):
    kind, a = config
    if kind == "local":
        return f"local, {cores} threads"
    return f"offload, {a} actor{'s' if a > 1 else ''} x {cores // a} CPU"


def measure(dataset, config, cores, epochs, latency_samples):
    """Figures of one loader: cold first batch, steady images/s, CPU per image (this process,
    actors, Ray's processes), latency of a positioned batch."""
    t0 = time.perf_counter()
    loader = make_loader(dataset, config, cores)
    it = iter(loader)
    next(it)
    cold = time.perf_counter() - t0
    for _ in it:  # the rest of the warm-up epoch
        pass
    if config[0] == "offload":
        assert len(loader._producer._actors.ready) == config[1], "an actor did not start"
    actors = list(loader._producer._actors.pids.values()) if config[0] == "offload" else []
    system = ray_system_pids(set(actors))
    me0, act0, sys0 = time.process_time(), cpu_of(actors), cpu_of(system)
    t0, n = time.perf_counter(), 0
    for _ in range(epochs):
        for batch in loader:
            n += len(batch[1])
    wall = time.perf_counter() - t0
    me = time.process_time() - me0
    act, sys_ = cpu_since(act0, actors), cpu_since(sys0, ray_system_pids(set(actors)))
    # Latency: a fresh iterator positioned at a random batch; threads or actors already up.
    rng = random.Random(1)
    latencies = []
    for _ in range(latency_samples):
        state = loader.state_dict()
        state.update(epoch=0, batch=rng.randrange(len(loader) - 1), start=0)
        loader.load_state_dict(state)
        it = iter(loader)
        t = time.perf_counter()
        next(it)
        latencies.append(time.perf_counter() - t)
        del it  # local: joins its threads here, so the next sample starts idle; offload: ...
        if config[0] == "offload":  # ... wait until the actors are idle too
            ray_get([a.ready.remote() for a in loader._producer._actors.ready])
    stats = loader.stats()
    if config[0] == "offload":
        loader.shutdown()
    return {"images_per_s": n / wall, "ms_per_batch": 1e3 * wall * BATCH / n,
            "trainer_cpu_ms_per_image": 1e3 * me / n, "actor_cpu_ms_per_image": 1e3 * act / n,
            "ray_system_cpu_ms_per_image": 1e3 * sys_ / n,
            "latency_ms": 1e3 * statistics.median(latencies), "cold_first_batch_s": cold,
            "batch_bytes": stats.get("batch_bytes") or stats.get("batch_bytes_peak", 0)}


def paper_model(local, offload, jpeg_bytes, out_bytes):
    """Actor cores and bandwidth for GPUS x IMAGES_PER_GPU images/s, from measured costs."""
    rate = GPUS * IMAGES_PER_GPU
    actor_cpu = (offload["actor_cpu_ms_per_image"] + offload["ray_system_cpu_ms_per_image"]) / 1e3
    local_cpu = local["trainer_cpu_ms_per_image"] / 1e3
    float32 = out_bytes
    uint8 = out_bytes // 4
    return {
        "images_per_s": rate,
        "local_cores": rate * local_cpu,
        "actor_cores": rate * actor_cpu,
        "actor_cores_at_75pct": rate * actor_cpu / 0.75,
        "trainer_cores_receiving": rate * offload["trainer_cpu_ms_per_image"] / 1e3,
        "network_gbit_s_float32": rate * float32 * 8 / 1e9,
        "network_gbit_s_uint8": rate * uint8 * 8 / 1e9,
        "storage_read_gbit_s": rate * jpeg_bytes * 8 / 1e9,
        "bytes_per_image_float32": float32, "bytes_per_image_uint8": uint8,
        "jpeg_bytes_per_image": jpeg_bytes,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="write every figure to this file")
    args = p.parse_args()
    repeats = 1 if args.quick else args.repeats
    epochs = 1 if args.quick else 3
    latency_samples = 3 if args.quick else 15
    warnings.simplefilter("ignore")  # Ray's notices

    import ray
    cores = stoker.usable_cores()
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")  # a shared machine's memory
    ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False,
             configure_logging=False, object_store_memory=1 << 30)

    manifest = make_sample(default_sample_root())
    root = os.path.join(default_sample_root(), "train")
    images = jpeg_dataset(root)
    read_files(p for p, _ in images.samples)  # every loader reads from RAM
    files = manifest["files"]
    jpeg_bytes = files["bytes"]["mean"]
    print(f"stoker {stoker.__version__}, ray {ray.__version__}; {cores} usable cores; load "
          f"average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"data: {len(images)} JPEGs (mean {files['width']['mean']:.0f}x"
          f"{files['height']['mean']:.0f}, {jpeg_bytes / 1024:.0f} KB), batch {BATCH}, "
          f"a warm-up epoch then {epochs} timed epoch(s), {repeats} repeat(s), median shown")

    configs = [("local", 0), ("offload", 1)] + ([("offload", cores)] if cores > 1 else [])
    transport = transport_dataset()
    runs = {(w, c): [] for w in ("jpeg", "transport") for c in configs}
    for _ in range(repeats):
        for work, ds in (("jpeg", images), ("transport", transport)):
            for c in configs:
                runs[(work, c)].append(measure(ds, c, cores, epochs, latency_samples))
                print(".", end="", flush=True)
    print()
    res = {key: median_of(r) for key, r in runs.items()}

    head = (f"{'pipeline':<10} {'loader':<26} {'images/s':>9} {'(min-max)':>13} {'ms/batch':>9} "
            f"{'latency':>9} {'trainer CPU':>12} {'actors CPU':>11} {'Ray CPU':>9} "
            f"{'1st batch':>9}")
    print("\n" + head + "\n" + "-" * len(head))
    for (work, c), r in res.items():
        spread = f"{r['images_per_s_min']:,.0f}-{r['images_per_s_max']:,.0f}"
        print(f"{work:<10} {label(c, cores):<26} {r['images_per_s']:>9,.0f} {spread:>13} "
              f"{r['ms_per_batch']:>8.1f}  {r['latency_ms']:>6.1f}ms "
              f"{r['trainer_cpu_ms_per_image']:>8.3f}ms/i {r['actor_cpu_ms_per_image']:>7.3f}ms/i "
              f"{r['ray_system_cpu_ms_per_image']:>5.3f}ms/i {r['cold_first_batch_s']:>8.2f}s")

    local = res[("jpeg", ("local", 0))]
    print("\n(a) per-batch overhead of offloading, JPEG pipeline, against local threads:")
    for c in configs[1:]:
        r = res[("jpeg", c)]
        t = res[("transport", c)]
        print(f"  {label(c, cores):<26} throughput {r['images_per_s'] / local['images_per_s']:.2f}x"
              f" local; {r['ms_per_batch'] - local['ms_per_batch']:+.1f} ms a batch in steady "
              f"state; latency {r['latency_ms'] - local['latency_ms']:+.1f} ms; hand-off alone "
              f"(transport) {t['ms_per_batch']:.1f} ms a batch vs "
              f"{res[('transport', ('local', 0))]['ms_per_batch']:.1f} local")
    print("\n(b) CPU time the training process spends per image:")
    checks = []
    for c in configs[1:]:
        r = res[("jpeg", c)]
        ratio = r["trainer_cpu_ms_per_image"] / local["trainer_cpu_ms_per_image"]
        checks.append(ratio <= 0.1)
        print(f"  {label(c, cores):<26} {r['trainer_cpu_ms_per_image']:.3f} ms vs local "
              f"{local['trainer_cpu_ms_per_image']:.3f} ms: {ratio:.3f}x  [target <= 0.1x] "
              f"{'PASS' if ratio <= 0.1 else 'FAIL'}")

    best = max(configs[1:], key=lambda c: res[("jpeg", c)]["images_per_s"])
    out_bytes = 3 * 224 * 224 * 4
    model = paper_model(local, res[("jpeg", best)], jpeg_bytes, out_bytes)
    print(f"\n(c) paper model: {GPUS} H100s x {IMAGES_PER_GPU:,} images/s (ResNet-50) = "
          f"{model['images_per_s']:,} images/s, from this run's costs ({label(best, cores)}):")
    print(f"  local loading would need {model['local_cores']:,.0f} cores of the GPU node "
          f"({local['trainer_cpu_ms_per_image']:.2f} ms CPU an image)")
    r = res[("jpeg", best)]
    per_image = r["actor_cpu_ms_per_image"] + r["ray_system_cpu_ms_per_image"]
    print(f"  offload: {model['actor_cores']:,.0f} actor cores at full use, "
          f"{model['actor_cores_at_75pct']:,.0f} at 75% ({per_image:.2f} ms CPU an image, "
          f"Ray's processes included); the GPU node spends "
          f"{model['trainer_cores_receiving']:.1f} cores receiving")
    print(f"  network into the GPU node: {model['network_gbit_s_float32']:,.0f} Gbit/s for "
          f"float32 batches ({out_bytes / 1024:.0f} KiB an image), "
          f"{model['network_gbit_s_uint8']:,.0f} Gbit/s for uint8 (normalize on the GPU); "
          f"the actors read {model['storage_read_gbit_s']:,.1f} Gbit/s of JPEGs "
          f"({jpeg_bytes / 1024:.0f} KB each)")
    if args.json:
        write_json(args.json, {"results": {f"{w}:{c[0]}:{c[1]}": r for (w, c), r in res.items()},
                               "paper_model": model, "cores": cores})
    ray.shutdown()
    return 0 if all(checks) else 1


if __name__ == "__main__":
    import record  # bench/record.py: this output also goes to bench/results/
    sys.exit(record.run(main))
