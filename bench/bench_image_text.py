#!/usr/bin/env python3
"""Image-text: stoker.TarShards(fields=...) against the peers, side by side in one run (issue 50).

CLIP-style training data, the same for every contender:
* Shards: WebDataset shards written by ``webdataset``'s own ``ShardWriter`` (webdataset 1.0.2
  from ``bash bench/setup_peers.sh imagetext``, in .venv-peers/imagetext/site, which the peers'
  children put on the path of this interpreter: .venv's torch, torchvision and transformers),
  250 samples a shard: ``<key>.jpg`` (the built-in sample data's photographs: real photos at ImageNet-like
  sizes, ``stoker.sample_data``), ``<key>.txt`` (a caption of 4-90 words drawn from Python's
  docstrings, seed 0: a fifth of them over 77 tokens) and ``<key>.json`` (width, height,
  similarity), as img2dataset writes them. Made once in bench/data/image_text/ (git-ignored).
* Tokenizer: a CLIP-style byte-level BPE (lower-cased, ``<|startoftext|> $A <|endoftext|>``,
  padded with ``<|endoftext|>``) that ``tokenizers`` trains on the captions (nothing is
  downloaded), 8,000 tokens.
* Pipeline: RandomResizedCrop(224) + float32 + ImageNet-style normalize (CLIP's mean and std),
  captions padded or cut to 77 ids with their attention mask; batches of 128, shuffled.
Contenders, each in a measurement child of its own (peak RSS of its process tree), one epoch
timed from the iterator's creation (imports and construction before the clock), the shards in
the page cache:
* stoker: ``TarShards(shards, fields={"pixel_values": Image(train), "input_ids": Text(tok,
  max_length=77), "similarity": Json("similarity")})`` in ``stoker.DataLoader(batch_size=128,
  shuffle=True)`` (workers "auto").
* wds-torchvision: ``webdataset.WebDataset(shards, shardshuffle=100).shuffle(1000)
  .decode("pil")`` with torchvision's v2 RandomResizedCrop + ToImage + ToDtype + Normalize per
  image and the ``tokenizers`` tokenizer (padding and truncation to 77) per batch in the collate:
  open_clip's pipeline, in torch's DataLoader at 1 and 2 workers (the faster reported).
* wds-clipprocessor: the same shards with transformers' ``CLIPProcessor`` (its CLIPImageProcessor:
  resize, center crop 224, normalize; and a ``PreTrainedTokenizerFast`` of the same tokenizer)
  in the collate, at 1 and 2 workers.
* litdata (where ``setup_peers.sh imagetext`` installed it, litdata 0.2.76): the same samples
  written once by ``litdata.optimize`` into its own chunks (the JPEG's bytes, the caption, the
  score), read by a ``StreamingDataset(shuffle=True)`` whose ``__getitem__`` decodes and
  transforms as wds-torchvision does, in a ``StreamingDataLoader`` with that collate, at 1 and 2
  workers.
Figure: samples per second, the median of --repeat (stoker; 1 for each peer configuration, the
peers being several times slower). Target: stoker >= 3x the best peer.

Diffusion in aspect-ratio buckets (SDXL's way), the same photographs at their own aspect ratios
(landscape, portrait, square), buckets for 384² pixels in steps of 64
(``AspectBuckets(pixels=384 * 384, step=64)``), batches of 32, each image resized to cover its
bucket, randomly cropped to it, flipped half the time, normalized to [-1, 1], with its original
size, its crop's top-left corner and its caption as 77 ids:
* stoker: ``TarShards(shards, fields={"pixel_values": Image(flip + normalize,
  buckets=AspectBuckets(...)), "input_ids": Text(tok, max_length=77)})`` in
  ``stoker.DataLoader(batch_size=32, shuffle=True)``.
* bucket-sampler: the kohya / diffusers recipe in Python: a map-style dataset over the JPEG files
  (each image's size read from its header by PIL, its bucket the nearest by aspect ratio), a
  batch sampler that shuffles each bucket and yields its batches in a shuffled order, and a
  ``__getitem__`` that decodes with PIL, resizes (BILINEAR) to cover the bucket, crops at a random
  offset, flips, and converts with torchvision's v2 ToImage + ToDtype + Normalize, the captions
  tokenized by ``tokenizers`` in the collate; torch's DataLoader at 1 and 2 workers.
Both check that every batch is of one bucket (one shape, and every image's bucket the batch's).

VLM SFT (bench/image_text_vlm.py): LLaVA-format JSON, one row a photograph (a tenth text-only),
1-3 turns of words, and a LLaVA-1.5 processor saved by transformers (CLIP's 336 resize and center
crop, 576 image tokens an image, the bench's BPE with ``<image>``), batches of 16, shuffled:
input_ids, attention mask, labels on the assistant's tokens only, pixel_values. The processing
(rendering the chat template, tokenizing, the map) is inside the clock.
* stoker: ``VLMDataset("llava.json", "processor/", images=folder)`` in ``stoker.DataLoader``.
* hf-map: ``datasets.Dataset.from_list(rows).map(...)`` running
  ``processor.apply_chat_template(..., tokenize=True, return_assistant_tokens_mask=True)`` (the
  image loaded from its path), torch's DataLoader padding and stacking, at 1 and 2 workers.
* hf-collate (TRL's vision collator): that apply_chat_template on each batch in the collate.
Figure: tokens a second (image tokens included, padding not; every contender counts the same
tokens, checked). Target: >= 3x the best peer, peak RSS <= 0.5x.

    python bench/bench_image_text.py [--quick] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

from harness import emit, machine_line, median_epochs, peer_python, read_files, run_measured, \
    write_json
from image_text_vlm import CROP, VLM_BATCH, child_peer_vlm, child_stoker_vlm, make_vlm_data

HERE = os.path.abspath(__file__)
DATA = Path(__file__).resolve().parent / "data" / "image_text"
BATCH = 128
MAX_LENGTH = 77
MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's
STD = (0.26862954, 0.26130258, 0.27577711)
TARGET = 3.0
DIFFUSION_BATCH = 32
DIFFUSION_PIXELS = 384 * 384
DIFFUSION_STEP = 64


# --- data -------------------------------------------------------------------------------------

def _words():
    import pydoc
    import re
    words = []
    for name in ("json", "os", "re", "collections", "argparse", "subprocess", "threading",
                 "pathlib", "functools", "itertools", "textwrap", "random", "statistics"):
        words += re.findall(r"[A-Za-z]{2,}", pydoc.render_doc(__import__(name),
                                                               renderer=pydoc.plaintext))
    return words


def make_data(quick):
    """The samples (jpg path, caption, json) and the tokenizer; the shards are written by the
    peers' environment (``--child write``). Returns {"samples": [...], "tokenizer": path}."""
    root = DATA / ("quick" if quick else "full")
    manifest = root / "samples.json"
    if manifest.exists():
        return json.loads(manifest.read_text()), root
    from stoker.sample_data import default_sample_root, make_sample
    make_sample(default_sample_root())
    photos = sorted(str(p) for p in (default_sample_root() / "train").rglob("*.JPEG"))
    if not photos:
        photos = sorted(str(p) for p in (default_sample_root() / "train").rglob("*.jp*g"))
    photos = photos[:200] if quick else photos
    rng = random.Random(0)
    words = _words()
    samples = []
    for i, path in enumerate(photos):
        n = rng.randint(4, 90) if rng.random() < 0.2 else rng.randint(4, 30)
        at = rng.randrange(len(words))
        caption = " ".join(words[(at + k) % len(words)] for k in range(n))
        from PIL import Image
        with Image.open(path) as im:
            w, h = im.size
        samples.append({"key": f"{i:06d}", "jpg": path, "txt": caption,
                        "json": {"width": w, "height": h,
                                 "similarity": round(rng.uniform(0.2, 0.45), 4)}})
    root.mkdir(parents=True, exist_ok=True)
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        processors, trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([s["txt"] for s in samples] + words, trainers.BpeTrainer(
        vocab_size=8000, special_tokens=["<|startoftext|>", "<|endoftext|>"],
        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)])
    tokdir = root / "tokenizer"
    tokdir.mkdir(exist_ok=True)
    tok.save(str(tokdir / "tokenizer.json"))
    (tokdir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "model_max_length": MAX_LENGTH}))
    manifest.write_text(json.dumps(samples))
    return samples, root


def shards_of(root):
    return sorted(str(p) for p in (root / "shards").glob("*.tar"))


# --- measurement children ---------------------------------------------------------------------

def child_write(a):
    import webdataset as wds
    root = Path(a.root)
    samples = json.loads((root / "samples.json").read_text())
    (root / "shards").mkdir(exist_ok=True)
    with wds.ShardWriter(str(root / "shards" / "shard-%05d.tar"), maxcount=250,
                         verbose=0) as sink:
        for s in samples:
            with open(s["jpg"], "rb") as f:
                jpg = f.read()
            sink.write({"__key__": s["key"], "jpg": jpg, "txt": s["txt"], "json": s["json"]})
    return {"shards": len(shards_of(root))}


def _litdata_sample(s):
    """One sample as LitData's optimize() stores it: the JPEG's bytes, the caption, the score."""
    with open(s["jpg"], "rb") as f:
        return {"jpg": f.read(), "txt": s["txt"], "similarity": float(s["json"]["similarity"])}


def child_write_litdata(a):
    """The same samples in LitData's own chunked format (litdata.optimize), its peer's input."""
    from litdata import optimize
    root = Path(a.root)
    samples = json.loads((root / "samples.json").read_text())
    optimize(fn=_litdata_sample, inputs=samples, output_dir=str(root / "litdata"),
             chunk_bytes="64MB", num_workers=1, mode="overwrite")
    return {"chunks": len(list((root / "litdata").glob("*.bin")))}


def child_stoker(a):
    import stoker
    from stoker import transforms as T
    from stoker.image_text import Image, Json, Text
    root = Path(a.root)
    train = T.Compose([T.RandomResizedCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    tok = stoker.Tokenizer.from_file(str(root / "tokenizer"))
    ds = stoker.TarShards(shards_of(root), fields={
        "pixel_values": Image(train), "input_ids": Text(tok, max_length=MAX_LENGTH),
        "similarity": Json("similarity")})
    loader = stoker.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0)
    t0 = time.perf_counter()
    samples = 0
    for batch in loader:
        assert batch["input_ids"].shape[1] == MAX_LENGTH
        samples += len(batch["input_ids"])
    return {"wall_s": time.perf_counter() - t0, "samples": samples}


def child_peer(a):
    import torch
    import webdataset as wds
    root = Path(a.root)
    torch.set_num_threads(1)
    if a.peer in ("wds-torchvision", "litdata"):
        from tokenizers import Tokenizer
        from torchvision.transforms import v2
        tok = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
        tok.enable_truncation(MAX_LENGTH)
        tok.enable_padding(length=MAX_LENGTH, pad_id=tok.token_to_id("<|endoftext|>"),
                           pad_token="<|endoftext|>")
        train = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.ToImage(),
                            v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])

        def image(x):
            return train(x.convert("RGB"))

        def collate(rows):
            images, captions, meta = zip(*rows)
            enc = tok.encode_batch(list(captions))
            return {"pixel_values": torch.stack(images),
                    "input_ids": torch.tensor([e.ids for e in enc]),
                    "attention_mask": torch.tensor([e.attention_mask for e in enc]),
                    "similarity": torch.tensor([m["similarity"] for m in meta])}
    else:
        from transformers import CLIPImageProcessor, CLIPProcessor, PreTrainedTokenizerFast
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(root / "tokenizer"))
        processor = CLIPProcessor(image_processor=CLIPImageProcessor(crop_size=224,
                                                                     size={"shortest_edge": 224}),
                                  tokenizer=tokenizer)

        def image(x):
            return x.convert("RGB")

        def collate(rows):
            images, captions, meta = zip(*rows)
            out = processor(text=list(captions), images=list(images), padding="max_length",
                            truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            out["similarity"] = torch.tensor([m["similarity"] for m in meta])
            return out

    if a.peer == "litdata":
        import io

        from litdata import StreamingDataLoader, StreamingDataset
        from PIL import Image as PILImage

        class Samples(StreamingDataset):
            def __getitem__(self, index):
                s = super().__getitem__(index)
                return (image(PILImage.open(io.BytesIO(s["jpg"]))), s["txt"],
                        {"similarity": s["similarity"]})

        loader = StreamingDataLoader(Samples(str(root / "litdata"), shuffle=True, seed=0),
                                     batch_size=BATCH, num_workers=a.workers,
                                     collate_fn=collate)
    else:
        ds = (wds.WebDataset(shards_of(root), shardshuffle=100, empty_check=False)
              .shuffle(1000).decode("pil").to_tuple("jpg", "txt", "json")
              .map_tuple(image, None, None))
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=a.workers,
                                             collate_fn=collate)
    t0 = time.perf_counter()
    samples = 0
    for batch in loader:
        assert batch["input_ids"].shape[1] == MAX_LENGTH
        samples += len(batch["input_ids"])
    return {"wall_s": time.perf_counter() - t0, "samples": samples}


def _diffusion_tokenizer(root):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
    tok.enable_truncation(MAX_LENGTH)
    tok.enable_padding(length=MAX_LENGTH, pad_id=tok.token_to_id("<|endoftext|>"),
                       pad_token="<|endoftext|>")
    return tok


def child_stoker_buckets(a):
    import numpy as np

    import stoker
    from stoker import transforms as T
    from stoker.image_text import AspectBuckets, Image, Text
    root = Path(a.root)
    buckets = AspectBuckets(pixels=DIFFUSION_PIXELS, step=DIFFUSION_STEP)
    after = T.Compose([T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])
    tok = stoker.Tokenizer.from_file(str(root / "tokenizer"))
    ds = stoker.TarShards(shards_of(root), fields={
        "pixel_values": Image(after, buckets=buckets),
        "input_ids": Text(tok, max_length=MAX_LENGTH)})
    logs = np.log([w / h for h, w in buckets.sizes])
    loader = stoker.DataLoader(ds, batch_size=DIFFUSION_BATCH, shuffle=True, seed=0)
    t0 = time.perf_counter()
    samples = batches = 0
    used = set()
    for batch in loader:
        shape = tuple(batch["pixel_values"].shape[2:])
        for h, w in batch["original_sizes"].tolist():  # every image's bucket is the batch's
            assert buckets.sizes[int(np.argmin(np.abs(logs - np.log(w / h))))] == shape
        samples += len(batch["input_ids"])
        batches += 1
        used.add(shape)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "samples": samples, "batches": batches, "buckets": len(used)}


def child_peer_buckets(a):
    import numpy as np
    import torch
    from PIL import Image as PILImage
    from torchvision.transforms import v2
    root = Path(a.root)
    torch.set_num_threads(1)
    samples = json.loads((root / "samples.json").read_text())
    sizes = []  # the kohya make_bucket_resolutions list stoker's AspectBuckets makes
    for w in range(-(-int(round(DIFFUSION_PIXELS ** 0.5) / 2) // DIFFUSION_STEP) * DIFFUSION_STEP,
                   2 * int(round(DIFFUSION_PIXELS ** 0.5)) + 1, DIFFUSION_STEP):
        h = min(2 * int(round(DIFFUSION_PIXELS ** 0.5)),
                DIFFUSION_PIXELS // w // DIFFUSION_STEP * DIFFUSION_STEP)
        if h >= int(round(DIFFUSION_PIXELS ** 0.5) / 2):
            sizes += [(h, w), (w, h)]
    sizes = sorted(set(sizes), key=lambda s: (s[1] / s[0], s))
    logs = np.log([w / h for h, w in sizes])
    tok = _diffusion_tokenizer(root)
    post = v2.Compose([v2.RandomHorizontalFlip(), v2.ToImage(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.5] * 3)])

    class BucketDataset(torch.utils.data.Dataset):
        def __init__(self):
            self.bucket = []
            for s in samples:
                with PILImage.open(s["jpg"]) as im:  # the header only
                    w, h = im.size
                self.bucket.append(int(np.argmin(np.abs(logs - np.log(w / h)))))

        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            s = samples[i]
            bh, bw = sizes[self.bucket[i]]
            im = PILImage.open(s["jpg"]).convert("RGB")
            scale = max(bh / im.height, bw / im.width)
            rw, rh = max(bw, round(im.width * scale)), max(bh, round(im.height * scale))
            original = (im.height, im.width)
            im = im.resize((rw, rh), PILImage.BILINEAR)
            top, left = random.randint(0, rh - bh), random.randint(0, rw - bw)
            im = im.crop((left, top, left + bw, top + bh))
            return post(im), original, (top, left), s["txt"], self.bucket[i]

    class BucketBatchSampler(torch.utils.data.Sampler):
        def __init__(self, buckets, batch_size, seed=0):
            self.by_bucket = {}
            for i, b in enumerate(buckets):
                self.by_bucket.setdefault(b, []).append(i)
            self.batch_size, self.seed, self.epoch = batch_size, seed, 0

        def __iter__(self):
            rng = random.Random(self.seed + self.epoch)
            out = []
            for idx in self.by_bucket.values():
                idx = idx[:]
                rng.shuffle(idx)
                out += [idx[k:k + self.batch_size] for k in range(0, len(idx), self.batch_size)]
            rng.shuffle(out)
            return iter(out)

        def __len__(self):
            return sum(-(-len(v) // self.batch_size) for v in self.by_bucket.values())

    def collate(rows):
        pixels, original, crops, captions, buckets = zip(*rows)
        assert len(set(buckets)) == 1
        enc = tok.encode_batch(list(captions))
        return {"pixel_values": torch.stack(pixels), "original_sizes": torch.tensor(original),
                "crop_top_lefts": torch.tensor(crops),
                "input_ids": torch.tensor([e.ids for e in enc])}

    ds = BucketDataset()
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=BucketBatchSampler(ds.bucket, DIFFUSION_BATCH), num_workers=a.workers,
        collate_fn=collate)
    t0 = time.perf_counter()
    n = batches = 0
    used = set()
    for batch in loader:
        n += len(batch["input_ids"])
        batches += 1
        used.add(tuple(batch["pixel_values"].shape[2:]))
    return {"wall_s": time.perf_counter() - t0, "samples": n, "batches": batches,
            "buckets": len(used)}


CHILDREN = {"write": child_write, "write-litdata": child_write_litdata, "stoker": child_stoker,
            "peer": child_peer, "stoker-buckets": child_stoker_buckets,
            "peer-buckets": child_peer_buckets, "stoker-vlm": child_stoker_vlm,
            "peer-vlm": child_peer_vlm}


# --- the parent -------------------------------------------------------------------------------

PEER_SITE = Path(__file__).resolve().parent.parent / ".venv-peers" / "imagetext" / "site"


def peer_env():
    """This interpreter's environment with webdataset (.venv-peers/imagetext/site) on its path."""
    path = os.pathsep.join(p for p in (str(PEER_SITE), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path)


def measure(args, repeat, timeout, samples, env=None):
    out = median_epochs([sys.executable, HERE, "--child", *args], repeat, samples, env=env,
                        timeout=timeout)
    if "wall_s" in out:
        out["samples_per_s"] = samples / out["wall_s"]
        if "tokens" in out:
            out["tokens_per_s"] = out["tokens"] / out["wall_s"]
    return out


def report(rows, counts=False, also="", rate="samples", rss_target=None):
    """Prints the contenders' table and stoker's ratio to the best peer in ``rate`` ("samples"
    or "tokens" a second); whether it meets TARGET (and peak RSS at most ``rss_target`` times
    the best peer's, where given). ``counts``: also each one's batches and buckets used."""
    key = f"{rate}_per_s"
    extra = f" {'batches':>8} {'buckets':>8}" if counts else ""
    extra += f" {'tokens':>9}" if rate == "tokens" else ""
    print(f"\n  {'contender':<22} {rate + '/s':>10} {'peak RSS':>10}{extra}")
    for k, r in rows.items():
        if key not in r:
            print(f"  {k:<22} failed: {r.get('error', '?')[:80]}")
            continue
        extra = f" {r.get('batches', 0):>8} {r.get('buckets', 0):>8}" if counts else ""
        extra += f" {r.get('tokens', 0):>9,}" if rate == "tokens" else ""
        print(f"  {k:<22} {r[key]:>10,.1f} {r['peak_rss'] / 2**20:>8,.0f} MiB{extra}")
    peers = [r for k, r in rows.items() if k != "stoker" and key in r]
    if not peers or key not in rows["stoker"]:
        return False
    best = max(peers, key=lambda r: r[key])
    name = next(k for k, r in rows.items() if r is best)
    ratio = rows["stoker"][key] / best[key]
    rss = rows["stoker"]["peak_rss"] / best["peak_rss"]
    goal = f" (target <= {rss_target})" if rss_target else ""
    print(f"\n  stoker / best peer ({name}): {ratio:.2f}x (target >= {TARGET}); peak RSS "
          f"{rss:.2f}x{goal}{also}")
    return ratio >= TARGET and (rss_target is None or rss <= rss_target)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 200 samples, 1 round")
    p.add_argument("--repeat", type=int, help="rounds of stoker (median; 3, --quick 1)")
    p.add_argument("--peer-repeat", type=int, default=1, help="rounds of each peer configuration")
    p.add_argument("--timeout", type=float, default=900, help="seconds a child may run")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--peer", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        emit(CHILDREN[a.child](a))
        return 0
    repeat = a.repeat or (1 if a.quick else 3)
    print(machine_line())
    try:
        import stoker.image_text  # noqa: F401
        import stoker._text  # noqa: F401
    except ImportError as e:
        print(f"this stoker has no text module ({e}): nothing to measure")
        return 1
    if peer_python("imagetext") is None:
        print("no webdataset (bash bench/setup_peers.sh imagetext): nothing to compare")
        return 1
    samples, root = make_data(a.quick)
    if not shards_of(root):
        run_measured([sys.executable, HERE, "--child", "write", "--root", str(root)],
                     env=peer_env(), timeout=a.timeout)
    has_litdata = (PEER_SITE / "litdata").is_dir()  # setup_peers.sh imagetext installs it
    if has_litdata and not (root / "litdata" / "index.json").exists():
        run_measured([sys.executable, HERE, "--child", "write-litdata", "--root", str(root)],
                     env=peer_env(), timeout=a.timeout)
    shards = shards_of(root)
    read_files(shards + sorted(str(p) for p in (root / "litdata").glob("*.bin")))
    n = len(samples)
    size = sum(os.path.getsize(s) for s in shards)
    print(f"data: {n} samples in {len(shards)} shards written by webdataset's ShardWriter "
          f"({size / 2**20:.0f} MiB; the built-in sample data's photographs, captions of 4-90 "
          f"words), batches of {BATCH}, RandomResizedCrop(224) + normalize, 77-token captions")
    common = ["--root", str(root)]
    rows = {"stoker": measure(["stoker", *common], repeat, a.timeout, n)}
    for name in ("wds-torchvision", "wds-clipprocessor") + (("litdata",) if has_litdata else ()):
        for w in (1, 2):
            rows[f"{name}-w{w}"] = measure(["peer", *common, "--peer", name, "--workers", str(w)],
                                           a.peer_repeat, a.timeout, n, peer_env())
    ok = report(rows)
    print(f"\ndiffusion: the same {n} photographs at their own aspect ratios, buckets for "
          f"{int(DIFFUSION_PIXELS ** 0.5)}² pixels in steps of {DIFFUSION_STEP}, batches of "
          f"{DIFFUSION_BATCH} of one bucket, resize to cover + random crop + flip + normalize, "
          f"original sizes, crops and 77-token captions")
    diffusion = {"stoker": measure(["stoker-buckets", *common], repeat, a.timeout, n)}
    for w in (1, 2):
        diffusion[f"bucket-sampler-w{w}"] = measure(
            ["peer-buckets", *common, "--workers", str(w)], a.peer_repeat, a.timeout, n)
    ok_diffusion = report(diffusion, counts=True, also="; every batch of one bucket in both")
    vlm = make_vlm_data(root, samples, _words())
    print(f"\nVLM SFT: {n} LLaVA-format conversations (1-3 turns, a tenth text-only) over the "
          f"same photographs, a LLaVA-1.5 processor (CLIP {CROP} resize + center crop + "
          f"normalize, {(CROP // 14) ** 2} image tokens an image), input_ids, assistant-only "
          f"labels and pixel_values, batches of {VLM_BATCH}; the processing (rendering, "
          f"tokenizing, the map) inside the clock")
    read_files([str(vlm / "llava.json")] + [s["jpg"] for s in samples])
    vlm_rows = {"stoker": measure(["stoker-vlm", *common], repeat, a.timeout, n)}
    for name in ("hf-map", "hf-collate"):
        for w in (1, 2):
            vlm_rows[f"{name}-w{w}"] = measure(
                ["peer-vlm", *common, "--peer", name, "--workers", str(w)], a.peer_repeat,
                a.timeout, n)
    tokens = {r.get("tokens") for r in vlm_rows.values() if "tokens" in r}
    same = "; the same tokens in every contender" if len(tokens) == 1 else \
        f"; TOKENS DIFFER: {sorted(tokens)}"
    ok_vlm = report(vlm_rows, also=same, rate="tokens", rss_target=0.5) and len(tokens) == 1
    if a.json:
        write_json(a.json, {"samples": n, "rows": rows, "diffusion": diffusion,
                            "vlm": vlm_rows})
    print("\ntargets met" if ok and ok_diffusion and ok_vlm else "\ntarget missed (above)")
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: a full run's output also goes to bench/results/
    sys.exit(record.run(main))
