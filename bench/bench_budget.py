#!/usr/bin/env python3
"""Batches by a token budget: stoker.Budget against the peers, side by side in one run (issue 47).

Every contender batches the same lengths under the same budget (16,384 tokens, a batch's cost
being its padded size B x longest):
* stoker-budget: ``stoker.Budget(tokens=16384).plan(lengths)``, then ``plan.epoch(seed, 0)``.
* hf-grouped:<B>: Hugging Face transformers' ``LengthGroupedSampler`` (random megabatches of 50 B,
  fewer for small sets, sorted by length) cut into batches of B, as the Trainer uses it with ``group_by_length``. It
  has no budget: B is either budget // longest (its largest batch fits the budget) or budget //
  mean length (the same mean tokens a batch as a budget's batch).
* lhotse-dynamic: Lhotse's ``DynamicBucketingSampler(max_duration=budget, shuffle=True,
  drop_last=True)`` over cuts whose duration is the length (no audio; .venv-peers/budget, made
  by bench/setup_peers.sh). Its budget is the sum of the lengths, not the padded size.
* fixed-random:<B>: torch's RandomSampler in batches of B (the same two B), the baseline.

Lengths: (1) log-normal (median 400 tokens, sigma 1.2, like SFT data) clipped to 16-8192, seed
0; (2) measured: Python's standard library (this interpreter's), one document per function or
class definition (at any depth; a module's preamble is one more), tokenized by a byte-level BPE
of 32,000 tokens that the ``tokenizers`` package trains on those same sources (no pretrained
vocabulary is on this machine, and none is downloaded); a document's length counts its EOS (as
TokenDataset splits them); those under 16 are dropped, longer ones truncated at 8192. Made once
in bench/data/budget/ (git-ignored).

Figures (each contender in a fresh process), over 200,000 log-normal lengths (a whole Lhotse
pass takes ~10 s a 100,000 cuts here, nine passes a set) and over the corpus's:
* padding: the share of the batches' padded tokens that are padding, one rank, one epoch; with
  the largest batch's padded size against the budget, and the samples an epoch leaves out.
* plan: the time to the first batch for --samples log-normal lengths (5,000,000): Stoker's
  ``plan`` + ``epoch``; HF's sampler built, ``iter`` + ``next`` (which orders the whole epoch);
  Lhotse's sampler over cuts made lazily as it reads them (it streams: its first batch needs
  only its buffers), and a whole pass, timed over the figures' N and scaled linearly to
  --samples (said so in the table).
* ranks: the batches of each of 8 simulated ranks: Stoker's ``plan.epoch(..., rank=r,
  world_size=8)``; Lhotse's ``rank``/``world_size``; HF: the Trainer's accelerate shards the
  sampler's batches round-robin (rank r takes batches r, r+8, ...; ``even_batches`` then repeats
  batches to even the counts: the counts shown are before that); fixed-random: torch's
  DistributedSampler, then batches of B. Cost spread: at each step, (max - min) / max of the 8
  ranks' padded batch sizes; the mean and the largest over the steps.
* samples/s end to end over the measured corpus written as one uint16 token file (documents
  ended by EOS): Stoker's DataLoader over ``TokenDataset(pack=None, eos=EOS)`` with the budget
  (workers "auto"), against torch's DataLoader + LengthGroupedSampler (B = budget // mean
  length) + a padding collate (input_ids, labels, attention_mask, lengths) over a Python dataset
  reading the same file with np.memmap, at its best of 0, 1, 2 workers. Median of --repeat.
Targets: padding <= 5%; plan for 5M <= 10 s; equal steps on 8 ranks; cost spread <= 5%;
samples/s >= the best peer. Ratios are the figures; absolute times depend on the machine.

    python bench/bench_budget.py [--quick] [--samples N] [--repeat 3] [--json PATH]
                                 [--only lognormal,corpus,plan,e2e]

Peers' environment: bash bench/setup_peers.sh budget (Lhotse; without it Lhotse is skipped).
HF's sampler and torch's run in .venv (transformers is installed there)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from harness import emit, machine_line, peer_python, run_measured, write_json

HERE = os.path.abspath(__file__)
DATA = Path(__file__).resolve().parent / "data" / "budget"
BUDGET = 16384
MIN_LEN, MAX_LEN = 16, 8192
WORLD = 8
VOCAB = 32000
EOS = 0  # the BPE's one special token, "<|endoftext|>"
PAD = EOS
FIGURE_SAMPLES = 200_000  # log-normal lengths for the padding, ranks and spread figures
TARGETS = {"padding": 0.05, "plan_s": 10.0, "spread": 0.05}


# --- lengths --------------------------------------------------------------------------------

def lognormal_lengths(n, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(400), 1.2, n), MIN_LEN, MAX_LEN).astype(np.int64)


_DEF = re.compile(r"^(?=[ \t]*(?:@|async[ \t]+def[ \t]|def[ \t]|class[ \t]))", re.M)


def stdlib_documents(every=1):
    """The standard library's sources, one document per definition (decorators kept with it)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)[::every]
    docs = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        carry = ""
        for part in _DEF.split(text):
            if part.lstrip().startswith("@") and not re.search(
                    r"^[ \t]*(async[ \t]+def|def|class)[ \t]", part, re.M):
                carry += part  # a decorator: it belongs to the definition after it
                continue
            if (carry + part).strip():
                docs.append(carry + part)
            carry = ""
    return docs, len(files)


def make_corpus(quick):
    """The measured corpus as one uint16 token file, each document ended by EOS, and its
    documents' lengths, EOS included (TokenDataset keeps it as its document's last); made once."""
    tag = "quick-" if quick else ""
    path, lengths_path = DATA / f"{tag}stdlib.bin", DATA / f"{tag}stdlib-lengths.npy"
    info_path = DATA / f"{tag}stdlib.json"  # written last: the corpus is whole when it exists
    if info_path.exists():
        return path, np.load(lengths_path), json.loads(info_path.read_text())
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    t0 = time.perf_counter()
    docs, files = stdlib_documents(every=8 if quick else 1)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    pieces, lengths = [], []
    for enc in tok.encode_batch(docs):
        ids = np.asarray(enc.ids, np.uint16)
        ids = ids[ids != EOS][:MAX_LEN - 1]  # the text "<|endoftext|>" would encode as EOS
        if len(ids) + 1 >= MIN_LEN:
            pieces += [ids, np.array([EOS], np.uint16)]
            lengths.append(len(ids) + 1)
    DATA.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    np.concatenate(pieces).tofile(tmp)
    os.replace(tmp, path)
    lengths = np.array(lengths, np.int64)
    np.save(lengths_path, lengths)
    info = {"files": files, "definitions": len(docs), "documents": len(lengths),
            "tokens": int(lengths.sum()), "seconds": time.perf_counter() - t0}
    info_path.write_text(json.dumps(info))
    return path, lengths, info


# --- figures of a set of batches (the same code for every contender) ------------------------

def batch_costs(lengths, batches):
    """(real tokens, padded tokens) of each batch (index arrays)."""
    if not batches:
        return np.zeros(0), np.zeros(0)
    sizes = np.array([len(b) for b in batches])
    flat = lengths[np.concatenate(batches).astype(np.int64)]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    real = np.add.reduceat(flat, starts)
    padded = np.maximum.reduceat(flat, starts) * sizes
    return real.astype(np.float64), padded.astype(np.float64)


def one_rank_figures(lengths, batches):
    real, padded = batch_costs(lengths, batches)
    covered = len(np.unique(np.concatenate(batches))) if batches else 0
    return {"batches": len(batches), "padding": 1 - real.sum() / padded.sum(),
            "largest_vs_budget": padded.max() / BUDGET, "mean_real_tokens": real.mean(),
            "left_out": 1 - covered / len(lengths)}


def rank_figures(lengths, per_rank):
    """Steps of each rank and the per-step cost spread across ranks."""
    steps = [len(b) for b in per_rank]
    common = min(steps)
    costs = np.array([batch_costs(lengths, b[:common])[1] for b in per_rank])  # [rank, step]
    spread = (costs.max(0) - costs.min(0)) / costs.max(0) if common else np.zeros(1)
    return {"steps": steps, "spread_mean": float(spread.mean()), "spread_max": float(spread.max())}


def batches_of(order, size, drop_last=False):
    order = np.asarray(order)
    n = len(order) - len(order) % size if drop_last else len(order)
    return [order[i:i + size] for i in range(0, n, size)]


# --- contenders (measurement children) ------------------------------------------------------

def stoker_plan(lengths_path, ranks=True):
    import stoker
    lengths = np.load(lengths_path)
    t0 = time.perf_counter()
    plan = stoker.Budget(tokens=BUDGET).plan(lengths)
    ep = plan.epoch(0, 0)
    first = ep.batch(0)
    out = {"plan_s": time.perf_counter() - t0, "first_batch": len(first)}
    if ranks:
        out |= one_rank_figures(lengths, [ep.batch(i) for i in range(ep.num_batches)])
        out["native_padding"] = 1 - ep.real_length / ep.padded_length
        per_rank = []
        for r in range(WORLD):
            e = plan.epoch(0, 0, rank=r, world_size=WORLD)
            per_rank.append([e.batch(i) for i in range(e.num_batches)])
        out |= rank_figures(lengths, per_rank)
        e = plan.epoch(0, 0, rank=0, world_size=WORLD)
        out["native_spread_mean"], out["native_spread_max"] = (e.mean_cost_spread,
                                                               e.max_cost_spread)
    return out


def hf_plan(lengths_path, batch_size, ranks=True):
    import torch
    from torch.utils.data import BatchSampler
    from transformers.trainer_pt_utils import LengthGroupedSampler
    lengths = np.load(lengths_path)
    as_list = lengths.tolist()  # what a datasets column gives it; not timed
    t0 = time.perf_counter()
    sampler = LengthGroupedSampler(batch_size, lengths=as_list,
                                   generator=torch.Generator().manual_seed(0))
    it = iter(BatchSampler(sampler, batch_size, drop_last=False))
    first = next(it)
    out = {"plan_s": time.perf_counter() - t0, "first_batch": len(first)}
    if ranks:
        batches = [np.asarray(first)] + [np.asarray(b) for b in it]
        out |= one_rank_figures(lengths, batches)
        out |= rank_figures(lengths, [batches[r::WORLD] for r in range(WORLD)])
    return out


def fixed_plan(lengths_path, batch_size, ranks=True):
    import torch
    from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler
    lengths = np.load(lengths_path)
    t0 = time.perf_counter()
    it = iter(BatchSampler(RandomSampler(range(len(lengths)),
                                         generator=torch.Generator().manual_seed(0)),
                           batch_size, drop_last=False))
    first = next(it)
    out = {"plan_s": time.perf_counter() - t0, "first_batch": len(first)}
    if ranks:
        out |= one_rank_figures(lengths, [np.asarray(first)] + [np.asarray(b) for b in it])
        per_rank = []
        for r in range(WORLD):
            ds = DistributedSampler(range(len(lengths)), num_replicas=WORLD, rank=r, seed=0)
            per_rank.append(batches_of(list(ds), batch_size))
        out |= rank_figures(lengths, per_rank)
    return out


class _LazyCuts:
    """Cuts made as Lhotse reads them (a lazy CutSet: iterable again for every pass)."""

    def __init__(self, lengths):
        self.lengths = lengths

    def __iter__(self):
        from lhotse import MonoCut
        for i, n in enumerate(self.lengths.tolist()):
            yield MonoCut(id=str(i), start=0.0, duration=float(n), channel=0)


def _lhotse_sampler(lengths, rank=0, world_size=1):
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler
    sampler = DynamicBucketingSampler(CutSet(_LazyCuts(lengths)), max_duration=BUDGET,
                                      shuffle=True, drop_last=True, seed=0, rank=rank,
                                      world_size=world_size)
    sampler.set_epoch(0)
    return sampler


def lhotse_plan(lengths_path, ranks=True):
    lengths = np.load(lengths_path)
    t0 = time.perf_counter()
    it = iter(_lhotse_sampler(lengths))
    first = next(it)
    out = {"plan_s": time.perf_counter() - t0, "first_batch": len(first)}
    if ranks:
        batches = [np.array([int(c.id) for c in first])]
        batches += [np.array([int(c.id) for c in b]) for b in it]
        out["pass_s"] = time.perf_counter() - t0
        out |= one_rank_figures(lengths, batches)
        per_rank = [[np.array([int(c.id) for c in b]) for b in _lhotse_sampler(lengths, r, WORLD)]
                    for r in range(WORLD)]
        out |= rank_figures(lengths, per_rank)
    return out


# --- end to end -----------------------------------------------------------------------------

def _timed(loader, min_seconds, min_batches, warmup=3):
    """Samples/s of at least ``min_batches`` batches and ``min_seconds`` after ``warmup``
    batches, epochs one after another; and the padding share of the tokens they carried."""
    def epochs():
        epoch = 0
        while True:
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            yield from loader
            epoch += 1
    it = epochs()
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    samples = done = real = padded = 0
    while done < min_batches or time.perf_counter() - t0 < min_seconds:
        batch = next(it)
        ids = batch["input_ids"]
        samples += len(ids)
        real += int(batch["lengths"].sum())
        padded += ids.shape[0] * ids.shape[1]
        done += 1
    return {"samples": samples, "seconds": time.perf_counter() - t0, "batches": done,
            "padding": 1 - real / padded, "mean_length": real / samples}


def stoker_e2e(path, min_seconds, min_batches):
    import stoker
    ds = stoker.TokenDataset(path, dtype="uint16", pack=None, eos=EOS)
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=BUDGET), shuffle=True,
                               seed=0, num_workers="auto")
    out = _timed(loader, min_seconds, min_batches)
    out["loader_padding"] = loader.stats().get("budget", {}).get("padding_fraction")
    return out


class MemmapDocs:
    """The corpus's documents read from the token file with np.memmap (opened per worker), each
    with its EOS, as TokenDataset splits them."""

    def __init__(self, path):
        self.path = path
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
        ends = np.flatnonzero(tokens == EOS)
        self.starts = np.concatenate([[0], ends[:-1] + 1])
        self.ends = ends
        self.tokens = None

    def __len__(self):
        return len(self.ends)

    def __getitem__(self, i):
        if self.tokens is None:
            self.tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        return self.tokens[self.starts[i]:self.ends[i] + 1].astype(np.int64)


def pad_collate(docs):
    """What Stoker's budget batches hold: input_ids padded to the batch's longest, labels (the
    next token of the same document; -100 after its last and on padding), attention_mask,
    lengths."""
    import torch
    lengths = torch.tensor([len(d) for d in docs])
    ids = torch.full((len(docs), int(lengths.max())), PAD, dtype=torch.int64)
    for row, d in enumerate(docs):
        ids[row, :len(d)] = torch.from_numpy(d)
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    labels.masked_fill_(torch.arange(ids.shape[1])[None, :] >= lengths[:, None] - 1, -100)
    return {"input_ids": ids, "labels": labels, "attention_mask": mask.long(),
            "lengths": lengths}


def hf_e2e(path, batch_size, workers, min_seconds, min_batches):
    import torch
    from torch.utils.data import BatchSampler, DataLoader
    from transformers.trainer_pt_utils import LengthGroupedSampler
    ds = MemmapDocs(path)
    sampler = LengthGroupedSampler(batch_size, lengths=(ds.ends - ds.starts).tolist(),
                                   generator=torch.Generator().manual_seed(0))
    loader = DataLoader(ds, batch_sampler=BatchSampler(sampler, batch_size, drop_last=False),
                        collate_fn=pad_collate, num_workers=workers,
                        persistent_workers=workers > 0)
    return _timed(loader, min_seconds, min_batches)


CHILDREN = {"stoker-plan": stoker_plan, "hf-plan": hf_plan, "fixed-plan": fixed_plan,
            "lhotse-plan": lhotse_plan, "stoker-e2e": stoker_e2e, "hf-e2e": hf_e2e}
PEER_ENV = {"lhotse-plan": "budget"}


def measure(child, timeout=3600, **kwargs):
    """A child's figures, or None (said why) when it failed or its environment is missing."""
    python = sys.executable
    if child in PEER_ENV:
        python = peer_python(PEER_ENV[child])
        if python is None:
            print(f"  {child}: skipped: no .venv-peers/{PEER_ENV[child]} "
                  "(bash bench/setup_peers.sh budget)", flush=True)
            return None
    cmd = [python, HERE, "--child", child, "--args", json.dumps(kwargs)]
    try:
        return run_measured(cmd, env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=timeout)
    except RuntimeError as e:
        print(f"  {child}: {e}", flush=True)
        return None


def have_budget():
    try:
        import stoker
    except ImportError:
        return False
    return hasattr(stoker, "Budget")


# --- report ---------------------------------------------------------------------------------

def _pct(x):
    return "-" if x is None else f"{x:.2%}"


def batching(name, lengths_path, lengths, stoker_ok):
    """Padding, ranks and spread of every contender over one set of lengths."""
    longest, mean = int(lengths.max()), float(lengths.mean())
    b_fit, b_mean = max(1, BUDGET // longest), max(1, int(BUDGET // mean))
    print(f"\n## {name}: {len(lengths):,} samples, {int(lengths.sum()):,} tokens, mean "
          f"{mean:,.0f}, longest {longest:,}; budget {BUDGET:,} tokens (padded B x L), "
          f"{WORLD} ranks\n")
    runs = []
    if stoker_ok:
        runs.append(("stoker-budget", "stoker-plan", {}))
    runs += [(f"hf-grouped:{b_fit}", "hf-plan", {"batch_size": b_fit}),
             (f"hf-grouped:{b_mean}", "hf-plan", {"batch_size": b_mean}),
             ("lhotse-dynamic", "lhotse-plan", {}),
             (f"fixed-random:{b_fit}", "fixed-plan", {"batch_size": b_fit}),
             (f"fixed-random:{b_mean}", "fixed-plan", {"batch_size": b_mean})]
    print("| batcher | padding | largest batch / budget | real tokens / batch | batches | "
          "left out | steps on 8 ranks | cost spread mean / max |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    rows = {}
    for label, child, kwargs in runs:
        r = measure(child, lengths_path=str(lengths_path), **kwargs)
        if r is None:
            continue
        rows[label] = r
        steps = r["steps"]
        equal = "equal" if min(steps) == max(steps) else "UNEQUAL"
        steps = f"{min(steps):,}" if min(steps) == max(steps) else f"{min(steps):,}-{max(steps):,}"
        print(f"| {label} | {_pct(r['padding'])} | {r['largest_vs_budget']:.2f}x | "
              f"{r['mean_real_tokens']:,.0f} | {r['batches']:,} | {_pct(r['left_out'])} | "
              f"{steps} ({equal}) | {_pct(r['spread_mean'])} / {_pct(r['spread_max'])} |",
              flush=True)
    if "stoker-budget" in rows:
        s = rows["stoker-budget"]
        print(f"\nstoker-budget's own figures: padding {_pct(s['native_padding'])}, rank 0's "
              f"cost spread {_pct(s['native_spread_mean'])} / {_pct(s['native_spread_max'])}")
    print(f"targets: padding <= {TARGETS['padding']:.0%}, largest batch <= 1.00x, equal steps, "
          f"cost spread <= {TARGETS['spread']:.0%}")
    return rows


def planning(n, lhotse_pass):
    """Time to the first batch for n log-normal lengths; Lhotse's whole pass scaled to n."""
    path = DATA / f"lognormal-{n}.npy"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        np.save(path, lognormal_lengths(n))
    lengths = np.load(path, mmap_mode="r")
    b_fit, b_mean = max(1, BUDGET // int(lengths.max())), max(1, int(BUDGET // lengths.mean()))
    print(f"\n## Plan: time to the first batch, {n:,} log-normal lengths (target <= "
          f"{TARGETS['plan_s']:g} s for 5M)\n")
    print("| batcher | time to first batch | peak RSS | note |")
    print("|---|---:|---:|---|")
    runs = [("stoker-budget", "stoker-plan", {}) if have_budget() else None,
            (f"hf-grouped:{b_mean}", "hf-plan", {"batch_size": b_mean}),
            ("lhotse-dynamic", "lhotse-plan", {}),
            (f"fixed-random:{b_mean}", "fixed-plan", {"batch_size": b_mean})]
    rows = {}
    for label, child, kwargs in filter(None, runs):
        r = measure(child, lengths_path=str(path), ranks=False, **kwargs)
        if r is None:
            continue
        rows[label] = r
        note = "a permutation"
        if label == "stoker-budget":
            note = "plan + epoch: the whole epoch's batches"
        elif label.startswith("hf-"):
            note = "sampler + iter + next: orders the whole epoch"
        elif label == "lhotse-dynamic":
            note = "streams: the first cuts read into its buffers"
            if lhotse_pass:
                pn, ps = lhotse_pass
                r["pass_s_scaled"] = ps * n / pn
                note += (f"; a whole pass took {ps:.1f} s for {pn:,} samples, "
                         f"~{r['pass_s_scaled']:,.0f} s for {n:,} (linear)")
        print(f"| {label} | {r['plan_s']:.2f} s | {r['peak_rss'] / 2**20:,.0f} MiB | {note} |",
              flush=True)
    return rows


def end_to_end(path, lengths, quick, repeat):
    b_mean = max(1, int(BUDGET // lengths.mean()))
    min_seconds, min_batches = (1.0, 20) if quick else (5.0, 200)
    print(f"\n## End to end: the measured corpus ({len(lengths):,} documents, uint16 tokens), "
          f"shuffled, median of {repeat}\n")
    print("| loader | samples/s | stoker vs it | real tokens/s | padding | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|")
    runs = [("stoker-budget", "stoker-e2e", {})] if have_budget() else []
    runs += [(f"hf-grouped:{b_mean}:{w}", "hf-e2e", {"batch_size": b_mean, "workers": w})
             for w in (0, 1, 2)]
    rates, rss, pad, real = {}, {}, {}, {}
    for _ in range(repeat):
        for label, child, kwargs in runs:
            r = measure(child, path=str(path), min_seconds=min_seconds,
                        min_batches=min_batches, **kwargs)
            if r is None:
                continue
            rates.setdefault(label, []).append(r["samples"] / r["seconds"])
            rss[label] = max(rss.get(label, 0), r["peak_rss"])
            pad[label] = r["padding"]
            real.setdefault(label, []).append(r["samples"] / r["seconds"] * r["mean_length"])
    rates = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    real = {k: sorted(v)[len(v) // 2] for k, v in real.items()}
    ours = rates.get("stoker-budget")
    for label, rate in rates.items():
        ratio = f"{ours / rate:.2f}x" if ours and label != "stoker-budget" else "-"
        print(f"| {label} | {rate:,.0f} | {ratio} | {real[label] / 1e6:,.2f} M | "
              f"{_pct(pad[label])} | "
              f"{rss[label] / 2**20:,.0f} MiB |", flush=True)
    return rates


def _met(ok):
    return "met" if ok else "MISSED"


def summary(figures, samples):
    """One line: Stoker's figures against the targets, and its ratios to the best peer."""
    parts = []
    for key in ("lognormal", "corpus"):
        rows = figures.get(key, {})
        s = rows.get("stoker-budget")
        if not s:
            continue
        peers = [v["padding"] for k, v in rows.items() if k != "stoker-budget"]
        steps = "equal" if len(set(s["steps"])) == 1 else "UNEQUAL"
        parts.append(
            f"{key}: padding {s['padding']:.2%} ({_met(s['padding'] <= TARGETS['padding'])}"
            + (f"; the best peer's {min(peers):.2%}" if peers else "")
            + f"), steps on {WORLD} ranks {steps} "
            f"({_met(steps == 'equal')}), cost spread {s['spread_mean']:.2%} mean "
            f"({_met(s['spread_mean'] <= TARGETS['spread'])})")
    plan = figures.get("plan", {})
    if "stoker-budget" in plan:
        t = plan["stoker-budget"]["plan_s"]
        hf = [v["plan_s"] for k, v in plan.items() if k.startswith("hf-")]
        target = f" ({_met(t <= TARGETS['plan_s'])})" if samples >= 5_000_000 else ""
        parts.append(f"plan {t:.2f} s for {samples:,}{target}" +
                     (f", {hf[0] / t:.1f}x HF's speed" if hf else ""))
    e2e = figures.get("e2e", {})
    peers = [v for k, v in e2e.items() if k != "stoker-budget"]
    if "stoker-budget" in e2e and peers:
        ratio = e2e["stoker-budget"] / max(peers)
        parts.append(f"samples/s {ratio:.2f}x the best peer ({_met(ratio >= 1)})")
    if not parts:
        return "summary: stoker.Budget is not in this build; the peers' figures only"
    return "summary: stoker-budget " + "; ".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 200k samples for the plan, 20k for the other figures")
    p.add_argument("--samples", type=int, help="log-normal lengths for the plan (5,000,000)")
    p.add_argument("--repeat", type=int, help="rounds of the end-to-end runs (median; 3)")
    p.add_argument("--only", default="lognormal,corpus,plan,e2e")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    p.add_argument("--child")
    p.add_argument("--args")
    a = p.parse_args(argv)
    if a.child:
        emit(CHILDREN[a.child](**json.loads(a.args)))  # exits
    samples = a.samples or (200_000 if a.quick else 5_000_000)
    figure_n = min(samples, 20_000 if a.quick else FIGURE_SAMPLES)
    repeat = a.repeat or (1 if a.quick else 3)
    only = a.only.split(",")
    stoker_ok = have_budget()
    print(machine_line())
    if not stoker_ok:
        print("stoker.Budget is not in this build: the peers only")
    if peer_python("budget") is None:
        print("no .venv-peers/budget (bash bench/setup_peers.sh budget): Lhotse is skipped")
    figures = {}
    DATA.mkdir(parents=True, exist_ok=True)
    if "lognormal" in only:
        path = DATA / f"lognormal-{figure_n}.npy"
        lengths = lognormal_lengths(figure_n)
        np.save(path, lengths)
        figures["lognormal"] = batching("Log-normal lengths (median 400, sigma 1.2, 16-8192)",
                                        path, lengths, stoker_ok)
    corpus = None
    if "corpus" in only or "e2e" in only:
        corpus = make_corpus(a.quick)
        tokens_path, lengths, info = corpus
        print(f"\ncorpus: {info['files']:,} standard-library files -> {info['definitions']:,} "
              f"definitions -> {info['documents']:,} documents of >= {MIN_LEN} tokens "
              f"({info['tokens']:,} tokens, byte-level BPE {VOCAB:,} trained on them), "
              f"{tokens_path.relative_to(DATA.parent.parent.parent)}")
    if "corpus" in only:
        lengths_path = DATA / f"{'quick-' if a.quick else ''}stdlib-lengths.npy"
        figures["corpus"] = batching("Measured lengths (the standard library, BPE tokens)",
                                     lengths_path, corpus[1], stoker_ok)
    if "plan" in only:
        lh = figures.get("lognormal", {}).get("lhotse-dynamic")
        figures["plan"] = planning(samples, (figure_n, lh["pass_s"]) if lh else None)
    if "e2e" in only:
        figures["e2e"] = end_to_end(corpus[0], corpus[1], a.quick, repeat)
    print()
    print(summary(figures, samples))
    if a.json:
        write_json(a.json, figures, default=lambda o: o.tolist() if hasattr(o, "tolist")
                   else float(o))
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.exit(main())
    import record  # bench/record.py: a full run's output also goes to bench/results/
    sys.exit(record.run(main))
