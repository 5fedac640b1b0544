#!/usr/bin/env python3
"""Tokenizing text: stoker.Tokenizer against the peers, side by side in one run (issue 48).

Every contender encodes the same texts, on the same cores, without special tokens:
* stoker-batch: ``stoker.Tokenizer.encode_batch`` (native threads, one a usable core, GIL
  released); stoker-loop: ``encode`` of one text after another (one thread, for reference).
* hf-batch: Hugging Face ``tokenizers``' ``encode_batch`` (Rust, rayon threads,
  TOKENIZERS_PARALLELISM=true); hf-batch-fast: its ``encode_batch_fast`` (no offsets);
  hf-loop: ``encode`` one text after another. HF's time is the call only: reading ``.ids`` out
  of its Encoding objects is not timed (stoker's and tiktoken's calls return the lists of ids).
* tiktoken: ``Encoding.encode_ordinary_batch(num_threads=cores)`` of an Encoding built from the
  trained byte-level BPE (its pattern, and its vocabulary's bytes ranked by id, which is merge
  order), for the GPT-2 and Llama-3 style families.
* sentencepiece: a SentencePiece BPE (byte_fallback, 32,000 pieces or what the data allows)
  trained by ``sentencepiece`` on the same text, ``encode(texts, num_threads=cores)``: a
  reference beside the Llama-2 style family only (another vocabulary; stoker reads no ``.model``
  file yet).

Corpus: Python's standard library (this interpreter's sources and docstrings: code and English
prose) cut into documents of 60 lines, a fifth of them given a comment line in another script;
and generated multilingual documents (seed 0): Chinese, Japanese, Korean, Russian, Greek, Arabic,
Hindi, Thai and accented Latin words drawn from per-script Zipf vocabularies, with emoji, numbers
and long runs of spaces, tabs and newlines. Only characters assigned by Unicode 6.0 are drawn
(the libraries' Unicode tables differ on recent ones; include/stoker/text/tokenizer.h).
About 4 MB (--quick: about 300 KB).

Tokenizers, trained here by ``tokenizers``' trainers on that corpus (nothing is downloaded),
cached in bench/data/text/ (git-ignored): GPT-2 style byte-level BPE; Llama-3 style (Split with
Llama 3's regex, then ByteLevel(use_regex=False), ignore_merges); Llama-2 style (BPE with
byte_fallback and fuse_unk, normalizer Prepend + Replace, no pre-tokenizer); BERT WordPiece
(BertNormalizer, BertPreTokenizer); Unigram (NFKC, Metaspace). 32,000 tokens each, fewer when the
data does not allow them.

Before timing, every contender's ids are compared with HF's for every text (mismatches counted
and printed: a mismatch of stoker's is a bug). Figures: tokens/s (each contender's own tokens)
and MB/s of UTF-8 input; the median of --repeat rounds, the contenders interleaved in each round.
Targets: stoker-batch >= 1.5x hf-batch and >= 1.0x tiktoken (the time for the same texts).

    python bench/bench_text.py [--quick] [--repeat 3] [--json PATH] [--only gpt2,llama3,...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "true"  # before tokenizers is imported

from harness import cores, machine_line, write_json  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "text"
VOCAB = 32000
SEED = 0
TARGETS = {"hf": 1.5, "tiktoken": 1.0}
FAMILIES = ["gpt2", "llama3", "llama2", "bert", "unigram"]
DOC_LINES = 60

# GPT-2's pre-tokenizer regex (tokenizers' ByteLevel use_regex=True) and Llama 3's.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# --- corpus ---------------------------------------------------------------------------------

def _chars(*ranges):
    return [chr(c) for a, b in ranges for c in range(a, b + 1)]


# Each script: its letters (or syllables), word lengths, whether words are spaced, and its
# sentence end. Unicode 6.0 characters only.
SCRIPTS = {
    "chinese": (_chars((0x4E00, 0x9FA5)), (1, 3), "", "。", "，"),
    "japanese": (_chars((0x3041, 0x3093), (0x30A1, 0x30F3), (0x4E00, 0x6000)), (2, 5), "", "。",
                 "、"),
    "korean": (_chars((0xAC00, 0xD7A3)), (1, 4), " ", ".", ","),
    "russian": (_chars((0x430, 0x44F)), (2, 11), " ", ".", ","),
    "greek": (_chars((0x3B1, 0x3C9), (0x3AC, 0x3AF)), (2, 10), " ", ".", ","),
    "arabic": (_chars((0x627, 0x64A)), (2, 8), " ", ".", "،"),
    "hindi": (_chars((0x915, 0x939), (0x93E, 0x94C), (0x901, 0x902)), (2, 7), " ", "।", ","),
    "thai": (_chars((0xE01, 0xE2E), (0xE31, 0xE3A), (0xE40, 0xE46)), (2, 8), "", " ", " "),
    "latin": (list("abcdefghijklmnopqrstuvwxyz" * 6 + "àáâäçèéêëìíîïñòóôöùúûüÿœæßåøłşğıčžš"),
              (2, 11), " ", ".", ","),
}
EMOJI = _chars((0x1F600, 0x1F640), (0x1F400, 0x1F43E), (0x1F442, 0x1F4F7), (0x1F300, 0x1F320),
               (0x2600, 0x2603), (0x2764, 0x2764))


def _vocabulary(rng, letters, lengths, n=3000):
    return ["".join(rng.choices(letters, k=rng.randint(*lengths))) for _ in range(n)]


def _zipf_weights(n):
    total, cum = 0.0, []
    for r in range(n):
        total += 1.0 / (r + 1)
        cum.append(total)
    return cum


def _whitespace_run(rng):
    return rng.choice([" " * rng.randint(4, 64), "\t" * rng.randint(2, 12),
                       "\n" * rng.randint(2, 8), " \n" * rng.randint(2, 6),
                       "\n" + " " * rng.randint(8, 40)])


class Multilingual:
    """Deterministic multilingual text: sentences of Zipf-drawn words of one script, with
    numbers, emoji, Latin loanwords and long whitespace runs mixed in."""

    def __init__(self, seed=SEED):
        self.rng = random.Random(seed)
        self.vocab = {name: _vocabulary(self.rng, letters, lengths)
                      for name, (letters, lengths, *_rest) in SCRIPTS.items()}
        self.cum = _zipf_weights(3000)

    def sentence(self, script):
        rng = self.rng
        _letters, _lengths, space, end, comma = SCRIPTS[script]
        words = rng.choices(self.vocab[script], cum_weights=self.cum, k=rng.randint(4, 18))
        for i in range(len(words)):
            x = rng.random()
            if x < 0.04:
                words[i] = str(rng.randint(0, 10 ** rng.randint(1, 7)))
            elif x < 0.07:
                words[i] = "".join(rng.choices(EMOJI, k=rng.randint(1, 3)))
            elif x < 0.09:
                words[i] = rng.choices(self.vocab["latin"], cum_weights=self.cum)[0]
            elif x < 0.15:
                words[i] += comma
        return space.join(words) + end

    def document(self, size):
        rng = self.rng
        script = rng.choice(list(SCRIPTS))
        parts, n = [], 0
        while n < size:
            s = self.sentence(script if rng.random() < 0.9 else rng.choice(list(SCRIPTS)))
            r = rng.random()
            sep = _whitespace_run(rng) if r < 0.08 else "\n" if r < 0.3 else " "
            parts += [s, sep]
            n += len(s.encode()) + len(sep)
        return "".join(parts)


def stdlib_documents(limit_bytes, every):
    """The standard library's sources cut into documents of DOC_LINES lines."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)[::every]
    docs, n = [], 0
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        for i in range(0, len(lines), DOC_LINES):
            doc = "".join(lines[i:i + DOC_LINES])
            if doc.strip():
                docs.append(doc)
                n += len(doc.encode())
            if n >= limit_bytes:
                return docs
    return docs


def make_corpus(quick):
    """The texts (documents), stdlib and multilingual interleaved, the same on every run."""
    code_bytes, text_bytes = (180_000, 120_000) if quick else (2_400_000, 1_600_000)
    code = stdlib_documents(code_bytes, every=7 if quick else 2)
    gen = Multilingual()
    rng = random.Random(SEED + 1)
    for i in range(0, len(code), 5):  # a comment line in another script, a fifth of them
        lines = code[i].splitlines(keepends=True)
        at = rng.randrange(len(lines) + 1)
        code[i] = "".join(lines[:at] + ["    # " + gen.sentence(rng.choice(list(SCRIPTS)))
                                        + "\n"] + lines[at:])
    text, n = [], 0
    while n < text_bytes:
        doc = gen.document(rng.choice([300, 1000, 2500, 6000]))
        text.append(doc)
        n += len(doc.encode())
    docs = code + text
    random.Random(SEED + 2).shuffle(docs)
    return docs, len(code), len(text)


# --- tokenizers (trained here, cached) ------------------------------------------------------

def _train_hf(family, docs):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import trainers
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if family == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=alphabet, show_progress=False)
    elif family == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=alphabet,
                                      special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                      show_progress=False)
    elif family == "llama2":
        return _train_llama2(docs)
    elif family == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, show_progress=False,
                                            special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                            "[MASK]"])
    elif family == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=["<unk>"],
                                          unk_token="<unk>", show_progress=False)
    else:
        raise ValueError(family)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def _train_llama2(docs):
    """Llama 2's pipeline: trained on Metaspace words, then given Llama's normalizer (Prepend,
    Replace), no pre-tokenizer, and the 256 byte tokens of byte_fallback."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.train_from_iterator(docs, trainer=trainers.BpeTrainer(
        vocab_size=VOCAB - 256, limit_alphabet=1000, show_progress=False,
        special_tokens=["<unk>", "<s>", "</s>"]))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    spec["pre_tokenizer"] = None
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return Tokenizer.from_str(json.dumps(spec))


def hf_tokenizer(family, docs, tag):
    from tokenizers import Tokenizer
    path = DATA / f"{tag}{family}.json"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        tok = _train_hf(family, docs)
        tmp = path.with_suffix(".tmp")
        tok.save(str(tmp))
        os.replace(tmp, path)
        print(f"  (trained {family}: {tok.get_vocab_size():,} tokens in "
              f"{time.perf_counter() - t0:.0f} s, {path.relative_to(DATA.parent.parent.parent)})",
              flush=True)
    return Tokenizer.from_file(str(path)), path


def _byte_decoder():
    """GPT-2's byte-to-unicode table, reversed: a byte-level token's characters to its bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def tiktoken_encoding(hf, family):
    """A tiktoken Encoding of the same byte-level BPE: every token's bytes ranked by its id (the
    trainer numbers merges in the order it learns them), the added tokens as special ones."""
    import tiktoken
    decode = _byte_decoder()
    added = {t.content for t in hf.get_added_tokens_decoder().values()}
    ranks, specials = {}, {}
    for token, i in hf.get_vocab(with_added_tokens=True).items():
        if token in added:
            specials[token] = i
        else:
            ranks[bytes(decode[c] for c in token)] = i
    pattern = GPT2_PATTERN if family == "gpt2" else LLAMA3_PATTERN
    return tiktoken.Encoding(f"bench-{family}", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens=specials)


def sentencepiece_model(docs, tag):
    """A SentencePiece BPE trained by sentencepiece on the corpus's lines (cached)."""
    import sentencepiece as spm
    prefix = DATA / f"{tag}sentencepiece"
    model = prefix.with_suffix(".model")
    if not model.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        lines = [line for d in docs for line in d.splitlines() if line.strip()]
        t0 = time.perf_counter()
        vocab = VOCAB
        while True:
            try:
                spm.SentencePieceTrainer.train(
                    sentence_iterator=iter(lines), model_prefix=str(prefix), model_type="bpe",
                    vocab_size=vocab, byte_fallback=True, character_coverage=0.9995,
                    num_threads=cores(), minloglevel=2, max_sentence_length=16384)
                break
            except RuntimeError as e:  # "Vocabulary size is too high": take what it allows
                text = str(e)
                if "too high" not in text or vocab <= 1000:
                    raise
                vocab = int(vocab * 0.8)
        print(f"  (trained sentencepiece: {vocab:,} pieces in {time.perf_counter() - t0:.0f} s)",
              flush=True)
    return spm.SentencePieceProcessor(model_file=str(model))


# --- contenders -----------------------------------------------------------------------------

def contenders(family, hf, ours, tag, docs, with_peers):
    """(label, encode(texts) -> list of ids lists, comparable to HF's ids) of a family."""
    n = cores()
    rows = [("stoker-batch", lambda t: ours.encode_batch(t)),
            ("stoker-loop", lambda t: [ours.encode(x) for x in t]),
            ("hf-batch", lambda t: hf.encode_batch(t, add_special_tokens=False)),
            ("hf-batch-fast", lambda t: hf.encode_batch_fast(t, add_special_tokens=False)),
            ("hf-loop", lambda t: [hf.encode(x, add_special_tokens=False) for x in t])]
    if with_peers and family in ("gpt2", "llama3"):
        try:
            enc = tiktoken_encoding(hf, family)
            rows.append(("tiktoken", lambda t: enc.encode_ordinary_batch(t, num_threads=n)))
        except ImportError:
            print("  tiktoken: not installed, skipped")
    if with_peers and family == "llama2":
        try:
            sp = sentencepiece_model(docs, tag)
            rows.append(("sentencepiece", lambda t: sp.encode(t, out_type=int, num_threads=n)))
        except ImportError:
            print("  sentencepiece: not installed, skipped")
    return rows


def ids_of(out):
    return [o.ids if hasattr(o, "ids") else o for o in out]


def run_family(family, docs, tag, repeat, with_peers):
    import stoker
    hf, path = hf_tokenizer(family, docs, tag)
    ours = stoker.Tokenizer.from_file(path)
    nbytes = sum(len(d.encode()) for d in docs)
    rows = contenders(family, hf, ours, tag, docs, with_peers)

    # Every contender once, untimed (caches warm), its ids checked against HF's.
    want = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    tokens, mismatches = {}, {}
    for label, fn in rows:
        got = ids_of(fn(docs))
        tokens[label] = sum(map(len, got))
        if label != "sentencepiece":
            mismatches[label] = sum(g != w for g, w in zip(got, want))
    bad = [i for i, (g, w) in enumerate(zip(ids_of(rows[0][1](docs)), want)) if g != w]

    times = {label: [] for label, _ in rows}
    for _ in range(repeat):
        for label, fn in rows:  # interleaved: each round runs every contender once
            t0 = time.perf_counter()
            fn(docs)
            times[label].append(time.perf_counter() - t0)
    seconds = {k: statistics.median(v) for k, v in times.items()}

    print(f"\n## {family}: {hf.get_vocab_size():,} tokens, {len(want):,} texts, "
          f"{nbytes / 1e6:.2f} MB, {tokens['hf-batch']:,} tokens (HF's), median of {repeat}\n")
    print("| contender | tokens/s | MB/s | stoker-batch vs it | ids == HF's |")
    print("|---|---:|---:|---:|---|")
    ours_s = seconds["stoker-batch"]
    for label, _ in rows:
        s = seconds[label]
        if label == "sentencepiece":
            same = "n/a (its own vocabulary; a reference row)"
        elif mismatches[label]:
            same = f"{mismatches[label]:,} of {len(want):,} texts DIFFER"
        else:
            same = "all"
        ratio = "-" if label == "stoker-batch" else f"{s / ours_s:.2f}x"
        print(f"| {label} | {tokens[label] / s / 1e6:,.2f} M | {nbytes / s / 1e6:,.2f} | "
              f"{ratio} | {same} |", flush=True)
    if bad:
        i = bad[0]
        g = ours.encode(docs[i])
        at = next((k for k, (a, b) in enumerate(zip(g, want[i])) if a != b),
                  min(len(g), len(want[i])))
        print(f"\nstoker differs from HF on {len(bad):,} texts; the first, text {i}, from token "
              f"{at}: stoker {g[at:at + 6]} vs HF {want[i][at:at + 6]} "
              f"(HF's tokens {[hf.id_to_token(t) for t in want[i][at:at + 6]]})")
    return {"vocab": hf.get_vocab_size(), "texts": len(want), "bytes": nbytes,
            "tokens": tokens, "seconds": seconds, "runs": times, "mismatches": mismatches}


# --- report ---------------------------------------------------------------------------------

def _met(ok):
    return "met" if ok else "MISSED"


def summary(figures):
    print("\n## Summary: stoker-batch against the peers (the time for the same texts)\n")
    print(f"| family | stoker-batch tokens/s | hf-batch | stoker / HF (target >= "
          f"{TARGETS['hf']}x) | tiktoken | stoker / tiktoken (target >= "
          f"{TARGETS['tiktoken']}x) | stoker ids == HF's |")
    print("|---|---:|---:|---:|---:|---:|---|")
    parts = []
    for family, f in figures.items():
        s, t, tok = f["seconds"], f["tokens"], f["tokens"]["stoker-batch"]
        hf = s["hf-batch"] / s["stoker-batch"]
        tk = s["tiktoken"] / s["stoker-batch"] if "tiktoken" in s else None
        bad = f["mismatches"]["stoker-batch"]
        same = "all" if not bad else f"{bad:,} of {f['texts']:,} texts DIFFER"
        tk_cells = (f"{t['tiktoken'] / s['tiktoken'] / 1e6:,.2f} M | {tk:.2f}x "
                    f"({_met(tk >= TARGETS['tiktoken'])})" if tk else "- | -")
        print(f"| {family} | {tok / s['stoker-batch'] / 1e6:,.2f} M | "
              f"{t['hf-batch'] / s['hf-batch'] / 1e6:,.2f} M | {hf:.2f}x "
              f"({_met(hf >= TARGETS['hf'])}) | {tk_cells} | {same} |")
        parts.append(f"{family} {hf:.2f}x HF" + (f", {tk:.2f}x tiktoken" if tk else "")
                     + ("" if not bad else f", ids DIFFER on {bad:,} texts"))
    print("\nsummary: stoker-batch " + "; ".join(parts))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: ~300 KB of text, 1 round")
    p.add_argument("--repeat", type=int, help="timed rounds (median; 3, --quick 1)")
    p.add_argument("--only", default=",".join(FAMILIES), help="families, comma-separated")
    p.add_argument("--no-peers", action="store_true", help="stoker and HF only")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    a = p.parse_args(argv)
    repeat = a.repeat or (1 if a.quick else 3)
    tag = "quick-" if a.quick else ""
    print(machine_line())
    try:
        import stoker._text  # noqa: F401
    except ImportError as e:
        print(f"this stoker has no text module ({e}): nothing to measure")
        return 1
    import tokenizers
    versions = [f"tokenizers {tokenizers.__version__}"]
    for name in ("tiktoken", "sentencepiece"):
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            versions.append(f"{name} not installed")
    t0 = time.perf_counter()
    docs, n_code, n_text = make_corpus(a.quick)
    chars = sum(map(len, docs))
    nbytes = sum(len(d.encode()) for d in docs)
    print(f"{'; '.join(versions)}; {cores()} threads for every batch contender")
    print(f"corpus: {len(docs):,} texts, {nbytes / 1e6:.2f} MB UTF-8 ({chars:,} characters): "
          f"{n_code:,} standard-library documents of {DOC_LINES} lines and {n_text:,} generated "
          f"multilingual ones (made in {time.perf_counter() - t0:.1f} s)")
    figures = {}
    for family in a.only.split(","):
        figures[family] = run_family(family, docs, tag, repeat, not a.no_peers)
    summary(figures)
    if a.json:
        write_json(a.json, figures)
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: a full run's output also goes to bench/results/
    sys.exit(record.run(main))
