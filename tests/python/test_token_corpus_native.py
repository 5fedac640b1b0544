"""The native TokenCorpus binding (stoker._native.sources): shards of every format, Megatron pairs
written as Megatron-LM's IndexedDatasetBuilder writes them, typed errors naming the file."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from stoker._native import sources as S


def write_megatron(prefix, documents, dtype=np.uint16):
    """prefix.bin and prefix.idx as megatron/core/datasets/indexed_dataset.py writes them."""
    codes = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}
    lengths, doc_idx, data = [], [0], b""
    for doc in documents:
        for seq in doc:
            data += np.asarray(seq, dtype).tobytes()
            lengths.append(len(seq))
        doc_idx.append(len(lengths))
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype("<i8")[:len(lengths)]
    pointers *= np.dtype(dtype).itemsize
    idx = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, codes[dtype], len(lengths), len(doc_idx))
           + np.asarray(lengths, "<i4").tobytes() + pointers.tobytes()
           + np.asarray(doc_idx, "<i8").tobytes())
    (prefix.parent / (prefix.name + ".bin")).write_bytes(data)
    (prefix.parent / (prefix.name + ".idx")).write_bytes(idx)
    return str(prefix)


def test_documents_across_shards_of_every_format(tmp_path):
    raw = tmp_path / "raw.bin"
    np.array([1, 2, 0, 3], np.uint16).tofile(raw)
    npy = tmp_path / "t.npy"
    np.save(npy, np.array([4, 0], np.uint16))
    mega = write_megatron(tmp_path / "m", [[[5, 6], [7]], [], [[0, 8]]], np.int32)
    corpus = S.TokenCorpus([str(raw), str(npy), mega], "uint16", split_at=0, vocab_size=10)
    assert isinstance(corpus, S.DocumentSet)
    assert corpus.formats == ["raw", "npy", "megatron"]
    assert corpus.shard_paths == [str(raw), str(npy), mega + ".bin"]
    docs = [corpus.document(d).tolist() for d in range(corpus.num_documents)]
    # split_at splits flat shards only; Megatron's documents (an empty one too) stay as written.
    assert docs == [[1, 2, 0], [3], [4, 0], [5, 6, 7], [], [0, 8]]
    assert corpus.document(0).dtype == np.int64
    assert corpus.num_tokens == 11
    assert [corpus.document_at(t) for t in range(11)] == [0, 0, 0, 1, 2, 2, 3, 3, 3, 5, 5]
    assert corpus.document_start(3) == 6


def test_errors_are_typed_and_name_the_file(tmp_path):
    ids = tmp_path / "ids.bin"
    np.array([1, 99], np.uint16).tofile(ids)
    corpus = S.TokenCorpus([str(ids)], "uint16", None, 50)
    with pytest.raises(ValueError, match=f"{ids}: document 0 .* token 1: token id 99 is outside"):
        corpus.document(0)
    with pytest.raises(IndexError):
        corpus.document(1)
    prefix = write_megatron(tmp_path / "cut", [[[1, 2, 3]]])
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(4)
    with pytest.raises(ValueError, match=f"{prefix}.bin is shorter than its index says"):
        S.TokenCorpus([prefix], "uint16")
    with pytest.raises(OSError, match="cannot open token file"):
        S.TokenCorpus([str(tmp_path / "missing")], "uint16")
    with pytest.raises(ValueError, match='dtype must be "uint16" or "uint32"'):
        S.TokenCorpus([str(ids)], "int8")
