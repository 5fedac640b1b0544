"""Seed corpora for the fuzz targets, made from Stoker's sample data (``stoker make-sample``).

``python fuzz/make_seeds.py OUT`` writes ``OUT/<target>/<name>`` for the targets jpeg, png, tar,
tokens, npy and megatron, and the text wing's jsonl, tokenizer and chat_template (tokenizer.json
files of every model family trained on a few lines by Hugging Face ``tokenizers``, chat templates
of the shapes models ship, JSONL rows plain, gzip and zstd), and audio (tiny WAVs and a FLAC). ``--small`` writes only the small seeds (every file a few KB: photos
scaled down to 24-40 px); those are committed in ``fuzz/corpus/``. Without it, the larger seeds are added:
sample JPEGs as they are, photos at 96-192 px, a slice of a real sample shard. Both are
deterministic for a given sample dataset.

Every seed is what its target reads: image seeds end with parameter bytes (the image targets
take their transforms and random key from the input's last bytes, see fuzz/image_fuzz.h), tar
and token seeds end with the bytes that say where to cut the file.

The PNG seeds are written by a small encoder here, not by Pillow, because Pillow writes neither
Adam7-interlaced files nor every bit depth and filter: those are the paths of libpng and of
Stoker's PNG reader worth covering.
"""

from __future__ import annotations

import argparse
import io
import struct
import sys
import tarfile
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


TARGETS = ("jpeg", "png", "tar", "tokens", "npy", "table", "megatron", "jsonl", "tokenizer",
           "chat_template", "audio")


# --------------------------------------------------------------------------- FuzzedDataProvider

def fdp_tail(values):
    """Bytes to append so that FuzzedDataProvider, which consumes integers from the end of the
    input (the first byte consumed is the most significant), reads ``values``: (value, nbytes)
    pairs in the order the target consumes them."""
    consumed = []
    for value, nbytes in values:
        consumed += [(value >> (8 * (nbytes - 1 - i))) & 0xFF for i in range(nbytes)]
    return bytes(reversed(consumed))


def image_tail(rng):
    """Random pipeline parameters (fuzz/image_fuzz.h takes whatever the bytes say); the first
    consumed byte is odd, so the input is one image, without a primer."""
    tail = bytearray(rng.integers(0, 256, 48, dtype=np.uint8).tobytes())
    tail[-1] |= 1
    return bytes(tail)


def _bytes_for_range(r):
    """How many bytes FuzzedDataProvider's ConsumeIntegralInRange takes for a range of r."""
    n = 0
    while n < 8 and (r >> (8 * n)) > 0:
        n += 1
    return n


def primed_image(primer, image, rng):
    """An image-target input whose primer (decoded first by the scratch under test) is `primer`:
    [primer][image][params][primer length][a byte that says "primed"]."""
    body = primer + image + rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    nsplit = next(n for n in range(1, 9) if _bytes_for_range(len(body) + n) == n)
    return body + fdp_tail([(0, 1), (len(primer), nsplit)])


def without_segments(jpeg, marker):
    """The JPEG without its marker segments of type `marker` (0xDB: DQT, 0xC4: DHT)."""
    out, pos = bytearray(jpeg[:2]), 2
    while pos + 4 <= len(jpeg) and jpeg[pos] == 0xFF and jpeg[pos + 1] != 0xDA:
        length = int.from_bytes(jpeg[pos + 2:pos + 4], "big")
        if jpeg[pos + 1] != marker:
            out += jpeg[pos:pos + 2 + length]
        pos += 2 + length
    return bytes(out + jpeg[pos:])


# --------------------------------------------------------------------------- the sample photos

def sample_jpegs(count):
    """`count` sample JPEGs: the first progressive and the first grayscale file, then others
    spread over the dataset, as (name, bytes)."""
    from stoker import sample_data

    root = Path(sample_data.default_sample_root())
    sample_data.make_sample(root)  # cached: built once per machine
    files = sorted((root / "train").rglob("*.JPEG"))
    picked, seen = [], set()

    def take(path):
        if path not in seen and len(picked) < count:
            seen.add(path)
            picked.append(path)

    for path in files:
        with Image.open(path) as im:
            if im.info.get("progressive") and not any(
                    Image.open(p).info.get("progressive") for p in picked):
                take(path)
            if im.mode == "L" and not any(Image.open(p).mode == "L" for p in picked):
                take(path)
    for path in files[:: max(1, len(files) // count)]:
        take(path)
    return [(p.stem, p.read_bytes()) for p in picked]


def scaled(jpeg_bytes, long_side):
    im = Image.open(io.BytesIO(jpeg_bytes)).convert("RGB")
    w, h = im.size
    f = long_side / max(w, h)
    return im.resize((max(1, round(w * f)), max(1, round(h * f))), Image.BILINEAR)


def jpeg_variants(im):
    """(suffix, bytes): the JPEG encodings libjpeg-turbo decodes differently."""
    out = []

    def save(suffix, image, **kw):
        buf = io.BytesIO()
        image.save(buf, "JPEG", **kw)
        out.append((suffix, buf.getvalue()))

    save("420", im, quality=75, subsampling=2)
    save("444", im, quality=95, subsampling=0)
    save("422", im, quality=85, subsampling=1)
    save("progressive", im, quality=80, progressive=True)
    save("optimized", im, quality=70, optimize=True)
    save("gray", im.convert("L"), quality=80)
    save("cmyk", im.convert("CMYK"), quality=80)  # Adobe marker, inverted CMYK
    return out


# --------------------------------------------------------------------------- a PNG encoder

def _chunk(kind, data):
    return (len(data).to_bytes(4, "big") + kind + data
            + zlib.crc32(kind + data).to_bytes(4, "big"))


def _pack(samples, depth):
    """One row of samples (ints) at `depth` bits, MSB first, padded to a byte."""
    if depth >= 8:
        return b"".join(int(s).to_bytes(depth // 8, "big") for s in samples)
    out, acc, bits = bytearray(), 0, 0
    for s in samples:
        acc = (acc << depth) | int(s)
        bits += depth
        if bits == 8:
            out.append(acc)
            acc = bits = 0
    if bits:
        out.append(acc << (8 - bits))
    return bytes(out)


def _filter(raw_rows, bpp, first_filter):
    """Filters each row, cycling through the five filter types."""
    out, prev = bytearray(), bytes(len(raw_rows[0])) if raw_rows else b""
    for i, row in enumerate(raw_rows):
        ftype = (first_filter + i) % 5
        f = bytearray(len(row))
        for x, v in enumerate(row):
            a = row[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if ftype == 0:
                pred = 0
            elif ftype == 1:
                pred = a
            elif ftype == 2:
                pred = b
            elif ftype == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            f[x] = (v - pred) & 0xFF
        out += bytes([ftype]) + f
        prev = row
    return bytes(out)


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))


def encode_png(samples, color_type, depth, interlace=False, palette=None, trns=None,
               extra_chunks=()):
    """samples: (H, W, channels) integers already at `depth` bits (palette indices for type 3)."""
    h, w, channels = samples.shape
    bpp = max(1, channels * depth // 8)
    if interlace:
        passes = [samples[y0::dy, x0::dx] for x0, y0, dx, dy in _ADAM7]
    else:
        passes = [samples]
    data = b""
    for i, sub in enumerate(passes):
        if sub.shape[0] == 0 or sub.shape[1] == 0:
            continue  # empty passes are not stored
        rows = [_pack(sub[y].reshape(-1), depth) for y in range(sub.shape[0])]
        data += _filter(rows, bpp, first_filter=i)
    ihdr = (w.to_bytes(4, "big") + h.to_bytes(4, "big")
            + bytes([depth, color_type, 0, 0, 1 if interlace else 0]))
    out = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
    for kind, payload in extra_chunks:
        out += _chunk(kind, payload)
    if palette is not None:
        out += _chunk(b"PLTE", bytes(np.asarray(palette, np.uint8).reshape(-1)))
    if trns is not None:
        out += _chunk(b"tRNS", trns)
    return out + _chunk(b"IDAT", zlib.compress(data, 9)) + _chunk(b"IEND", b"")


def png_variants(im):
    """(suffix, bytes) over the colour types, bit depths, interlacing and palettes."""
    rgb = np.asarray(im.convert("RGB"), np.uint16)
    gray = np.asarray(im.convert("L"), np.uint16)[..., None]
    alpha = (np.arange(rgb.shape[1], dtype=np.uint16)[None, :, None] * 37 % 256
             * np.ones((rgb.shape[0], 1, 1), np.uint16))
    pal_im = im.convert("P", palette=Image.ADAPTIVE, colors=16)
    idx = np.asarray(pal_im, np.uint16)[..., None]
    pal = np.asarray(pal_im.getpalette()[:48], np.uint8).reshape(16, 3)
    text = ((b"tEXt", b"Comment\x00stoker fuzz seed"), (b"gAMA", (45455).to_bytes(4, "big")))
    return [
        ("rgb8", encode_png(rgb, 2, 8, extra_chunks=text)),
        ("rgb8-adam7", encode_png(rgb, 2, 8, interlace=True)),
        ("rgb16", encode_png(rgb * 257, 2, 16)),
        ("rgba8", encode_png(np.concatenate([rgb, alpha], 2), 6, 8)),
        ("rgba16-adam7", encode_png(np.concatenate([rgb, alpha], 2) * 257, 6, 16, interlace=True)),
        ("ga8", encode_png(np.concatenate([gray, alpha], 2), 4, 8)),
        ("gray8", encode_png(gray, 0, 8)),
        ("gray16", encode_png(gray * 257, 0, 16)),
        ("gray4-adam7", encode_png(gray >> 4, 0, 4, interlace=True)),
        ("gray2", encode_png(gray >> 6, 0, 2)),
        ("gray1", encode_png(gray >> 7, 0, 1, trns=(1).to_bytes(2, "big"))),
        ("pal8-trns", encode_png(idx, 3, 8, palette=pal, trns=bytes(range(0, 256, 16)))),
        ("pal4", encode_png(idx, 3, 4, palette=pal)),
        ("pal1-adam7", encode_png(idx & 1, 3, 1, interlace=True, palette=pal[:2])),
    ]


# --------------------------------------------------------------------------- tar shards

def _end_of_archive(data):
    """A tar cut after its two zero blocks (tarfile pads to 10 KiB records)."""
    pos = 0
    while pos + 512 <= len(data) and any(data[pos:pos + 512]):
        size_field = data[pos + 124:pos + 136]
        size = (int.from_bytes(size_field[1:], "big") if size_field[0] & 0x80
                else int(size_field.strip(b" \0") or b"0", 8))
        pos += 512 + (size + 511) // 512 * 512
    return data[:pos + 1024]


def make_tar(members, fmt, pax_headers=None):
    """members: (name, bytes) or (name, None) for a directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, pax_headers=pax_headers) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return _end_of_archive(buf.getvalue())


def base256_size(tar_bytes):
    """The first member's size field rewritten in GNU base-256 form (checksum fixed)."""
    h = bytearray(tar_bytes[:512])
    size = int(h[124:136].strip(b" \0") or b"0", 8)
    h[124:136] = b"\x80" + size.to_bytes(11, "big")
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h) + tar_bytes[512:]


def tar_seeds(jpeg, png, label_text=b"7"):
    deep = "d/" + "n" * 120 + "/"  # past ustar's 100-byte name: GNU 'L' or pax path records
    samples = [("a.jpg", jpeg), ("a.cls", label_text), ("./b.PNG", png), ("./b.cls", b" -3\n"),
               ("dir", None), ("c.jpeg", jpeg), ("c.cls", b"12"), ("c.json", b"{}")]
    long_names = [(deep + "x.jpg", jpeg), (deep + "x.cls", b"1")]
    ustar = make_tar(samples, tarfile.USTAR_FORMAT)
    return {
        "ustar.tar": ustar,
        "gnu-longname.tar": make_tar(samples[:2] + long_names, tarfile.GNU_FORMAT),
        "pax.tar": make_tar(samples[:4] + long_names, tarfile.PAX_FORMAT),
        "pax-global.tar": make_tar(samples[:2], tarfile.PAX_FORMAT,
                                   pax_headers={"comment": "stoker"}),
        "base256.tar": base256_size(ustar),
    }


# --------------------------------------------------------------------------- tokens and .npy

def llmc(tokens, version, count=None):
    header = np.zeros(256, "<i4")
    header[:3] = (20240520, version, len(tokens) if count is None else count)
    return header.tobytes() + tokens.tobytes()


def npy_bytes(array, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, array)
    else:
        np.lib.format.write_array(buf, array, version=version)
    return buf.getvalue()


def token_seeds(source_bytes):
    ids = np.frombuffer(source_bytes[: 2 * 400], "<u2").copy()
    ids32 = ids.astype("<u4") * 3
    # Tail: dtype (1 byte: odd = uint16), seq_len - 1 (2 bytes), cut (2 bytes).
    def tail(uint16, seq_len, cut):
        return fdp_tail([(1 if uint16 else 0, 1), (seq_len - 1, 2), (cut, 2)])
    return {
        "raw-u16": ids.tobytes() + tail(True, 16, 65535),
        "raw-u32": ids32.tobytes() + tail(False, 7, 40000),
        "llmc-v1": llmc(ids, 1) + tail(True, 32, 65535),
        "llmc-v2": llmc(ids32, 2) + tail(False, 5, 50000),
        "llmc-short": llmc(ids[:100], 1, count=300) + tail(True, 8, 65535),
        "npy-u2": npy_bytes(ids) + tail(True, 10, 60000),
        "npy-u4-v2": npy_bytes(ids32, version=(2, 0)) + tail(False, 3, 65535),
        "npy-2d": npy_bytes(ids[:100].reshape(10, 10)) + tail(True, 4, 65535),
    }


def npy_seeds(pixels):
    """pixels: a small (H, W, 3) uint8 crop of a sample photo."""
    f = pixels.astype(np.float32) / 255
    return {
        "u8-hwc": npy_bytes(pixels),
        "f4": npy_bytes(f),
        "f2": npy_bytes(f.astype(np.float16)),
        "f8-fortran": npy_bytes(np.asfortranarray(f.astype(np.float64))),
        "i2": npy_bytes(pixels.astype(np.int16) - 128),
        "i8-labels": npy_bytes(np.arange(pixels.shape[0], dtype=np.int64)),
        "b1": npy_bytes(pixels[..., 0] > 127),
        "c8": npy_bytes(f[..., 0] + 1j * f[..., 1]),
        "c16-v3": npy_bytes((f[..., 0] + 1j * f[..., 1]).astype(np.complex128), version=(3, 0)),
        "u4-v2": npy_bytes(pixels.astype(np.uint32), version=(2, 0)),
        "scalar": npy_bytes(np.float32(0.5)),
        "empty": npy_bytes(np.zeros((0, 3), np.uint8)),
        "big-endian": npy_bytes(f.astype(">f4")),
        "structured": npy_bytes(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i2")])),
    }


# --------------------------------------------------------------------------- Megatron .bin/.idx

MEGATRON_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}


def megatron_pair(documents, dtype, modes=False):
    """(idx, bin) as Megatron-LM's IndexedDatasetBuilder writes them: documents are lists of
    sequences; the .idx is _IndexWriter's (magic, version 1, dtype code, sequence and document
    index counts, int32 lengths, int64 byte pointers, int64 document indices from 0, and int8
    modes for a multimodal dataset)."""
    lengths, doc_idx, data = [], [0], b""
    for doc in documents:
        for seq in doc:
            a = np.asarray(seq, dtype)
            data += a.tobytes()
            lengths.append(a.size)
        doc_idx.append(len(lengths))
    item = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype("<i8") * item
    idx = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, MEGATRON_CODES[dtype], len(lengths),
                                                len(doc_idx))
           + np.asarray(lengths, "<i4").tobytes() + pointers[:len(lengths)].tobytes()
           + np.asarray(doc_idx, "<i8").tobytes())
    if modes:
        idx += bytes(len(lengths))
    return idx, data


def megatron_seeds():
    """Inputs of fuzz_megatron: [.idx][.bin][tail]; the tail gives the .idx's length (2 bytes),
    flags (1 byte: bit 0 a vocabulary of 32 + id, bit 1 the .bin also as a flat file split at
    id, id = flags >> 2) and where to cut the .bin (2 bytes). Deterministic (no sample data)."""
    rng = np.random.default_rng(7)

    def docs(n, high):
        return [[rng.integers(0, high, rng.integers(0, 12)) for _ in range(rng.integers(1, 4))]
                for _ in range(n)]

    def seed(pair, flags, cut):
        idx, data = pair
        return idx + data + fdp_tail([(len(idx), 2), (flags, 1), (cut, 2)])

    return {
        "u16-split": seed(megatron_pair(docs(12, 40), np.uint16), (5 << 2) | 2, 40000),
        "i32-vocab": seed(megatron_pair(docs(8, 36), np.int32), (3 << 2) | 1, 65535),
        "u8-multimodal": seed(megatron_pair(docs(6, 200) + [[]], np.uint8, modes=True), 0,
                              20000),
        "i64-negative": seed(megatron_pair(docs(5, 50) + [[[-3, 4]]], np.int64), 0, 65535),
        "i16-vocab-split": seed(megatron_pair(docs(4, 33), np.int16), (0 << 2) | 3, 50000),
    }


# --------------------------------------------------------------------------- the text wing

_TEXT = ("The quick brown fox jumps over the lazy dog. Hello, world! naïve café, 東京 🙂\n"
         "def f(x):\n    return x * 2  # tabs\tand   spaces\n") * 3


def fdp_string(s):
    """Bytes FuzzedDataProvider's ConsumeRandomLengthString reads back as ``s`` (a backslash is
    doubled; a backslash and another byte end the string)."""
    return s.replace(b"\\", b"\\\\") + b"\\\n"


def tokenizer_jsons():
    """Small tokenizer.json files of each model family, made by Hugging Face tokenizers."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    corpus = [_TEXT]
    out = {}

    bl = Tokenizer(models.BPE())
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bl.decoder = decoders.ByteLevel()
    bl.post_processor = processors.ByteLevel(trim_offsets=True)
    bl.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=290, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out["bpe-byte-level"] = bl

    sp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    sp.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                          normalizers.Replace(" ", "▁")])
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    sp.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"]
        + [f"<0x{b:02X}>" for b in range(0, 256, 17)]))
    sp.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    out["bpe-byte-fallback"] = sp

    ms = Tokenizer(models.BPE(unk_token="<unk>"))
    ms.pre_tokenizer = pre_tokenizers.Metaspace()
    ms.decoder = decoders.Metaspace()
    ms.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=90, special_tokens=["<unk>"]))
    out["bpe-metaspace"] = ms

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    wp.train_from_iterator(corpus, trainers.WordPieceTrainer(
        vocab_size=100, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]))
    wp.post_processor = processors.BertProcessing(("[SEP]", 2), ("[CLS]", 1))
    out["wordpiece"] = wp

    ug = Tokenizer(models.Unigram())
    ug.normalizer = normalizers.NFKC()
    ug.pre_tokenizer = pre_tokenizers.Metaspace()
    ug.decoder = decoders.Metaspace()
    ug.train_from_iterator(corpus, trainers.UnigramTrainer(
        vocab_size=60, special_tokens=["<unk>"], unk_token="<unk>"))
    out["unigram"] = ug
    return {name: t.to_str() for name, t in out.items()}


_CHAT_TEMPLATES = {
    "generation": (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}<|assistant|>"
        "{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}{% else %}<|{{ m['role'] }}|>"
        "{{ m['content'] | trim }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"),
    "chatml-tools": (
        "{%- if tools %}<|im_start|>system\n{{ tools | tojson(indent=2) }}<|im_end|>\n{%- endif %}"
        "{%- for message in messages %}{%- if loop.first and message.role != 'system' %}"
        "<|im_start|>system\nYou are helpful.<|im_end|>\n{%- endif %}"
        "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
        "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"),
    "llama-raise": (
        "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
        "{% set system_message = messages[0]['content'] %}{% else %}"
        "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
        "{% for message in loop_messages %}{% if (message['role'] == 'user') != "
        "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}"
        "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
        "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
        "{% else %}{% set content = message['content'] %}{% endif %}"
        "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
        "{% endif %}{% endfor %}"),
    "macros-namespace": (
        "{% macro render(m, sep='\\n') %}{{ m.role | upper }}: {{ m.content }}{{ sep }}{% endmacro %}"
        "{% set ns = namespace(n=0, last='') %}{% for m in messages if m.content %}"
        "{% set ns.n = ns.n + 1 %}{% set ns.last = m.role %}{{ render(m) }}"
        "{% if loop.last %}[{{ ns.n }} {{ ns.last }} {{ loop.length }}]{% endif %}{% endfor %}"
        "{{ messages | map(attribute='role') | join(',') }}"
        "{{ (messages | selectattr('role', 'equalto', 'user') | list | length) * 2 }}"
        "{% for k, v in {'a': 1, 'b': [1, 2.5, none]} | dictsort %}{{ k }}={{ v }};{% endfor %}"
        "{{ '%s'|length }}{{ range(3)|list }}{{ 'a,b'.split(',') }}{{ 7 // 2 }}{{ 2 ** 10 }}"
        "{% raw %}{{ raw }}{% endraw %}{# comment #}{{ strftime_now('%Y') | length }}"),
}

_CONVERSATION = {
    "messages": [{"role": "system", "content": " Be brief. "},
                 {"role": "user", "content": "Hi! naïve 🙂"},
                 {"role": "assistant", "content": "Hello."},
                 {"role": "user", "content": "2+2?"},
                 {"role": "assistant", "content": "4"}],
    "tools": [{"type": "function", "function": {"name": "add", "parameters": {"a": 1}}}],
    "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>",
}


def text_seeds():
    """{target: {name: bytes}} for jsonl, tokenizer and chat_template (all small)."""
    import gzip
    import json

    import zstandard

    out = {"jsonl": {}, "tokenizer": {}, "chat_template": {}}
    for name, tok in tokenizer_jsons().items():
        for flags in (0, 3):
            out["tokenizer"][f"{name}-{flags}"] = (fdp_string(tok.encode())
                                                   + _TEXT[:120].encode() + bytes([flags]))
    out["tokenizer"]["bpe-byte-level-invalid-utf8"] = (
        fdp_string(tokenizer_jsons()["bpe-byte-level"].encode()) + b"ab\xff\xc3(" + bytes([1]))

    for name, source in _CHAT_TEMPLATES.items():
        context = dict(_CONVERSATION)
        if name == "llama-raise":
            context["messages"] = _CONVERSATION["messages"][1:]
        out["chat_template"][name] = fdp_string(source.encode()) + json.dumps(context).encode()
    out["chat_template"]["raise"] = (fdp_string(_CHAT_TEMPLATES["llama-raise"].encode())
                                     + json.dumps(_CONVERSATION).encode())

    text_rows = "".join(json.dumps({"text": line, "id": i}) + "\n"
                        for i, line in enumerate(_TEXT.splitlines()))
    text_rows += '\n{"text": "the end"}\r\n{"text": 5}\nnot json\n{"other": "x"}\n'
    conv = dict(_CONVERSATION)
    del conv["add_generation_prompt"]
    chat_rows = (json.dumps({"messages": conv["messages"], "tools": conv["tools"]}) + "\n"
                 + json.dumps({"messages": conv["messages"][1:3]}) + "\n"
                 + '{"messages": "not a list"}\n{"messages": [{"role": "user"}]}\n')
    clean_text = "".join(json.dumps({"text": line}) + "\n" for line in _TEXT.splitlines()[:3])
    clean_chat = json.dumps({"messages": conv["messages"]}) + "\n"
    out["jsonl"]["text-clean"] = bytes([0]) + clean_text.encode()
    out["jsonl"]["messages-clean-2threads"] = bytes([4 | 16]) + clean_chat.encode()
    for mode, rows in ((0, text_rows), (4, chat_rows)):
        data = rows.encode()
        kind = "text" if mode == 0 else "messages"
        out["jsonl"][f"{kind}-plain"] = bytes([mode]) + data
        out["jsonl"][f"{kind}-plain-max8-2threads"] = bytes([mode | 8 | 16]) + data
        out["jsonl"][f"{kind}-gz"] = bytes([mode | 1]) + gzip.compress(data, mtime=0)
        out["jsonl"][f"{kind}-zst"] = bytes([mode | 2]) + zstandard.ZstdCompressor().compress(data)
    return out


# --------------------------------------------------------------------------- audio

def wav_bytes(samples, rate, sampwidth=2):
    """A PCM WAV (Python's wave module) of float samples [T, channels] in [-1, 1]."""
    import wave
    scale = {1: 127, 2: 32767}[sampwidth]
    pcm = np.round(samples * scale).astype(np.int16 if sampwidth == 2 else np.int8)
    if sampwidth == 1:  # 8-bit WAV is unsigned
        pcm = (pcm.astype(np.int16) + 128).astype(np.uint8)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(sampwidth)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def encoded_audio(samples, rate, fmt, codec):
    """``samples`` encoded with PyAV (its wheel has the encoders); None without PyAV."""
    try:
        import av
    except ImportError:
        return None
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        s = out.add_stream(codec, rate=rate, layout="mono" if samples.shape[1] == 1 else "stereo")
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(np.round(samples.T * 32767).astype(np.int16)).reshape(1, -1),
            format="s16", layout="mono" if samples.shape[1] == 1 else "stereo")
        frame.sample_rate = rate
        for packet in s.encode(frame):
            out.mux(packet)
        for packet in s.encode(None):
            out.mux(packet)
    return buf.getvalue()


def audio_seeds():
    """fuzz_audio's seeds: tiny WAVs (16-bit mono, 8-bit stereo) and a FLAC (PyAV), each
    followed by the seven bytes the target reads from the end (fuzz/fuzz_audio.cc: the speed,
    the duration and offset in ms, mono, the rate's index, in the order FuzzedDataProvider takes
    them from the end)."""
    t = np.arange(800) / 8000
    tone = 0.5 * np.sin(2 * np.pi * 440 * t)[:, None]
    stereo = np.concatenate([tone, 0.5 * np.sin(2 * np.pi * 660 * t)[:, None]], axis=1)

    def tail(rate_index, mono, offset_ms, duration_ms, speed_index):
        # FuzzedDataProvider takes each integer's bytes from the end, the first it takes the most
        # significant: little-endian in file order, the first value consumed last.
        return bytes([speed_index]) + duration_ms.to_bytes(2, "little") + \
            offset_ms.to_bytes(2, "little") + bytes([mono, rate_index])

    out = {"tone-8k-s16.wav": wav_bytes(tone, 8000) + tail(1, 1, 0, 0, 0),
           "tone-8k-s16-cut-fast.wav": wav_bytes(tone, 8000) + tail(0, 1, 20, 50, 2),
           "stereo-8k-u8.wav": wav_bytes(stereo, 8000, 1) + tail(4, 0, 0, 0, 1)}
    flac = encoded_audio(np.repeat(tone, 2, axis=0), 16000, "flac", "flac")
    if flac is not None:
        out["tone-16k.flac"] = flac + tail(1, 1, 10, 0, 1)
    return out


# --------------------------------------------------------------------------- all seeds

def seeds(small):
    """{target: {name: bytes}}."""
    rng = np.random.default_rng(0)
    photos = sample_jpegs(4)
    out = {t: {} for t in TARGETS}
    sizes = (24, 40) if small else (96, 192)
    for stem, data in photos[:3]:
        for side in sizes[:1] if small else sizes:
            im = scaled(data, side)
            for suffix, jpg in jpeg_variants(im):
                out["jpeg"][f"{stem}-{side}-{suffix}"] = jpg + image_tail(rng)
        im = scaled(data, sizes[0] if small else sizes[1])
        if stem == photos[0][0] or not small:
            for suffix, png in png_variants(im):
                out["png"][f"{stem}-{im.size[0]}x{im.size[1]}-{suffix}"] = png + image_tail(rng)
    # Pairs: a scratch that decoded one file, then another (fuzz/regressions/jpeg holds the
    # pairs that found libjpeg's tables carried from one image to the next).
    first, second = scaled(photos[0][1], 24), scaled(photos[1][1], 24)
    progressive = dict(jpeg_variants(first))["progressive"]
    baseline = dict(jpeg_variants(second))["420"]
    out["jpeg"]["primed-progressive-then-baseline"] = primed_image(progressive, baseline, rng)
    out["png"]["primed-adam7-then-palette"] = primed_image(
        dict(png_variants(first))["rgba16-adam7"], dict(png_variants(second))["pal8-trns"], rng)
    if small:
        tiny = scaled(photos[0][1], 8)
        jpg = jpeg_variants(tiny)[0][1]
        png = png_variants(tiny)[0][1]
        out["jpeg"]["tiny-1x1"] = jpeg_variants(tiny.resize((1, 1)))[0][1] + image_tail(rng)
    else:
        for stem, data in photos:  # the sample files as they are
            out["jpeg"][f"{stem}-original"] = data + image_tail(rng)
        jpg = jpeg_variants(scaled(photos[1][1], 64))[0][1]
        png = png_variants(scaled(photos[1][1], 64))[0][1]
    cut = fdp_tail([(65535, 2)])
    for name, tar in tar_seeds(jpg, png).items():
        out["tar"][name] = tar + cut
        if small:
            out["tar"][name.replace(".tar", "-cut.tar")] = tar + fdp_tail([(30000, 2)])
    if not small:
        from stoker import sample_data
        shard = Path(sample_data.default_sample_root()) / "shards" / "train-0000.tar"
        with open(shard, "rb") as f:
            head = f.read(600_000)
        members, pos = 0, 0
        while members < 4 and pos + 512 <= len(head):  # the first two samples (4 members)
            size = int(head[pos + 124:pos + 136].strip(b" \0") or b"0", 8)
            pos += 512 + (size + 511) // 512 * 512
            members += 1
        out["tar"]["sample-shard-slice.tar"] = head[:pos] + bytes(1024) + cut
    out["tokens"] = token_seeds(photos[0][1])
    pixels = np.asarray(scaled(photos[2][1], 12 if small else 48))
    out["npy"] = npy_seeds(pixels)
    out["megatron"] = megatron_seeds()
    out.update(text_seeds())  # small either way: the same seeds as committed
    out["audio"] = audio_seeds()  # small either way
    if not small:
        out["tokens"] = {f"{k}-long": v for k, v in token_seeds(photos[1][1] * 4).items()}
        out["npy"] = {f"{k}-large": v for k, v in out["npy"].items()}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="directory for <target>/<seed> files")
    p.add_argument("--small", action="store_true", help="only the small (committed) seeds")
    p.add_argument("--targets", default=",".join(TARGETS),
                   help="only these targets' seeds (the text wing's alone need no sample data)")
    args = p.parse_args(argv)
    targets = set(args.targets.split(","))
    total = 0
    if targets <= {"jsonl", "tokenizer", "chat_template", "audio"}:  # no sample data needed
        made = {**text_seeds(), "audio": audio_seeds()}
    else:
        made = seeds(args.small)
    for target, files in made.items():
        if target not in targets:
            continue
        d = Path(args.out) / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (d / name).write_bytes(data)
            total += 1
    print(f"wrote {total} seeds to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
