"""TokenDataset over corpora of many shards (flat files, Megatron .bin/.idx) and its packings:
every token of every document once per epoch, the same batches whatever the workers, resume,
and bad input named by its file."""

import collections
import struct

import numpy as np
import pytest

import stoker

_MEGATRON_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
                   np.float64: 6, np.float32: 7, np.uint16: 8}


def write_megatron(prefix, documents, dtype=np.uint16):
    """A Megatron-LM indexed dataset (megatron/core/datasets/indexed_dataset.py's layout): one
    sequence a document."""
    dtype = np.dtype(dtype)
    with open(f"{prefix}.bin", "wb") as f:
        for d in documents:
            f.write(np.asarray(d, dtype).tobytes())
    lengths = np.array([len(d) for d in documents], np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) * dtype.itemsize
    doc_indices = np.arange(len(documents) + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", _MEGATRON_CODES[dtype.type]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_indices)))
        f.write(lengths.tobytes())
        f.write(pointers.astype(np.int64).tobytes())
        f.write(doc_indices.tobytes())
    return str(prefix)


def random_documents(rng, count, mean=40, longest=None):
    lengths = np.maximum(1, rng.lognormal(np.log(mean), 1.0, count).astype(int))
    if longest is not None:
        lengths[: len(longest)] = longest
    return [rng.integers(0, 60000, n).astype(np.uint16) for n in lengths]


def unique_documents(count, rng, mean=40, longest=()):
    """Documents whose tokens name their place: token = 1 + running position (< 2^16 here)."""
    lengths = np.maximum(1, rng.lognormal(np.log(mean), 1.0, count).astype(int))
    lengths[: len(longest)] = longest
    out, at = [], 1
    for n in lengths:
        out.append(np.arange(at, at + n, dtype=np.uint16))
        at += n
    assert at < 2**16
    return out


def epoch_batches(ds, epoch=0, **kwargs):
    loader = stoker.DataLoader(ds, batch_size=kwargs.pop("batch_size", 4), output="numpy",
                               **kwargs)
    loader.set_epoch(epoch)
    return list(loader)


def test_shards_of_every_layout_make_one_corpus(tmp_path):
    rng = np.random.default_rng(0)
    flat = rng.integers(0, 60000, 500).astype(np.uint16)
    flat.tofile(tmp_path / "a-0.bin")
    np.save(tmp_path / "a-1.npy", flat[:300])
    docs = random_documents(rng, 7)
    write_megatron(tmp_path / "a-2", docs)
    ds = stoker.TokenDataset(str(tmp_path / "a-{0..2}.*"), seq_len=16)
    assert ds.formats == ["raw", "npy", "megatron"] and ds.format == "mixed"
    assert ds.num_documents == 2 + len(docs)
    stream = np.concatenate([flat, flat[:300], *docs]).astype(np.int64)
    assert ds.num_tokens == len(stream) and len(ds) == (len(stream) - 1) // 16
    for i in (0, 31, len(ds) - 1):
        x, y = ds[i]
        np.testing.assert_array_equal(x, stream[i * 16:i * 16 + 16])
        np.testing.assert_array_equal(y, stream[i * 16 + 1:i * 16 + 17])
    for d, doc in enumerate(docs):
        np.testing.assert_array_equal(ds.document(2 + d), doc.astype(np.int64))
    # A Megatron dataset named by either of its files, or by a pattern matching both, is one shard.
    for name in ("a-2", "a-2.bin", "a-2.idx", "a-2.*"):
        assert stoker.TokenDataset(str(tmp_path / name), seq_len=4).num_documents == len(docs)


def test_one_flat_file_gives_todays_windows(tmp_path):
    tokens = np.random.default_rng(1).integers(0, 60000, 1001).astype(np.uint16)
    tokens.tofile(tmp_path / "t.bin")
    ds = stoker.TokenDataset(tmp_path / "t.bin", seq_len=10)
    batches = epoch_batches(ds, batch_size=7, shuffle=True, seed=3)
    windows = sorted(bytes(x) for b in batches for x in b[0])
    want = sorted(bytes(tokens[i * 10:i * 10 + 10].astype(np.int64)) for i in range(100))
    assert windows == want


def test_eos_splits_flat_files_and_ends_every_document_of_the_stream(tmp_path):
    eos = 9
    (np.array([1, 2, eos, 3, eos, eos, 4, 5], np.uint16)).tofile(tmp_path / "f.bin")
    write_megatron(tmp_path / "m", [np.array([6, 7], np.uint16), np.array([8, eos], np.uint16)])
    ds = stoker.TokenDataset([tmp_path / "f.bin", tmp_path / "m"], seq_len=2, eos=eos)
    docs = [list(ds.document(d)) for d in range(ds.num_documents)]
    # Flat files split after each eos (an empty document is none); Megatron's documents kept.
    assert docs == [[1, 2, eos], [3, eos], [eos], [4, 5], [6, 7], [8, eos]]
    # In the stream an eos follows each document that does not end with one, but the last.
    stream = [1, 2, eos, 3, eos, eos, 4, 5, eos, 6, 7, eos, 8, eos]
    assert len(ds) == (len(stream) - 1) // 2
    for i in range(len(ds)):
        x, y = ds[i]
        assert list(x) == stream[2 * i:2 * i + 2] and list(y) == stream[2 * i + 1:2 * i + 3]


@pytest.mark.parametrize("pack", ["document", "best_fit"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_packed_epochs_deliver_every_token_once(tmp_path, pack, shuffle):
    rng = np.random.default_rng(2)
    docs = unique_documents(300, rng, longest=(70, 150))  # two longer than seq_len
    write_megatron(tmp_path / "c", docs)
    ds = stoker.TokenDataset(tmp_path / "c", seq_len=64, pack=pack, shuffle_documents=shuffle,
                             loss_mask=True)
    doc_of = {}
    for d, doc in enumerate(docs):
        for p, t in enumerate(doc):
            doc_of[int(t)] = (d, p)
    seen, pieces = collections.Counter(), collections.Counter()
    epochs = []
    for epoch in (0, 1):
        batches = epoch_batches(ds, epoch, batch_size=8, shuffle=shuffle, seed=5)
        epochs.append(batches)
        seen.clear()
        pieces.clear()
        for b in batches:
            assert set(b) == {"input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen",
                              "loss_mask"}
            for row in range(len(b["input_ids"])):
                check_sequence(b, row, doc_of, docs, ds.label_ignore, seen, pieces)
        assert sorted(seen) == sorted(doc_of) and set(seen.values()) == {1}
        if pack == "best_fit":  # a document that fits is never split; a longer one in L pieces
            assert all(pieces[d] == -(-len(doc) // 64) for d, doc in enumerate(docs))
    loader = stoker.DataLoader(ds, batch_size=8)
    packing = loader.stats()["packing"]
    total = sum(len(d) for d in docs)
    assert packing["mode"] == pack and packing["sequences"] == len(ds)
    if pack == "document":
        assert len(ds) == -(-total // 64)
    assert packing["padded_tokens"] == len(ds) * 64 - total
    assert packing["padding_fraction"] == pytest.approx(packing["padded_tokens"] / (len(ds) * 64))
    if pack == "best_fit":
        assert 0 <= ds.padding_fraction < 0.1
    if shuffle:
        assert any(not np.array_equal(a["input_ids"], b["input_ids"])
                   for a, b in zip(*epochs))


def check_sequence(b, row, doc_of, docs, ignore, seen, pieces):
    ids, labels = b["input_ids"][row], b["labels"][row]
    pos, cu = b["position_ids"][row], b["cu_seqlens"][row]
    L = len(ids)
    assert cu[0] == 0 and cu[-1] == L and np.all(np.diff(cu) >= 0)
    segments = [(cu[i], cu[i + 1]) for i in range(len(cu) - 1) if cu[i + 1] > cu[i]]
    assert int(b["max_seqlen"][row]) == max(e - s for s, e in segments)
    for s, e in segments:
        first = int(ids[s])
        if first not in doc_of:  # the padding segment: last, position 0, nothing learned
            assert e == L and np.all(pos[s:e] == 0) and np.all(labels[s:e] == ignore)
            assert np.all(b["loss_mask"][row][s:e] == 0)
            continue
        np.testing.assert_array_equal(pos[s:e], np.arange(e - s))
        d, p = doc_of[first]
        pieces[d] += 1
        np.testing.assert_array_equal(ids[s:e], docs[d][p:p + e - s])
        for k in range(s, e):
            seen[int(ids[k])] += 1
            q = p + k - s
            want = int(docs[d][q + 1]) if q + 1 < len(docs[d]) else ignore
            assert int(labels[k]) == want
            assert b["loss_mask"][row][k] == (want != ignore)


@pytest.mark.parametrize("pack", ["concat", "document", "best_fit"])
def test_batches_do_not_depend_on_workers_and_resume_exactly(tmp_path, pack):
    docs = random_documents(np.random.default_rng(3), 200)
    write_megatron(tmp_path / "c", docs)
    ds = stoker.TokenDataset(tmp_path / "c", seq_len=32, pack=pack)

    def run(workers, state=None):
        loader = stoker.DataLoader(ds, batch_size=5, shuffle=True, seed=7, num_workers=workers,
                                   output="numpy")
        if state is not None:
            loader.load_state_dict(state)
        return loader

    def flat(batch):
        return [np.asarray(v) for v in (batch.values() if isinstance(batch, dict) else batch)]

    whole = [flat(b) for b in run(0)]
    assert [[a.tobytes() for a in b] for b in whole] == \
        [[a.tobytes() for a in flat(b)] for b in run(3)]
    loader = run(2)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    rest = [flat(b) for b in run(1, state)]
    assert [[a.tobytes() for a in b] for b in rest] == [[a.tobytes() for a in b]
                                                         for b in whole[4:]]


def test_bad_corpora_are_named(tmp_path):
    docs = [np.arange(10, dtype=np.uint16), np.arange(5, dtype=np.uint16)]
    write_megatron(tmp_path / "ok", docs)
    # A .bin shorter than its .idx says.
    write_megatron(tmp_path / "cut", docs)
    with open(tmp_path / "cut.bin", "r+b") as f:
        f.truncate(12)
    with pytest.raises(ValueError, match=r"cut\.(bin|idx)"):
        stoker.TokenDataset(tmp_path / "cut", seq_len=4)
    # An .idx that disagrees with itself: a document index past its sequences.
    write_megatron(tmp_path / "bad", docs)
    raw = bytearray((tmp_path / "bad.idx").read_bytes())
    raw[-8:] = struct.pack("<q", 7)
    (tmp_path / "bad.idx").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"bad\.idx"):
        stoker.TokenDataset(tmp_path / "bad", seq_len=4)
    (tmp_path / "bad2.idx").write_bytes(b"NOTANIDX" + bytes(40))
    (tmp_path / "bad2.bin").write_bytes(bytes(8))
    with pytest.raises(ValueError, match=r"bad2\.idx"):
        stoker.TokenDataset(tmp_path / "bad2", seq_len=4)
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.bin"):
        stoker.TokenDataset([tmp_path / "ok", tmp_path / "empty.bin"], seq_len=4)
    (tmp_path / "lonely.idx").write_bytes((tmp_path / "ok.idx").read_bytes())
    with pytest.raises(FileNotFoundError, match=r"lonely\.idx has no .*lonely\.bin"):
        stoker.TokenDataset(tmp_path / "lonely.idx", seq_len=4)
    with pytest.raises(ValueError, match="pack must be one of"):
        stoker.TokenDataset(tmp_path / "ok", seq_len=4, pack="greedy")


def test_token_ids_beyond_the_vocabulary_fail_their_sample_naming_the_file(tmp_path):
    tokens = np.zeros(100, np.uint16)
    tokens[57] = 1000
    tokens.tofile(tmp_path / "v.bin")
    ds = stoker.TokenDataset(tmp_path / "v.bin", seq_len=10, vocab_size=1000)
    loader = stoker.DataLoader(ds, batch_size=1, output="numpy")
    it = iter(loader)
    for _ in range(5):
        next(it)
    with pytest.raises(stoker.SampleError, match=r"v\.bin") as info:
        next(it)
    assert "1000" in str(info.value.__cause__) and "vocab" in str(info.value.__cause__)
    # on_error="skip" replaces it and counts it.
    loader = stoker.DataLoader(ds, batch_size=1, output="numpy", on_error="skip")
    assert len(list(loader)) == len(ds) and loader.stats()["skipped"] == 1


def test_token_id_columns_of_tables_are_documents(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    rng = np.random.default_rng(4)
    docs = unique_documents(120, rng, mean=20)
    table = pa.table({"input_ids": pa.array([d.astype(np.int32) for d in docs],
                                            pa.list_(pa.int32())),
                      "text": [f"doc {i}" for i in range(len(docs))]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=50)
    for source in (tmp_path / "t.parquet", table):
        ds = stoker.TokenDataset(source, seq_len=16, pack="best_fit", column="input_ids")
        assert ds.num_documents == len(docs) and ds.format == "table"
        for d in (0, 57, 119):
            np.testing.assert_array_equal(ds.document(d), docs[d])
        seen = collections.Counter(int(t) for b in epoch_batches(ds, shuffle=True)
                                   for row, lab in zip(b["input_ids"], b["labels"])
                                   for t in row if t != 0)
        assert sorted(seen) == sorted(int(t) for d in docs for t in d)
        assert set(seen.values()) == {1}
    concat = stoker.TokenDataset(table, seq_len=8, column="input_ids", eos=0)
    stream = [int(t) for d in docs for t in [*d, 0]][:-1]
    for i in (0, 3, len(concat) - 1):
        x, y = concat[i]
        assert list(x) == stream[8 * i:8 * i + 8] and list(y) == stream[8 * i + 1:8 * i + 9]
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_dict({"input_ids": [d.tolist() for d in docs]}).select([5, 3])
    ds = stoker.TokenDataset(hf, seq_len=4, column="input_ids")
    assert ds.num_documents == 2
    np.testing.assert_array_equal(ds.document(0), docs[5])
    np.testing.assert_array_equal(ds.document(1), docs[3])
    with pytest.raises(ValueError, match=r"column 'text' is string, not a list of integer"):
        stoker.TokenDataset(table, seq_len=4, column="text")
    with pytest.raises(ValueError, match=r"has no column 'ids'"):
        stoker.TokenDataset(table, seq_len=4, column="ids")
    bad = pa.table({"ids": pa.array([[1, 2, 3], [70000]], pa.list_(pa.int64()))})
    loader = stoker.DataLoader(stoker.TokenDataset(bad, seq_len=3, column="ids",
                                                   vocab_size=50000), batch_size=1)
    with pytest.raises(stoker.SampleError, match=r"table:ids"):
        list(loader)
