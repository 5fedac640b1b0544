"""The native PackedTokenSource through its binding, over the in-memory VectorDocuments double of
_native.testing (built with STOKER_TESTING=ON). The packers' behaviour is tested in C++
(src/sources/packing_test.cc); this checks what crosses the binding: arguments, fields, errors.
"""

import numpy as np
import pytest

from stoker import _native

if not hasattr(_native, "testing"):
    pytest.skip("needs _native.testing (STOKER_TESTING=ON)", allow_module_level=True)


def fields(src, index, seed=0, epoch=0):
    out = {}
    for name, dtype, shape, raw in zip(src.field_names, src.field_dtypes, src.field_shapes,
                                       src.sample(index, seed, epoch)):
        out[name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return out


def test_concat_windows_with_eos_between_documents():
    docs = _native.testing.VectorDocuments([[1, 2, 3], [4], [5, 6]])
    assert isinstance(docs, _native.sources.DocumentSet)
    assert (docs.num_documents, docs.num_tokens) == (3, 6)
    src = _native.sources.PackedTokenSource(docs, "concat", 3, eos=99)
    assert isinstance(src, _native.sources.Source)
    assert (len(src), src.mode, src.padded_tokens) == (2, "concat", 0)
    assert src.field_names == ["input", "target"]
    # stream: 1 2 3 99 4 99 5 6
    s = fields(src, 1)
    assert s["input"].tolist() == [99, 4, 99]
    assert s["target"].tolist() == [4, 99, 5]


def test_best_fit_fields_and_accessors():
    docs = _native.testing.VectorDocuments([[10, 11, 12], [20], [30, 31], [40, 41]])
    src = _native.sources.PackedTokenSource(docs, "best_fit", 4, eos=None, shuffle_documents=True,
                                            label_ignore=-1, loss_mask=True)
    assert (len(src), src.mode, src.padded_tokens, src.padding_fraction) == (2, "best_fit", 0, 0.0)
    assert src.max_segments == 2 and src.num_pieces == 4
    assert src.field_names == ["input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen",
                               "loss_mask"]
    assert src.field_dtypes == ["int64", "int64", "int64", "int32", "int32", "uint8"]
    assert src.field_shapes == [[4], [4], [4], [3], [], [4]]
    seen = []
    for i in range(len(src)):
        s = fields(src, i, seed=1, epoch=2)
        assert s["cu_seqlens"].tolist()[0] == 0 and s["cu_seqlens"].tolist()[-1] == 4
        assert (s["loss_mask"] == (s["labels"] != -1)).all()
        seen += s["input_ids"].tolist()
    assert sorted(seen) == [10, 11, 12, 20, 30, 31, 40, 41]
    assert fields(src, 0, seed=1, epoch=2)["input_ids"].tolist() == \
        fields(src, 0, seed=1, epoch=2)["input_ids"].tolist()


def test_document_windows_pad_the_last():
    docs = _native.testing.VectorDocuments([[1, 2, 3], [4, 5]])
    src = _native.sources.PackedTokenSource(docs, "document", 4, eos=0)
    assert (len(src), src.padded_tokens, src.padding_fraction) == (2, 3, 3 / 8)
    s = fields(src, 1)
    assert s["input_ids"].tolist() == [5, 0, 0, 0]
    assert s["labels"].tolist() == [-100] * 4
    assert s["cu_seqlens"].tolist() == [0, 1, 4]
    assert int(s["max_seqlen"]) == 3


def test_errors_are_value_errors():
    docs = _native.testing.VectorDocuments([[1, 2], [3]])
    with pytest.raises(ValueError, match="mode must be"):
        _native.sources.PackedTokenSource(docs, "greedy", 2)
    with pytest.raises(ValueError, match="needs at least 5"):
        _native.sources.PackedTokenSource(docs, "concat", 4)
    with pytest.raises(ValueError, match="no tokens"):
        _native.sources.PackedTokenSource(_native.testing.VectorDocuments([]), "document", 4)
    with pytest.raises(ValueError, match="max_segments"):
        _native.sources.PackedTokenSource(docs, "document", 4, max_segments=1)
