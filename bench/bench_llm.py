#!/usr/bin/env python3
"""LLM corpora: Stoker's packing, mixtures and Megatron reader against the peers, side by side in
one run (issue 25).

Data, made once in bench/data/llm/ (git-ignored):
* docs: 12M uint16 tokens in documents of log-normal length (median 600 tokens, sigma 1: about
  2.7% are longer than seq_len = 4096), written as a Megatron-LM indexed dataset (docs.bin +
  docs.idx) by megatron-core's own IndexedDatasetBuilder (in the peer environment), so that
  Stoker reads what Megatron writes.
* mix-{0,1,2}.bin: three raw uint16 token files of 16M tokens each.

Packing (seq_len 4096, every document of the corpus once, shuffled):
* stoker-best_fit, stoker-document: ``TokenDataset(docs, pack=...)`` in ``stoker.DataLoader``
  (batch 8, workers "auto"): sequences/s over an epoch, and the padding fraction.
* grain-first_fit:<bins>, grain-best_fit:<bins>: Grain's ``FirstFitPackIterDataset`` /
  ``BestFitPackIterDataset`` over a ``MapDataset`` of the same documents (read from the same
  files, split into pieces of at most 4096 tokens as Stoker splits them: Grain would drop what
  does not fit), shuffled, num_packing_bins = <bins>.
* python-greedy: a first-fit packer in plain Python (a list of open sequences).
Targets: Stoker's best_fit padding <= Grain's best-fit; sequences/s >= 10x Grain's.

Mixture (batch 32 x 4096, weights 0.5 / 0.3 / 0.2, shuffled):
* stoker-single: ``TokenDataset([mix-0.bin, mix-1.bin, mix-2.bin], seq_len=4096)``, one corpus
  of the same bytes (one 32 MB file alone would sit in the CPU's last-level cache: a third of
  the memory traffic); stoker-mixture: ``stoker.Mixture`` of the three files, a TokenDataset
  each. Target: mixture >= 0.9x single.
* grain-mix: Grain's ``MapDataset.mix`` of three MapDatasets of windows (np.memmap), batched.
* litdata-combined: LitData's ``CombinedStreamingDataset`` of three ``StreamingDataset``s
  (``TokensLoader``, block 4097) optimized from the same files, in its StreamingDataLoader.

Timed runs (mixture, Megatron) take at least 1,500 batches and 3 s after 3 batches of warm-up,
in rounds whose runs are interleaved; the median of --repeat rounds is shown.

Megatron (concat windows of 4096 + 1 over docs.bin, batch 32, shuffled):
* stoker-megatron: ``TokenDataset(docs)``.
* megatron-torch:<w>: torch's DataLoader at w workers over a map-style dataset whose windows are
  read with megatron-core's ``IndexedDataset.get`` (as its GPTDataset does, document by
  document), default collate.

Each measurement runs in a fresh process; peers run in .venv-peers/llm (bench/setup_peers.sh).

    python bench/bench_llm.py [--only packing,mixture,megatron] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from harness import PEERS, REPO as ROOT, run_measured

HERE = os.path.abspath(__file__)
DATA = ROOT / "bench" / "data" / "llm"
PEER_PY = PEERS / "llm" / "bin" / "python"
SEQ_LEN = 4096
VOCAB = 50257
MIX_WEIGHTS = (0.5, 0.3, 0.2)


# ---------------------------------------------------------------------------------------------
# Data


def doc_lengths(total_tokens, seed=0):
    """Log-normal document lengths (median 600, sigma 1) summing to about ``total_tokens``."""
    rng = np.random.default_rng(seed)
    lengths = []
    have = 0
    while have < total_tokens:
        n = max(1, int(rng.lognormal(np.log(600), 1.0)))
        lengths.append(n)
        have += n
    return np.array(lengths, np.int64)


def make_data(quick):
    DATA.mkdir(parents=True, exist_ok=True)
    scale = 8 if quick else 1
    tag = "quick-" if quick else ""
    prefix = DATA / f"{tag}docs"
    if not (Path(f"{prefix}.bin").exists() and Path(f"{prefix}.idx").exists()):
        lengths = doc_lengths(12_000_000 // scale)
        np.save(DATA / f"{tag}lengths.npy", lengths)
        subprocess.run([str(PEER_PY), HERE, "--child", "write-megatron",
                        "--args", json.dumps({"prefix": str(prefix),
                                              "lengths": str(DATA / f"{tag}lengths.npy")})],
                       check=True)
    mix = []
    for i in range(3):
        path = DATA / f"{tag}mix-{i}.bin"
        if not path.exists():
            rng = np.random.default_rng(10 + i)
            rng.integers(0, VOCAB, 16_000_000 // scale, dtype=np.uint16).tofile(path)
        mix.append(str(path))
    return str(prefix), mix


def write_megatron(prefix, lengths):
    """Child (peer environment): the corpus written by megatron-core's IndexedDatasetBuilder."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    lengths = np.load(lengths)
    rng = np.random.default_rng(1)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for n in lengths:
        tokens = rng.integers(0, VOCAB, int(n), dtype=np.int64)
        builder.add_document(torch.from_numpy(tokens), [int(n)])
    builder.finalize(prefix + ".idx")
    return {"documents": len(lengths), "tokens": int(lengths.sum())}


class MegatronDocs:
    """The corpus's documents read with NumPy from the .idx arrays (the peers' common source)."""

    def __init__(self, prefix):
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        self.ds = IndexedDataset(prefix)
        self.lengths = self.ds.sequence_lengths  # one sequence a document here

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, d):
        return self.ds.get(int(d)).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Packing


def stoker_pack(prefix, mode, batches=None):
    import stoker
    ds = stoker.TokenDataset(prefix, seq_len=SEQ_LEN, pack=mode)
    loader = stoker.DataLoader(ds, batch_size=8, shuffle=True, seed=0, output="numpy")
    start = time.perf_counter()
    seqs = 0
    for i, batch in enumerate(loader):
        seqs += len(batch["input_ids"])
        if batches is not None and i + 1 >= batches:
            break
    seconds = time.perf_counter() - start
    return {"sequences": seqs, "seconds": seconds, "padding": ds.padding_fraction}


def pieces(docs):
    """Each document split into pieces of at most SEQ_LEN tokens (as Stoker splits them)."""
    for d in range(len(docs)):
        tokens = docs[d]
        for at in range(0, len(tokens), SEQ_LEN):
            yield tokens[at:at + SEQ_LEN]


def grain_pack(prefix, kind, bins):
    import grain
    import grain.experimental as ge
    docs = MegatronDocs(prefix)
    split = [p for p in pieces(docs)]  # in memory: Grain's MapDataset reads it by index

    class Pieces:
        def __len__(self):
            return len(split)

        def __getitem__(self, i):
            return {"inputs": split[i]}

    ds = grain.MapDataset.source(Pieces()).shuffle(seed=0).to_iter_dataset()
    packer = ge.FirstFitPackIterDataset if kind == "first_fit" else ge.BestFitPackIterDataset
    packed = packer(ds, length_struct={"inputs": SEQ_LEN}, num_packing_bins=bins,
                    shuffle_bins=False)
    start = time.perf_counter()
    seqs = real = 0
    for seq in packed:
        seqs += 1
        real += int((seq["inputs_segment_ids"] > 0).sum())
    seconds = time.perf_counter() - start
    return {"sequences": seqs, "seconds": seconds, "padding": 1 - real / (seqs * SEQ_LEN)}


def python_greedy(prefix):
    docs = MegatronDocs(prefix)
    order = np.random.default_rng(0).permutation(len(docs))
    start = time.perf_counter()
    open_bins = []  # [used, [pieces]]
    seqs = real = 0

    def emit(b):
        nonlocal seqs, real
        out = np.zeros(SEQ_LEN, np.int64)
        at = 0
        for p in b[1]:
            out[at:at + len(p)] = p
            at += len(p)
        seqs += 1
        real += at

    for d in order:
        tokens = docs[d]
        for at in range(0, len(tokens), SEQ_LEN):
            p = tokens[at:at + SEQ_LEN]
            for b in open_bins:
                if b[0] + len(p) <= SEQ_LEN:
                    b[0] += len(p)
                    b[1].append(p)
                    break
            else:
                open_bins.append([len(p), [p]])
            if len(open_bins) > 64:  # a bounded window of open sequences, as Grain's bins
                emit(open_bins.pop(0))
    for b in open_bins:
        emit(b)
    seconds = time.perf_counter() - start
    return {"sequences": seqs, "seconds": seconds, "padding": 1 - real / (seqs * SEQ_LEN)}


# ---------------------------------------------------------------------------------------------
# Mixture


def stoker_tokens(paths, batches, mixture):
    import stoker
    if mixture:
        ds = stoker.Mixture({f"s{i}": stoker.TokenDataset(p, seq_len=SEQ_LEN)
                             for i, p in enumerate(paths)},
                            weights={f"s{i}": w for i, w in enumerate(MIX_WEIGHTS)})
    else:  # the same three files as one corpus: the same bytes to read
        ds = stoker.TokenDataset(paths, seq_len=SEQ_LEN)
    loader = stoker.DataLoader(ds, batch_size=32, shuffle=True, seed=0, output="numpy")
    return time_batches(loader, batches, lambda b: b[0])


def _epochs(loader):
    epoch = 0
    while True:  # epochs one after another, as training runs them
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def time_batches(loader, batches, inputs, warmup=3, min_seconds=3.0):
    """Tokens and seconds of at least ``batches`` batches and at least ``min_seconds``, after
    ``warmup`` batches."""
    it = _epochs(loader)
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    tokens = done = 0
    while done < batches or time.perf_counter() - start < min_seconds:
        x = inputs(next(it))
        tokens += x.shape[0] * x.shape[1]
        done += 1
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds}


def grain_mix(paths, batches):
    import grain

    class Windows:
        def __init__(self, path):
            self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
            self.n = (len(self.tokens) - 1) // SEQ_LEN

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            w = self.tokens[i * SEQ_LEN:i * SEQ_LEN + SEQ_LEN + 1].astype(np.int64)
            return w[:-1], w[1:]

    sources = [grain.MapDataset.source(Windows(p)).shuffle(seed=i).repeat()
               for i, p in enumerate(paths)]
    mixed = grain.MapDataset.mix(sources, list(MIX_WEIGHTS)).batch(32)
    loader = mixed.to_iter_dataset(grain.ReadOptions(num_threads=os.cpu_count(),
                                                     prefetch_buffer_size=8))
    return time_batches(loader, batches, lambda b: b[0])


def litdata_combined(paths, batches):
    import litdata as ld
    from litdata.streaming.item_loader import TokensLoader
    datasets = []
    for i, path in enumerate(paths):
        out = DATA / f"litdata-{Path(path).stem}"
        if not (out / "index.json").exists():
            tokens = np.memmap(path, dtype=np.uint16, mode="r")
            chunks = [(path, a, min(a + (1 << 20), len(tokens))) for a in
                      range(0, len(tokens), 1 << 20)]
            ld.optimize(fn=_litdata_chunk, inputs=chunks, output_dir=str(out),
                        chunk_size=(SEQ_LEN + 1) * 512, item_loader=TokensLoader(),
                        num_workers=1, mode="overwrite")
        datasets.append(ld.StreamingDataset(str(out), item_loader=TokensLoader(
            block_size=SEQ_LEN + 1), shuffle=True, seed=i))
    combined = ld.CombinedStreamingDataset(datasets, weights=list(MIX_WEIGHTS), seed=0,
                                           iterate_over_all=False)
    loader = ld.StreamingDataLoader(combined, batch_size=32, num_workers=os.cpu_count(),
                                    collate_fn=_stack_long)
    return time_batches(loader, batches, lambda b: b[:, :-1])


def _stack_long(rows):
    import torch
    return torch.stack(rows).long()


def _litdata_chunk(spec):
    import torch
    path, a, b = spec
    yield torch.from_numpy(np.memmap(path, dtype=np.uint16, mode="r")[a:b].astype(np.int32))


# ---------------------------------------------------------------------------------------------
# Megatron windows


def stoker_megatron(prefix, batches):
    import stoker
    loader = stoker.DataLoader(stoker.TokenDataset(prefix, seq_len=SEQ_LEN), batch_size=32,
                               shuffle=True, seed=0, output="numpy")
    return time_batches(loader, batches, lambda b: b[0])


class MegatronWindows:
    """Window i = tokens [i*L, i*L + L + 1) of the documents one after the other, read with
    megatron-core's IndexedDataset.get, document by document (as its GPTDataset reads)."""

    def __init__(self, prefix):
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        self.prefix = prefix
        self.ds = None
        index = IndexedDataset(prefix)  # kept while its mapped arrays are read
        lengths = index.sequence_lengths.astype(np.int64)
        del index
        self.starts = np.concatenate([[0], np.cumsum(lengths)])
        self.n = (int(self.starts[-1]) - 1) // SEQ_LEN

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        from megatron.core.datasets.indexed_dataset import IndexedDataset
        if self.ds is None:
            self.ds = IndexedDataset(self.prefix)  # per worker process
        at, end = i * SEQ_LEN, i * SEQ_LEN + SEQ_LEN + 1
        d = int(np.searchsorted(self.starts, at, side="right")) - 1
        parts = []
        while at < end:
            offset = at - int(self.starts[d])
            take = min(end - at, int(self.starts[d + 1]) - at)
            parts.append(self.ds.get(d, offset=offset, length=take))
            at += take
            d += 1
        w = torch.from_numpy(np.concatenate(parts).astype(np.int64))
        return w[:-1], w[1:]


def megatron_torch(prefix, batches, workers):
    import torch
    loader = torch.utils.data.DataLoader(MegatronWindows(prefix), batch_size=32, shuffle=True,
                                         num_workers=workers,
                                         persistent_workers=workers > 0)
    return time_batches(loader, batches, lambda b: b[0])


# ---------------------------------------------------------------------------------------------
# Driver

CHILDREN = {
    "write-megatron": write_megatron,
    "stoker-pack": stoker_pack,
    "grain-pack": grain_pack,
    "python-greedy": python_greedy,
    "stoker-tokens": stoker_tokens,
    "grain-mix": grain_mix,
    "litdata-combined": litdata_combined,
    "stoker-megatron": stoker_megatron,
    "megatron-torch": megatron_torch,
}
PEER_CHILDREN = {"write-megatron", "grain-pack", "python-greedy", "grain-mix",
                 "litdata-combined", "megatron-torch"}


def measure(child, **kwargs):
    python = str(PEER_PY) if child in PEER_CHILDREN else sys.executable
    cmd = [python, HERE, "--child", child, "--args", json.dumps(kwargs)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        return run_measured(cmd, env=env, timeout=1800)
    except RuntimeError as e:
        print(f"  {child}: {e}", flush=True)
        return None


def packing(prefix, quick):
    print(f"\n## Packing (seq_len {SEQ_LEN}, one epoch of every document, shuffled)\n")
    print("| packer | sequences/s | padding | peak RSS |")
    print("|---|---:|---:|---:|")
    rows = {}
    runs = [("stoker-best_fit", "stoker-pack", {"mode": "best_fit"}),
            ("stoker-document", "stoker-pack", {"mode": "document"})]
    for bins in (8, 64):
        runs += [(f"grain-first_fit:{bins}", "grain-pack", {"kind": "first_fit", "bins": bins}),
                 (f"grain-best_fit:{bins}", "grain-pack", {"kind": "best_fit", "bins": bins})]
    runs.append(("python-greedy", "python-greedy", {}))
    for label, child, kwargs in runs:
        r = measure(child, prefix=prefix, **kwargs)
        if r is None:
            continue
        rate = r["sequences"] / r["seconds"]
        rows[label] = (rate, r["padding"])
        print(f"| {label} | {rate:,.0f} | {r['padding']:.2%} | "
              f"{r['peak_rss'] / 2**20:,.0f} MiB |", flush=True)
    grain = {k: v for k, v in rows.items() if k.startswith("grain-best_fit")}
    if "stoker-best_fit" in rows and grain:
        best_pad = min(p for _, p in grain.values())
        best_rate = max(r for r, _ in grain.values())
        rate, pad = rows["stoker-best_fit"]
        print(f"\nstoker best_fit: padding {pad:.2%} vs Grain best-fit's best {best_pad:.2%} "
              f"(target <=); {rate / best_rate:.1f}x Grain best-fit's fastest (target >= 10x)")
    return rows


def rates_of(runs, repeat, **common):
    """Tokens/s of each run (label, child, kwargs): the median of ``repeat`` rounds, the runs
    interleaved within a round; and each run's largest peak RSS."""
    rates, rss = {}, {}
    for _ in range(repeat):
        for label, child, kwargs in runs:
            r = measure(child, **common, **kwargs)
            if r is None:
                continue
            rates.setdefault(label, []).append(r["tokens"] / r["seconds"])
            rss[label] = max(rss.get(label, 0), r["peak_rss"])
    return {k: sorted(v)[len(v) // 2] for k, v in rates.items()}, rss


def mixture(paths, quick, repeat):
    batches = 40 if quick else 1500
    print(f"\n## Mixture of 3 token files (batch 32 x {SEQ_LEN}, weights {MIX_WEIGHTS}, "
          f"{batches} batches, median of {repeat})\n")
    print("| loader | tokens/s | vs stoker-single | peak RSS |")
    print("|---|---:|---:|---:|")
    runs = [("stoker-single", "stoker-tokens", {"mixture": False}),
            ("stoker-mixture", "stoker-tokens", {"mixture": True}),
            ("grain-mix", "grain-mix", {}),
            ("litdata-combined", "litdata-combined", {})]
    rates, rss = rates_of(runs, repeat, paths=paths, batches=batches)
    base = rates.get("stoker-single")
    for label, rate in rates.items():
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(f"| {label} | {rate / 1e6:,.1f} M | {ratio} | {rss[label] / 2**20:,.0f} MiB |")
    return rates


def megatron(prefix, quick, repeat):
    batches = 40 if quick else 1500
    print(f"\n## Megatron .bin/.idx windows ({SEQ_LEN} + 1, batch 32, shuffled, {batches} "
          f"batches, median of {repeat})\n")
    print("| loader | tokens/s | stoker vs it | peak RSS |")
    print("|---|---:|---:|---:|")
    runs = [("stoker-megatron", "stoker-megatron", {})]
    runs += [(f"megatron-torch:{w}", "megatron-torch", {"workers": w}) for w in (0, 2)]
    rates, rss = rates_of(runs, repeat, prefix=prefix, batches=batches)
    ours = rates.get("stoker-megatron")
    for label, rate in rates.items():
        ratio = f"{ours / rate:.1f}x" if ours and label != "stoker-megatron" else "-"
        print(f"| {label} | {rate / 1e6:,.1f} M | {ratio} | {rss[label] / 2**20:,.0f} MiB |")
    return rates


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="packing,mixture,megatron")
    p.add_argument("--quick", action="store_true", help="an eighth of the data, few batches")
    p.add_argument("--repeat", type=int, default=3, help="rounds of the timed runs (median)")
    p.add_argument("--child")
    p.add_argument("--args")
    a = p.parse_args(argv)
    if a.child:
        result = CHILDREN[a.child](**json.loads(a.args))
        print(json.dumps(result))
        return 0
    if not PEER_PY.exists():
        print("bench_llm needs the peer environment: make bench-peers (bench/setup_peers.sh)")
        return 2
    prefix, paths = make_data(a.quick)
    print(f"cores: {os.cpu_count()}; corpus {prefix} (Megatron, written by megatron-core)")
    only = a.only.split(",")
    if "packing" in only:
        packing(prefix, a.quick)
    if "mixture" in only:
        mixture(paths, a.quick, a.repeat)
    if "megatron" in only:
        megatron(prefix, a.quick, a.repeat)
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.exit(main())
    import record
    sys.exit(record.run(main))
