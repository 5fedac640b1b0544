"""ArrayDataset and TokenDataset: the exact bytes of every sample, any dtype and layout."""

import numpy as np
import pytest

import stoker


def collect(ds, **kw):
    loader = stoker.DataLoader(ds, batch_size=7, output="numpy", **kw)
    return list(loader)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16,
                                   np.float32, np.float64, np.complex64])
def test_array_rows_of_any_dtype(dtype):
    data = (np.random.default_rng(0).standard_normal((50, 3, 4)) * 10).astype(dtype)
    out = np.concatenate(collect(stoker.ArrayDataset(data), num_workers=2))
    assert out.dtype == data.dtype and out.shape == data.shape
    np.testing.assert_array_equal(out, data)


def test_strided_and_reversed_views_are_read_correctly():
    base = np.arange(40 * 10, dtype=np.float32).reshape(40, 10)
    view = base[::-2, 1::3]  # negative first stride, non-contiguous rows
    out = np.concatenate(collect(stoker.ArrayDataset(view)))
    np.testing.assert_array_equal(out, view)


def test_memory_mapped_npy_by_array_and_by_path(tmp_path):
    path = tmp_path / "rows.npy"
    data = np.random.default_rng(1).standard_normal((300, 16)).astype(np.float32)
    np.save(path, data)
    labels = np.arange(300)
    for source in (np.load(path, mmap_mode="r"), str(path)):
        ds = stoker.ArrayDataset(source, labels)
        loader = stoker.DataLoader(ds, batch_size=32, shuffle=True, output="numpy")
        seen = []
        for x, y in loader:
            np.testing.assert_array_equal(x, data[y])
            seen.extend(y.tolist())
        assert sorted(seen) == list(range(300))


def test_labels_travel_with_their_rows():
    data = np.arange(500, dtype=np.float64)[:, None] * np.ones((1, 4))
    labels = np.arange(500)
    for x, y in stoker.DataLoader(stoker.ArrayDataset(data, labels), batch_size=64, shuffle=True,
                                  num_workers=2, output="numpy"):
        np.testing.assert_array_equal(x[:, 0], y)


def test_array_dataset_rejects_what_it_cannot_load():
    with pytest.raises(ValueError, match="same number of samples"):
        stoker.ArrayDataset(np.zeros(10), np.zeros(9))
    with pytest.raises(ValueError, match="dtype object"):
        stoker.ArrayDataset(np.array([None] * 3))
    with pytest.raises(ValueError, match="non-native byte order"):
        stoker.ArrayDataset(np.zeros(4, dtype=">f4"))
    with pytest.raises(ValueError, match="scalar"):
        stoker.ArrayDataset(np.float32(1))
    with pytest.raises(ValueError, match="at least one array"):
        stoker.ArrayDataset()


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_token_windows_are_input_and_shifted_target(tmp_path, dtype):
    tokens = np.random.default_rng(2).integers(0, 60000, 10_001).astype(dtype)
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    ds = stoker.TokenDataset(path, dtype=dtype, seq_len=100)
    assert len(ds) == 100 and ds.num_tokens == 10_001
    loader = stoker.DataLoader(ds, batch_size=16, shuffle=True, seed=3, num_workers=2,
                               output="numpy")
    rows = []
    for x, y in loader:
        assert x.dtype == np.int64 and x.shape[1] == 100
        np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
        rows.extend(x)
    got = np.stack(rows)
    expected = np.stack([ds[i][0] for i in range(len(ds))])
    assert sorted(map(bytes, got)) == sorted(map(bytes, expected))
    x0, y0 = ds[5]
    np.testing.assert_array_equal(x0, tokens[500:600].astype(np.int64))
    np.testing.assert_array_equal(y0, tokens[501:601].astype(np.int64))


def _llmc_file(path, tokens, version):
    header = np.zeros(256, np.int32)
    header[:3] = (20240520, version, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


@pytest.mark.parametrize("layout", ["llm.c", "npy"])
@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_headered_token_files_give_the_windows_of_their_tokens(tmp_path, layout, dtype):
    tokens = np.random.default_rng(4).integers(0, 60000, 1_001).astype(dtype)
    raw = tmp_path / "raw.bin"
    tokens.tofile(raw)
    path = tmp_path / ("t.bin" if layout == "llm.c" else "t.npy")
    if layout == "llm.c":
        _llmc_file(path, tokens, 1 if dtype == "uint16" else 2)
    else:
        np.save(path, tokens)
    ds = stoker.TokenDataset(path, dtype=dtype, seq_len=10)
    assert ds.format == layout and ds.num_tokens == 1_001 and len(ds) == 100
    want = [b for b in stoker.DataLoader(stoker.TokenDataset(raw, dtype=dtype, seq_len=10),
                                         batch_size=16, shuffle=True, output="numpy")]
    got = [b for b in stoker.DataLoader(ds, batch_size=16, shuffle=True, output="numpy")]
    for (x, y), (wx, wy) in zip(got, want, strict=True):
        np.testing.assert_array_equal(x, wx)
        np.testing.assert_array_equal(y, wy)
    x7, y7 = ds[7]
    np.testing.assert_array_equal(x7, tokens[70:80].astype(np.int64))
    np.testing.assert_array_equal(y7, tokens[71:81].astype(np.int64))


def test_headered_token_files_name_a_mismatch(tmp_path):
    path = tmp_path / "v2.bin"
    _llmc_file(path, np.arange(100, dtype=np.uint32), 2)
    with pytest.raises(ValueError, match=r'v2.bin holds uint32 tokens .* \(pass dtype="uint32"\)'):
        stoker.TokenDataset(path, dtype="uint16", seq_len=4)
    np.save(tmp_path / "m.npy", np.zeros((4, 4), np.uint16))
    with pytest.raises(ValueError, match="m.npy: a .npy token file holds a 1-d array, not 2-d"):
        stoker.TokenDataset(tmp_path / "m.npy", dtype="uint16", seq_len=2)


def test_npy_paths_are_mapped_natively_in_any_layout(tmp_path):
    data = np.arange(60, dtype=np.int16).reshape(5, 3, 4)
    for name, array in (("c.npy", data), ("f.npy", np.asfortranarray(data))):
        np.save(tmp_path / name, array)
        ds = stoker.ArrayDataset(str(tmp_path / name))
        assert not ds.arrays[0].flags.writeable
        np.testing.assert_array_equal(ds.arrays[0], data)
        np.testing.assert_array_equal(np.concatenate(collect(ds)), data)
    np.save(tmp_path / "big.npy", np.zeros(3, ">f4"))
    with pytest.raises(ValueError, match="big.npy: dtype '>f4' has non-native byte order"):
        stoker.ArrayDataset(str(tmp_path / "big.npy"))
    (tmp_path / "not.npy").write_bytes(b"PK\x03\x04")
    with pytest.raises(ValueError, match="not.npy: not a .npy file"):
        stoker.ArrayDataset(str(tmp_path / "not.npy"))


def test_token_dataset_errors_name_the_file(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x00" * 7)
    with pytest.raises(ValueError, match="odd.bin has 7 bytes, not a multiple of 2"):
        stoker.TokenDataset(path, dtype="uint16", seq_len=2)
    with pytest.raises(OSError, match="missing.bin"):
        stoker.TokenDataset(tmp_path / "missing.bin", seq_len=2)
    with pytest.raises(ValueError, match='dtype must be "uint16" or "uint32"'):
        stoker.TokenDataset(path, dtype="int8", seq_len=2)
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        stoker.TokenDataset(path, seq_len=0)


def test_torch_output_is_tensors():
    torch = pytest.importorskip("torch")
    ds = stoker.ArrayDataset(np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10))
    x, y = next(iter(stoker.DataLoader(ds, batch_size=4)))
    assert isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.shape == (4, 2)
    assert y.dtype == torch.int64 and y.tolist() == [0, 1, 2, 3]
