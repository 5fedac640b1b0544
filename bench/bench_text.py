#!/usr/bin/env python3
"""Text: stoker.Tokenizer and stoker.TextDataset (SFT) against the peers, side by side (issue 48).

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

SFT pipeline (``--part sft``; issue 48's "Measure"): conversations to packed batches, Stoker
and the peer side by side on the same data and cores, each run in a measurement child of its own
(peak RSS of its process tree), the clock started after the imports, before the tokenizer loads.
* Data: 20,000 conversations (--quick: 1,000; seeded) in bench/data/text/: an optional system
  prompt, 1-4 user/assistant turns (about 20-1500 tokens a conversation, log-uniform) whose
  contents are slices of the corpus's documents, a fifth with a ``tools`` list, an assistant tool
  call and the tool's answer. Tokenizer: the llama3 BPE above with ``<|im_start|>``,
  ``<|im_end|>``, ``<|endoftext|>`` added, as transformers' ``PreTrainedTokenizerFast`` (eos
  ``<|im_end|>``, pad ``<|endoftext|>``) with a ChatML template marking the assistant's replies
  with ``{% generation %}`` (CHAT_TEMPLATE).
* stoker: ``TextDataset(jsonl, Tokenizer.from_hf(fast), messages="messages", seq_len=4096,
  pack="best_fit")`` (a cold start: no cache_dir) and ``stoker.DataLoader(batch_size=8,
  shuffle=True)``; stoker-warm: the same with a cache_dir a first construction filled.
* peer (what users do today): ``datasets.Dataset.from_json``, a batched ``map`` (num_proc 1
  and every core) through ``apply_chat_template(..., tokenize=True, return_dict=True,
  return_assistant_tokens_mask=True)`` (one ``tools`` list a call: a batch's rows grouped by their
  tools), TRL's ``pack_dataset(strategy="bfd_split")`` (best-fit decreasing, a row longer than
  seq_len cut as Stoker cuts it; trl from ``bench/setup_peers.sh sft``, else its algorithm
  written out here), then torch's DataLoader with a collate making Stoker's fields (shifted
  labels, position_ids, cu_seqlens, max_seqlen) at num_workers 0, 1 and 2: every pair
  measured, the fastest epoch reported as the peer.
Before timing: a sample of Stoker's documents (``document``, ``trained``) against the peer's
input_ids and assistant masks, and one epoch of each whose multisets of real tokens and of trained
labels must be equal. Figures: real tokens/s end to end (padding excluded), time to the first
batch, padding, peak RSS; the median of --repeat rounds, interleaved. Targets: tokens/s >= 3x the
best peer, first batch >= 20x sooner, padding <= TRL's.

    python bench/bench_text.py [--quick] [--part tokenizers|sft|all] [--repeat 3] [--json PATH]
                               [--only gpt2,llama3,...] [--seq-len 4096] [--batch 8]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "true"  # before tokenizers is imported

from harness import cores, emit, machine_line, run_measured, write_json  # noqa: E402

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


# --- SFT pipeline: conversations to packed batches (issue 48's "Measure") -------------------

SFT_TARGETS = {"tokens_per_s": 3.0, "first_batch": 20.0}
SFT_SEQ_LEN = 4096
SFT_BATCH = 8
SFT_WORKERS = (0, 1, 2)  # the peer's torch DataLoader num_workers, each measured
# ... and each with its map's num_proc: 1 and every core (processes cost their start-up, which
# a small set does not repay).
PEER_SITE = Path(__file__).resolve().parent.parent / ".venv-peers" / "sft" / "site"
IM_START, IM_END, EOT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# ChatML; the assistant's replies (and their <|im_end|>) inside {% generation %}. Tools are
# listed in the system turn with tojson; a tool call's arguments are a JSON string (OpenAI's
# form) written as they are.
CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{ 'You may call these tools:\\n' }}"
    "{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{ '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% generation %}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{{ '<tool_call>{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{{ call.function.arguments + '}</tool_call>' }}{%- endfor %}"
    "{%- else %}{{ message.content }}{%- endif %}{{ '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{ '<|im_start|>tool\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")


def _tool(name, description, what):
    # Every tool has the same keys in the same order: datasets' Arrow schema merges the rows'
    # structs, and a key one tool lacks would come back as null and render in tojson.
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": what}}, "required": ["query"]}}}


TOOLSETS = [
    [_tool("search_code", "Search the repository for a symbol.", "the symbol's name")],
    [_tool("get_weather", "The weather at a place, now.", "a city, e.g. Zürich"),
     _tool("web_search", "Search the web.", "the words to search for")],
    [_tool("run_python", "Run a Python snippet and return its output.", "the code"),
     _tool("search_code", "Search the repository for a symbol.", "the symbol's name"),
     _tool("read_file", "Read a file of the repository.", "its path")],
]
SYSTEM_PROMPTS = ["You are a helpful assistant.",
                  "You are a careful senior engineer. Answer briefly, with code when it helps.",
                  "Réponds en français si l'utilisateur écrit en français. 用中文回答中文问题。"]


def make_conversations(docs, n, seed=SEED):
    """``n`` conversations (seeded) whose contents are slices of the corpus's documents: an
    optional system prompt, 1-4 user/assistant turns, about 20-1500 tokens in all (log-uniform),
    a fifth of them with a ``tools`` list and an assistant tool call answered by a tool turn."""
    import math
    rng = random.Random(seed)

    def piece(chars):
        doc = rng.choice(docs)
        chars = max(4, min(chars, len(doc)))
        at = rng.randrange(len(doc) - chars + 1)
        return doc[at:at + chars]

    rows = []
    for _ in range(n):
        tokens = int(math.exp(rng.uniform(math.log(20), math.log(1500))))
        turns = rng.randint(1, 4)
        chars = max(8, tokens * 3 // (2 * turns))  # ~3 characters a token, user and assistant
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        row = {}
        call_at = rng.randrange(turns) if rng.random() < 0.2 else None
        if call_at is not None:
            row["tools"] = tools = rng.choice(TOOLSETS)
        for t in range(turns):
            messages.append({"role": "user", "content": piece(rng.randint(chars // 4, chars))})
            if t == call_at:
                name = rng.choice(tools)["function"]["name"]
                args = json.dumps({"query": piece(rng.randint(5, 60))}, ensure_ascii=False)
                messages.append({"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": name, "arguments": args}}]})
                messages.append({"role": "tool", "content": piece(rng.randint(8, max(8, chars)))})
            messages.append({"role": "assistant",
                             "content": piece(rng.randint(chars // 2, chars * 3 // 2))})
        row["messages"] = messages
        rows.append(row)
    return rows


def sft_files(docs, quick, tag):
    """The conversations' JSONL and the chat tokenizer's folder (save_pretrained), cached."""
    DATA.mkdir(parents=True, exist_ok=True)
    n = 1000 if quick else 20000
    jsonl = DATA / f"{tag}sft-{n}.jsonl"
    if not jsonl.exists():
        tmp = jsonl.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in make_conversations(docs, n):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, jsonl)
    digest = hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()[:8]  # a new template, a new one
    tokdir = DATA / f"{tag}sft-tokenizer-{digest}"
    if not (tokdir / "tokenizer.json").exists():
        chat_tokenizer(hf_tokenizer("llama3", docs, tag)[0]).save_pretrained(str(tokdir))
    return jsonl, tokdir, n


def chat_tokenizer(hf):
    """The trained Llama-3 style BPE with ChatML's special tokens, as transformers wraps it."""
    from transformers import PreTrainedTokenizerFast
    hf.add_special_tokens([IM_START, IM_END, EOT])
    fast = PreTrainedTokenizerFast(tokenizer_object=hf, eos_token=IM_END, pad_token=EOT)
    fast.chat_template = CHAT_TEMPLATE
    return fast


# The two pipelines, each run by a measurement child (``--sft-child``): the clock starts after
# the imports, before the tokenizer is loaded; the first batch and the whole epoch are timed.

def _real_tokens(position_ids):
    """Tokens of a [B, L] batch that are not padding: padding closes a row with position 0
    (every piece here is longer than one token, so a row ends at its last nonzero position)."""
    import numpy as np
    pos = np.asarray(position_ids)
    nz = pos != 0
    last = pos.shape[1] - 1 - np.argmax(nz[:, ::-1], axis=1)
    return int(np.where(nz.any(axis=1), last + 1, 0).sum())


class _Tally:
    """Counts real tokens; with ``check``, also the multisets of real input ids and of trained
    labels (a digest of their histograms)."""

    def __init__(self, check, vocab):
        import numpy as np
        self.np, self.check, self.tokens, self.labelled = np, check, 0, 0
        self.ids = np.zeros(vocab, np.int64) if check else None
        self.labels = np.zeros(vocab, np.int64) if check else None

    def add(self, batch):
        np = self.np
        pos = np.asarray(batch["position_ids"])
        self.tokens += _real_tokens(pos)
        if self.check:
            ids, lab = np.asarray(batch["input_ids"]), np.asarray(batch["labels"])
            nz = pos != 0
            last = pos.shape[1] - 1 - np.argmax(nz[:, ::-1], axis=1)
            real = np.arange(pos.shape[1])[None, :] <= last[:, None]
            self.ids += np.bincount(ids[real], minlength=len(self.ids))
            self.labels += np.bincount(lab[lab != -100], minlength=len(self.labels))
            self.labelled += int((lab != -100).sum())

    def figures(self):
        out = {"real_tokens": self.tokens}
        if self.check:
            out |= {"labelled": self.labelled,
                    "ids_digest": hashlib.sha256(self.ids.tobytes()).hexdigest()[:16],
                    "labels_digest": hashlib.sha256(self.labels.tobytes()).hexdigest()[:16]}
        return out


def sft_stoker_child(a):
    import tempfile
    import stoker
    import torch  # noqa: F401  (imported before the clock, as in the peer's child)
    from transformers import PreTrainedTokenizerFast
    cache = tempfile.mkdtemp(prefix="stoker-sft-") if a.child == "stoker-warm" else None
    if cache:  # fill the cache (untimed): the timed construction below opens it
        fast = PreTrainedTokenizerFast.from_pretrained(a.tokdir)
        stoker.TextDataset(a.jsonl, stoker.Tokenizer.from_hf(fast), messages="messages",
                           seq_len=a.seq_len, pack="best_fit", cache_dir=cache)
    t0 = time.perf_counter()
    fast = PreTrainedTokenizerFast.from_pretrained(a.tokdir)
    ds = stoker.TextDataset(a.jsonl, stoker.Tokenizer.from_hf(fast), messages="messages",
                            seq_len=a.seq_len, pack="best_fit", cache_dir=cache)
    built = time.perf_counter() - t0
    loader = stoker.DataLoader(ds, batch_size=a.batch, shuffle=True)
    tally, first, batches = _Tally(a.check, len(fast)), None, 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        tally.add(batch)
        batches += 1
    total = time.perf_counter() - t0
    emit({"seconds": total, "first_batch_s": first, "build_s": built, "batches": batches,
          "sequences": len(ds), "padding": float(ds.padding_fraction)} | tally.figures())


def _peer_collate(seq_len, eot):
    """TRL's packed rows (input_ids, assistant_masks, seq_lengths) to Stoker's fields, padded
    to ``seq_len``: labels shifted within each document (-100 at its last token, outside the
    assistant and on padding), position_ids restarting per document, cu_seqlens padded with L."""
    import numpy as np
    import torch

    def collate(rows):
        b = len(rows)
        ids = np.full((b, seq_len), eot, np.int64)
        labels = np.full((b, seq_len), -100, np.int64)
        pos = np.zeros((b, seq_len), np.int64)
        segs = max(len(r["seq_lengths"]) for r in rows) + 2
        cu = np.full((b, segs), seq_len, np.int32)
        longest = np.zeros(b, np.int32)
        for i, r in enumerate(rows):
            x = np.asarray(r["input_ids"], np.int64)
            m = np.asarray(r["assistant_masks"], bool)
            lens = np.asarray(r["seq_lengths"], np.int64)
            n = len(x)
            ids[i, :n] = x
            labels[i, :n - 1] = np.where(m[1:], x[1:], -100)
            ends = np.cumsum(lens)
            labels[i, ends - 1] = -100
            starts = ends - lens
            pos[i, :n] = np.arange(n) - np.repeat(starts, lens)
            cu[i, 0] = 0
            cu[i, 1:len(ends) + 1] = ends
            longest[i] = max(int(lens.max()), seq_len - n)
        return {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
                "position_ids": torch.from_numpy(pos), "cu_seqlens": torch.from_numpy(cu),
                "max_seqlen": torch.from_numpy(longest)}
    return collate


def peer_encode(fast):
    """The peer's batched map: apply_chat_template takes one ``tools`` list for a whole call, so
    the rows of a batch are grouped by their tools (rows without tools together)."""
    def encode(batch):
        groups = {}
        for i, tools in enumerate(batch["tools"]):
            groups.setdefault(json.dumps(tools), []).append(i)
        n = len(batch["messages"])
        ids, masks = [None] * n, [None] * n
        for key, rows in groups.items():
            out = fast.apply_chat_template([batch["messages"][i] for i in rows],
                                           tools=json.loads(key), tokenize=True,
                                           return_dict=True, return_assistant_tokens_mask=True)
            for i, x, m in zip(rows, out["input_ids"], out["assistant_masks"]):
                ids[i], masks[i] = x, m
        return {"input_ids": ids, "assistant_masks": masks}
    return encode


def peer_packed(path, fast, seq_len, cache_dir, procs):
    """What users do today: datasets' JSON reader, a batched map through apply_chat_template on
    ``procs`` processes, then TRL's best-fit-decreasing packing (bfd_split: a row longer than seq_len
    is cut, as Stoker's best_fit does, so no token is lost); TRL's own code, or, without trl,
    its algorithm written out here (``_bfd``). Returns (packed dataset, "trl x.y" or why not)."""
    import datasets
    datasets.disable_caching()
    ds = datasets.Dataset.from_json(str(path), cache_dir=cache_dir)
    if "tools" not in ds.column_names:
        ds = ds.add_column("tools", [None] * len(ds))
    ds = ds.map(peer_encode(fast), batched=True, remove_columns=ds.column_names,
                num_proc=procs if procs > 1 else None)
    try:
        import trl
        from trl.data_utils import pack_dataset
    except ImportError as e:
        return _bfd(ds, seq_len), f"TRL's BFD re-implemented (trl not importable: {e})"
    return pack_dataset(ds, seq_len, strategy="bfd_split"), f"trl {trl.__version__}"


def _bfd(ds, seq_len):
    """TRL's _pack_bfd(on_seq_length_overflow="split") over each map batch of 1,000 rows (as
    pack_dataset runs it): rows cut into seq_len pieces (the last one shorter), sorted by length
    (descending, stable), each put in an open bin of the least room that fits it (of those, the
    one that got that room first, as TRL's deques), else a new bin."""
    import bisect
    from collections import defaultdict, deque

    def pack(batch):
        pieces = []
        for x, m in zip(batch["input_ids"], batch["assistant_masks"]):
            for at in range(0, len(x), seq_len):
                pieces.append((x[at:at + seq_len], m[at:at + seq_len]))
        order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i][0]))
        bins, rooms, by_room = [], [], defaultdict(deque)  # rooms: sorted distinct open rooms
        for i in order:
            n = len(pieces[i][0])
            k = bisect.bisect_left(rooms, n)
            if k < len(rooms):
                room = rooms[k]
                b = by_room[room].popleft()
                if not by_room[room]:
                    rooms.pop(k)
            else:
                room, b = seq_len, len(bins)
                bins.append([])
            bins[b].append(i)
            room -= n
            if room > 0:
                if not by_room[room]:
                    bisect.insort(rooms, room)
                by_room[room].append(b)
        out = {"input_ids": [], "assistant_masks": [], "seq_lengths": []}
        for members in bins:
            out["input_ids"].append([t for i in members for t in pieces[i][0]])
            out["assistant_masks"].append([t for i in members for t in pieces[i][1]])
            out["seq_lengths"].append([len(pieces[i][0]) for i in members])
        return out
    return ds.map(pack, batched=True, batch_size=1000, remove_columns=ds.column_names)


def sft_peer_child(a):
    import tempfile
    import datasets
    import torch
    from torch.utils.data import DataLoader
    from transformers import PreTrainedTokenizerFast
    datasets.disable_progress_bars()
    if (PEER_SITE.parent / ".ok").exists():  # bench/setup_peers.sh sft
        sys.path.append(str(PEER_SITE))
    try:
        import trl.data_utils  # noqa: F401  (imported before the clock, as torch is)
    except ImportError:
        pass
    t0 = time.perf_counter()
    fast = PreTrainedTokenizerFast.from_pretrained(a.tokdir)
    packed, how = peer_packed(a.jsonl, fast, a.seq_len, tempfile.mkdtemp(prefix="hf-sft-"),
                              a.map_procs)
    built = time.perf_counter() - t0
    loader = DataLoader(packed, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                        collate_fn=_peer_collate(a.seq_len, fast.convert_tokens_to_ids(EOT)),
                        persistent_workers=False)
    torch.manual_seed(0)
    tally, first, batches = _Tally(a.check, len(fast)), None, 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        tally.add(batch)
        batches += 1
    total = time.perf_counter() - t0
    real = sum(sum(r) for r in packed["seq_lengths"])
    emit({"seconds": total, "first_batch_s": first, "build_s": built, "batches": batches,
          "sequences": len(packed), "padding": 1 - real / (len(packed) * a.seq_len),
          "packer": how} | tally.figures())


def check_documents(jsonl, tokdir, n, sample, seq_len):
    """Stoker's documents against the peer's map for a sample of rows (rows as datasets reads
    them): input_ids and the assistant masks. Returns (rows compared, rows that differ, first
    difference or None)."""
    import tempfile
    import datasets
    import stoker
    from transformers import PreTrainedTokenizerFast
    datasets.disable_progress_bars()
    fast = PreTrainedTokenizerFast.from_pretrained(str(tokdir))
    ds = stoker.TextDataset(str(jsonl), stoker.Tokenizer.from_hf(fast), messages="messages",
                            seq_len=seq_len, pack="best_fit")
    datasets.disable_caching()
    rows = datasets.Dataset.from_json(str(jsonl), cache_dir=tempfile.mkdtemp(prefix="hf-sft-"))
    picks = sorted(random.Random(SEED + 3).sample(range(n), min(sample, n)))
    bad, first = 0, None
    for d in picks:
        row = rows[d]
        want = fast.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True)
        got_ids = [int(t) for t in ds.document(d)]
        got_mask = [int(t) for t in ds.trained(d)]
        if got_ids != list(want["input_ids"]) or got_mask != list(want["assistant_masks"]):
            bad += 1
            if first is None:
                w, wm = list(want["input_ids"]), list(want["assistant_masks"])
                at = next((k for k in range(min(len(got_ids), len(w)))
                           if got_ids[k] != w[k] or got_mask[k] != wm[k]),
                          min(len(got_ids), len(w)))
                first = (f"row {d}: lengths stoker {len(got_ids)} / peer {len(w)}; first "
                         f"difference at token {at}: stoker {got_ids[at:at + 5]} mask "
                         f"{got_mask[at:at + 5]} vs peer {w[at:at + 5]} mask {wm[at:at + 5]}")
    return len(picks), bad, first


def _child(a, mode, workers=0, procs=1, check=False):
    cmd = [sys.executable, __file__, "--child", mode, "--jsonl", str(a.sft_jsonl),
           "--tokdir", str(a.sft_tokdir), "--seq-len", str(a.seq_len), "--batch", str(a.batch),
           "--workers", str(workers), "--map-procs", str(procs)] + (["--check"] if check else [])
    env = dict(os.environ, TOKENIZERS_PARALLELISM="true")
    try:
        return run_measured(cmd, env=env, timeout=a.sft_timeout)
    except RuntimeError as e:
        return {"error": str(e)}


def run_sft(a, docs, tag):
    from harness import median_of
    jsonl, tokdir, n = sft_files(docs, a.quick, tag)
    a.sft_jsonl, a.sft_tokdir = jsonl, tokdir
    print(f"\n# SFT pipeline: {n:,} conversations ({jsonl.stat().st_size / 1e6:.1f} MB JSONL, "
          f"{jsonl.relative_to(DATA.parent.parent.parent)}), the llama3 BPE with ChatML, "
          f"seq_len {a.seq_len}, batch {a.batch}, {cores()} cores, median of {a.repeat}\n",
          flush=True)
    sample = 100 if a.quick else 500
    compared, bad, first = check_documents(jsonl, tokdir, n, sample, a.seq_len)
    print(f"documents: {compared - bad} of {compared} sampled rows equal the peer's input_ids "
          f"and assistant masks" + (f"; {bad} DIFFER, the first: {first}" if bad else ""))
    # One untimed epoch each with the multisets of real tokens and trained labels.
    chk = {"stoker": _child(a, "stoker", check=True),
           "peer": _child(a, "peer", procs=cores(), check=True)}
    keys = ("real_tokens", "labelled", "ids_digest", "labels_digest")
    if any("error" in c for c in chk.values()):
        same = False
        print("epoch check failed: " + "; ".join(f"{k}: {c['error']}" for k, c in chk.items()
                                                 if "error" in c))
    else:
        same = all(chk["stoker"][k] == chk["peer"][k] for k in keys)
        print(f"epoch: {chk['stoker']['real_tokens']:,} real tokens and "
              f"{chk['stoker']['labelled']:,} trained labels delivered by stoker, "
              f"{chk['peer']['real_tokens']:,} and {chk['peer']['labelled']:,} by the peer; "
              f"multisets of ids and labels {'EQUAL' if same else 'DIFFER'}")
    configs = {"stoker": ("stoker", 0, 1), "stoker-warm": ("stoker-warm", 0, 1)} | {
        f"peer-p{p}-w{w}": ("peer", w, p) for p in sorted({1, cores()}) for w in SFT_WORKERS}
    runs = {k: [] for k in configs}
    for _ in range(a.repeat):  # interleaved: each round runs every configuration once
        for k, (mode, workers, procs) in configs.items():
            runs[k].append(_child(a, mode, workers=workers, procs=procs))
    med = {k: median_of(v) for k, v in runs.items()}
    peers = {k: v for k, v in med.items() if k.startswith("peer") and "error" not in v}
    best = min(peers, key=lambda k: peers[k]["seconds"]) if peers else None

    print("\n| pipeline | tokens/s | first batch | build | epoch | padding | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, f in med.items():
        if "error" in f:
            print(f"| {k} | failed: {f['error']} | | | | | |")
            continue
        print(f"| {k}{' (best peer)' if k == best else ''} | "
              f"{f['real_tokens'] / f['seconds'] / 1e6:,.2f} M | {f['first_batch_s']:.2f} s | "
              f"{f['build_s']:.2f} s | {f['seconds']:.2f} s | {f['padding'] * 100:.2f}% | "
              f"{f['peak_rss'] / 2**20:,.0f} MiB |")
    figures = {"conversations": n, "seq_len": a.seq_len, "batch": a.batch,
               "documents_compared": compared, "documents_differ": bad,
               "epoch_check": chk, "epoch_multisets_equal": same, "runs": runs, "median": med}
    s = med["stoker"]
    if best and "error" not in s:
        p = med[best]
        tps = (s["real_tokens"] / s["seconds"]) / (p["real_tokens"] / p["seconds"])
        fb = p["first_batch_s"] / s["first_batch_s"]
        rss = s["peak_rss"] / p["peak_rss"]
        counted = "the same" if s["real_tokens"] == p["real_tokens"] else "DIFFERENT"
        figures["ratios"] = {"tokens_per_s": tps, "first_batch": fb, "rss": rss,
                             "padding_stoker": s["padding"], "padding_peer": p["padding"],
                             "best_peer": best}
        print(f"\npeer: datasets map (apply_chat_template) + {p.get('packer', '?')} "
              f"pack_dataset(bfd_split) + torch DataLoader; the best (by epoch time): map "
              f"num_proc {configs[best][2]}, num_workers {configs[best][1]}; real tokens "
              f"counted: {counted} "
              f"({s['real_tokens']:,} / {p['real_tokens']:,})")
        print(f"\nsummary: SFT stoker / peer: tokens/s {tps:.2f}x (target >= "
              f"{SFT_TARGETS['tokens_per_s']}x, {_met(tps >= SFT_TARGETS['tokens_per_s'])}); "
              f"first batch {fb:.1f}x sooner (target >= {SFT_TARGETS['first_batch']}x, "
              f"{_met(fb >= SFT_TARGETS['first_batch'])}); padding {s['padding'] * 100:.2f}% vs "
              f"{p['padding'] * 100:.2f}% ({_met(s['padding'] <= p['padding'] + 1e-12)}); peak "
              f"RSS {rss:.2f}x; warm (cache_dir) first batch "
              f"{med['stoker-warm'].get('first_batch_s', float('nan')):.2f} s, "
              f"{p['first_batch_s'] / med['stoker-warm'].get('first_batch_s', float('nan')):.1f}x "
              f"sooner")
    return figures


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
    p.add_argument("--quick", action="store_true",
                   help="smoke run: ~300 KB of text, 1,000 conversations, 1 round")
    p.add_argument("--part", choices=("tokenizers", "sft", "all"), default="all",
                   help="the tokenizers, the SFT pipeline, or both (default)")
    p.add_argument("--repeat", type=int, help="timed rounds (median; 3, --quick 1)")
    p.add_argument("--only", default=",".join(FAMILIES), help="families, comma-separated")
    p.add_argument("--no-peers", action="store_true", help="stoker and HF only (tokenizers)")
    p.add_argument("--seq-len", type=int, default=SFT_SEQ_LEN, help="SFT: packed length")
    p.add_argument("--batch", type=int, default=SFT_BATCH, help="SFT: sequences a batch")
    p.add_argument("--sft-timeout", type=float, default=1800, help="SFT: seconds a child may run")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    # A measurement child of the SFT part (not for users): one pipeline, one epoch.
    p.add_argument("--child", choices=("stoker", "stoker-warm", "peer"), help=argparse.SUPPRESS)
    p.add_argument("--jsonl", help=argparse.SUPPRESS)
    p.add_argument("--tokdir", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--map-procs", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return (sft_peer_child if a.child == "peer" else sft_stoker_child)(a)
    a.repeat = repeat = a.repeat or (1 if a.quick else 3)
    tag = "quick-" if a.quick else ""
    print(machine_line())
    try:
        import stoker._text  # noqa: F401
    except ImportError as e:
        print(f"this stoker has no text module ({e}): nothing to measure")
        return 1
    import tokenizers
    versions = [f"tokenizers {tokenizers.__version__}"]
    names = ["tiktoken", "sentencepiece"] if a.part != "sft" else []
    if a.part != "tokenizers":
        names += ["transformers", "datasets", "torch"]
    for name in names:
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
    if a.part != "sft":
        for family in a.only.split(","):
            figures[family] = run_family(family, docs, tag, repeat, not a.no_peers)
        summary(figures)
    if a.part != "tokenizers":
        figures["sft"] = run_sft(a, docs, tag)
    if a.json:
        write_json(a.json, figures)
    return 0

if __name__ == "__main__":
    import record  # bench/record.py: a full run's output also goes to bench/results/
    sys.exit(record.run(main))
