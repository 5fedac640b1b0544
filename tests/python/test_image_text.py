"""TarShards(fields=...): WebDataset samples of any fields (stoker.image_text), read natively."""

import io
import json
import pickle
import re
import tarfile

import numpy as np
import pytest

import stoker
from stoker import transforms as T
from stoker.image_text import Image, Json, Label, Npy, Text

tokenizers = pytest.importorskip("tokenizers")
PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("stoker._text")

CAPTIONS = [
    "a photo of a cat",
    "two dogs playing in the snow",
    "Ein Café in Zürich, 東京の夜景 — naïve façade",
    "a red car",
    " ".join(f"word{i} and more" for i in range(40)),  # far over 77 tokens
    "",
    "a bowl of soup on a wooden table",
    "an astronaut riding a horse",
    "sunset",
    "a small boat on a lake at dawn",
    "the quick brown fox jumps over the lazy dog",
    "city lights",
]
SMALL = T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor("uint8")])
RANDOM = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor("uint8")])


def jpeg(rng):
    buf = io.BytesIO()
    PIL.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def sample_members(i, rng):
    return {
        "jpg": jpeg(rng),
        "txt": CAPTIONS[i].encode(),
        "json": json.dumps({"width": 32, "height": 32, "similarity": i / 10,
                            "meta": {"aesthetic": [i, i + 0.5]}}).encode(),
        "cls": str(i).encode(),
        "npy": npy_bytes(np.arange(4, dtype=np.float32) + i),
    }


def write_tar(path, samples):
    """samples: (key, {ext: bytes}) in member order."""
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """12 samples over 3 shards; sample i has label i."""
    tmp = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    return [write_tar(tmp / f"shard-{s}.tar",
                      [(f"{s}-{i:03d}", sample_members(i, rng)) for i in range(4 * s, 4 * s + 4)])
            for s in range(3)]


@pytest.fixture(scope="module")
def hf():
    """A CLIP-like byte-level BPE: <|startoftext|> $A <|endoftext|>, padded with
    <|endoftext|>."""
    from tokenizers import models, pre_tokenizers, processors, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CAPTIONS * 3, trainer=trainers.BpeTrainer(
        vocab_size=400, show_progress=False, special_tokens=["<|startoftext|>", "<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)])
    return tok


def reference(hf, max_length=77):
    """HF tokenizers' ids and masks of every caption, padded and truncated to max_length."""
    ref = tokenizers.Tokenizer.from_str(hf.to_str())
    eos = ref.token_to_id("<|endoftext|>")
    ref.enable_truncation(max_length)
    ref.enable_padding(length=max_length, pad_id=eos, pad_token="<|endoftext|>")
    return [(e.ids, e.attention_mask) for e in ref.encode_batch(CAPTIONS)]


def fields(hf, transform=SMALL, **text):
    return {"pixel_values": Image(transform),
            "input_ids": Text(hf, pad_id=hf.token_to_id("<|endoftext|>"), **text),
            "similarity": Json("similarity"),
            "aesthetic": Json("meta.aesthetic"),
            "labels": Label(),
            "embedding": Npy(),
            "caption": Text(raw=True)}


def batches(ds, **kw):
    kw = {"batch_size": 5, "output": "numpy", **kw}
    return list(stoker.DataLoader(ds, **kw))


def test_a_batch_is_a_dict_of_every_field_equal_to_hugging_face(shards, hf):
    ds = stoker.TarShards(shards, fields=fields(hf))
    assert isinstance(ds, stoker.TarShards) and len(ds) == 12
    assert ds._batch_names() == ("pixel_values", "input_ids", "attention_mask", "similarity",
                                 "aesthetic", "labels", "embedding", "caption")
    ref = reference(hf)
    assert len(ref[4][0]) == 77 and ref[4][1][-1] == 1  # the long caption is cut
    seen = []
    for b in batches(ds, num_workers=2):
        assert set(b) == set(ds._batch_names())
        assert b["input_ids"].dtype == np.int64 and b["input_ids"].shape[1] == 77
        for j, i in enumerate(b["labels"].tolist()):
            seen.append(i)
            assert b["input_ids"][j].tolist() == ref[i][0], CAPTIONS[i]
            assert b["attention_mask"][j].tolist() == ref[i][1]
            assert b["similarity"][j] == np.float32(i / 10)
            assert b["aesthetic"][j].tolist() == [i, i + 0.5]
            assert b["embedding"][j].tolist() == (np.arange(4) + i).tolist()
            assert b["caption"][j] == CAPTIONS[i]
        assert b["pixel_values"].shape[1:] == (3, 16, 16)
    assert sorted(seen) == list(range(12))  # every key once
    one = ds[2]
    assert one["caption"] == CAPTIONS[2] and one["labels"] == 2
    assert one["input_ids"].tolist() == ref[2][0]
    assert ds.path(2) == shards[0] + ":0-002"


def test_transformers_tokenizer_call_gives_the_same_ids(shards, hf):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=hf, pad_token="<|endoftext|>")
    ds = stoker.TarShards(shards, fields={"input_ids": Text(fast)})  # pad id: its pad_token's
    expected = fast(CAPTIONS, padding="max_length", max_length=77, truncation=True)
    for b in batches(ds, batch_size=12):
        assert b["input_ids"].tolist() == expected["input_ids"]
        assert b["attention_mask"].tolist() == expected["attention_mask"]


def test_images_equal_tar_shards_for_the_same_transform(shards, hf):
    plain = stoker.TarShards(shards, transform=RANDOM)
    ds = stoker.TarShards(shards, fields={"pixel_values": Image(RANDOM), "labels": Label(),
                                          "ids": Text(hf, pad_id=0, max_length=8)})
    kw = {"shuffle": True, "seed": 7}
    for (x, y), b in zip(batches(plain, **kw), batches(ds, **kw), strict=True):
        assert np.array_equal(x, b["pixel_values"]) and np.array_equal(y, b["labels"])
        assert b["ids_attention_mask"].shape == (len(y), 8)


def test_batches_are_identical_whatever_the_workers_and_resume_gives_the_rest(shards, hf):
    ds = stoker.TarShards(shards, fields=fields(hf, RANDOM))
    kw = {"shuffle": True, "seed": 3, "batch_size": 3}
    one, two = batches(ds, num_workers=1, **kw), batches(ds, num_workers=2, **kw)
    assert len(one) == 4
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
    loader = stoker.DataLoader(ds, output="numpy", num_workers=2, **kw)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = stoker.DataLoader(ds, output="numpy", num_workers=1, **kw)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == 3
    for a, b in zip(one[1:], rest, strict=True):
        assert a["labels"].tolist() == b["labels"].tolist()
        assert np.array_equal(a["pixel_values"], b["pixel_values"])


def test_ranks_split_the_samples(shards, hf):
    ds = stoker.TarShards(shards, fields={"labels": Label(), "input_ids": Text(hf, pad_id=0)})
    seen = [[i for b in batches(ds, rank=r, world_size=2, shuffle=True, seed=1)
             for i in b["labels"].tolist()] for r in range(2)]
    assert len(seen[0]) == len(seen[1]) == 6
    assert sorted(seen[0] + seen[1]) == list(range(12))


def test_a_missing_member_fails_at_construction_or_is_a_counted_skip(tmp_path, hf):
    rng = np.random.default_rng(1)
    members = [sample_members(i, rng) for i in range(4)]
    del members[2]["txt"]
    path = write_tar(tmp_path / "m.tar", [(f"k{i}", m) for i, m in enumerate(members)])
    spec = {"pixel_values": Image(SMALL), "input_ids": Text(hf, pad_id=0), "labels": Label()}
    with pytest.raises(ValueError, match=rf"{path}: key 'k2' has no \.txt member"):
        stoker.TarShards(path, fields=spec)
    ds = stoker.TarShards(path, fields=spec, missing="skip")
    assert len(ds) == 3
    assert ds.stats()["skipped_keys"] == 1
    loader = stoker.DataLoader(ds, batch_size=2, output="numpy")
    assert sorted(i for b in loader for i in b["labels"].tolist()) == [0, 1, 3]
    assert loader.stats()["tar"]["skipped_keys"] == 1
    assert any(f"{path}:k2" in s for s in loader.stats()["tar"]["skipped_examples"])


def test_variable_length_captions_equal_hugging_face_padding_longest(shards, hf):
    """padding="longest": each batch padded to its longest caption, ids and mask equal to
    tokenizer(batch, padding="longest", truncation=True, max_length=...); a token budget."""
    ref = tokenizers.Tokenizer.from_str(hf.to_str())
    eos = ref.token_to_id("<|endoftext|>")
    for cap in (77, 12, None):
        ref.no_truncation()
        if cap is not None:
            ref.enable_truncation(cap)
        ref.enable_padding(pad_id=eos, pad_token="<|endoftext|>")
        ds = stoker.TarShards(shards, fields={
            "input_ids": Text(hf, padding="longest", max_length=cap, pad_id=eos),
            "labels": Label()})
        seen = []
        for b in batches(ds, batch_size=5, shuffle=True, seed=1, num_workers=2):
            want = ref.encode_batch([CAPTIONS[i] for i in b["labels"].tolist()])
            assert b["input_ids"].tolist() == [e.ids for e in want]
            assert b["attention_mask"].tolist() == [e.attention_mask for e in want]
            assert b["lengths"].tolist() == [sum(e.attention_mask) for e in want]
            seen += b["labels"].tolist()
        assert sorted(seen) == list(range(12))
    lengths = ds._lengths("tokens")
    budget = stoker.Budget(tokens=int(lengths.max()) * 2)
    got = batches(ds, batch_size=budget, shuffle=True, seed=3)
    assert sorted(i for b in got for i in b["labels"].tolist()) == list(range(12))
    for b in got:
        assert b["input_ids"].shape[0] * b["input_ids"].shape[1] <= budget.value
        assert b["input_ids"].shape[1] == max(b["lengths"].tolist())
    with pytest.raises(ValueError, match="do not batch together"):
        stoker.TarShards(shards, fields={
            "pixel_values": Image(buckets=[(16, 16)]),
            "input_ids": Text(hf, padding="longest", pad_id=eos)})
    with pytest.raises(ValueError, match="padding"):
        Text(hf, padding="do_not_pad")


def bad_shard(tmp_path, i, **replace):
    rng = np.random.default_rng(2)
    members = [sample_members(k, rng) for k in range(4)]
    members[i].update(replace)
    return write_tar(tmp_path / "bad.tar", [(f"k{k}", m) for k, m in enumerate(members)])


@pytest.mark.parametrize("replace, spec, cause, message", [
    ({"txt": b"caf\xe9 \xff"}, Text, stoker.DecodeError, "UTF-8"),
    ({"txt": b"caf\xe9 \xff"}, "raw", stoker.DecodeError, "not valid UTF-8"),
    ({"txt": b"caf\xe9 \xff"}, "longest", stoker.DecodeError, "UTF-8"),
    ({"json": b"{not json"}, Json, stoker.DecodeError, "does not parse as JSON"),
    ({"json": b'{"width": 1}'}, Json, ValueError, "has no 'similarity'"),
    ({"npy": npy_bytes(np.zeros(5, np.float32))}, Npy, ValueError, r"shape \(5\)"),
    ({"cls": b"three"}, Label, ValueError, "invalid label 'three'"),
    ({"jpg": b"not an image"}, Image, stoker.DecodeError, "unsupported image format"),
])
def test_bad_members_are_errors_naming_the_sample_or_counted_skips(tmp_path, hf, replace, spec,
                                                                    cause, message):
    path = bad_shard(tmp_path, 2, **replace)
    field = {Text: Text(hf, pad_id=0), "raw": Text(raw=True), Json: Json("similarity"),
             "longest": Text(hf, pad_id=0, padding="longest"),
             Npy: Npy(), Label: Label(), Image: Image(SMALL)}[spec]
    ds = stoker.TarShards(path, fields={"x": field, "labels": Label(ext="cls")} if spec is not
                          Label else {"x": field})
    with pytest.raises(stoker.SampleError) as e:
        batches(ds, batch_size=4, num_workers=1)
    assert f"{path}:k2" in str(e.value) and e.value.index == 2
    assert isinstance(e.value.__cause__, cause)
    assert re.search(message, str(e.value.__cause__)), str(e.value.__cause__)
    loader = stoker.DataLoader(ds, batch_size=4, output="numpy", on_error="skip")
    assert sum(len(b["x"]) for b in loader) == 4
    assert loader.stats()["skipped"] == 1


class Brighten:
    """A transform with no native form."""

    def __call__(self, x):
        return x


def test_bad_specs_are_value_errors(shards, hf, tmp_path):
    with pytest.raises(ValueError, match="Brighten has no native form"):
        stoker.TarShards(shards, fields={"x": Image([T.Resize(16), Brighten()])})
    with pytest.raises(ValueError, match="pad_id"):
        stoker.TarShards(shards, fields={"input_ids": Text(hf)})  # names no pad token
    with pytest.raises(ValueError, match="each Image field takes its own transform"):
        stoker.TarShards(shards, transform=SMALL, fields={"labels": Label()})


def test_a_dataset_pickles_as_its_spec(shards, hf):
    ds = stoker.TarShards(shards, fields={"labels": Label(), "input_ids": Text(hf, pad_id=0),
                                          "caption": Text(raw=True)}, missing="skip")
    again = pickle.loads(pickle.dumps(ds))
    assert type(again) is type(ds) and len(again) == 12 and again.missing == "skip"
    assert repr(again._identity()) == repr(ds._identity())
    assert again[5]["caption"] == CAPTIONS[5]


def test_without_specials_or_truncation(shards, hf):
    ref = tokenizers.Tokenizer.from_str(hf.to_str())
    ref.enable_truncation(12)
    ref.enable_padding(length=12, pad_id=0)
    expected = ref.encode_batch(CAPTIONS, add_special_tokens=False)
    ds = stoker.TarShards(shards, fields={"labels": Label(), "input_ids": Text(
        hf, max_length=12, pad_id=0, add_special_tokens=False)})
    for b in batches(ds, batch_size=12):
        for ids, mask, i in zip(b["input_ids"], b["attention_mask"], b["labels"].tolist()):
            assert ids.tolist() == expected[i].ids and mask.tolist() == expected[i].attention_mask
    strict = stoker.TarShards(shards, fields={"input_ids": Text(hf, pad_id=0, truncation=False)})
    with pytest.raises(stoker.SampleError, match=r"1-004.*longer than max_length=77 "
                                                 r"\(truncation=False\)") as e:
        batches(strict, batch_size=12)
    assert e.value.path == shards[1] + ":1-004"
