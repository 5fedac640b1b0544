"""The modality contract: every Stoker dataset answers the protocol of sources/base.py, and the
generic layers (the loader, its state, stats(), diagnose, StokerTrainer) need nothing else.

(a) Every dataset trains a step under StokerTrainer: its batches reach ``model(**batch)`` as
dicts, keyed by the names the dataset declares (``_batch_names()``; a dict dataset's own keys).
(b) ``SensorDataset``, a modality made only here the way docs/architecture.md ("Adding a
modality") says, runs through the same generic tests: every sample once an epoch whatever the
workers, resume mid-epoch, its stats section, its diagnose figures, a Trainer step. It is the
worked example of that section, kept honest by these tests.
"""

import io
import json
import tarfile

import numpy as np
import pytest
import torch

import stoker
import stoker.transforms as T
from stoker import _native
from stoker.sources.base import StokerDataset, figure, is_native

transformers = pytest.importorskip("transformers")

from stoker.integrations.transformers import StokerTrainer  # noqa: E402

# Keys Trainer adds to a forward that takes **kwargs (its own, not the batch's).
TRAINER_KEYS = {"num_items_in_batch"}


def small_transform():
    return T.Compose([T.Resize(16), T.CenterCrop(16), T.ToTensor()])


class KeysModel(torch.nn.Module):
    """Takes any keywords, records their names, returns a differentiable loss."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))
        self.seen = []

    def forward(self, **kwargs):
        assert kwargs and all(isinstance(k, str) for k in kwargs)
        self.seen.append(set(kwargs) - TRAINER_KEYS)
        first = next(v for v in kwargs.values() if torch.is_tensor(v))
        return {"loss": self.w * first.float().mean()}


def train_one_step(dataset, out):
    model = KeysModel()
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=1, per_device_train_batch_size=2, report_to=[],
        use_cpu=True, save_strategy="no", remove_unused_columns=False, disable_tqdm=True,
        dataloader_num_workers=0, logging_strategy="no")
    StokerTrainer(model=model, args=args, train_dataset=dataset).train()
    assert len(model.seen) == 1
    return model.seen[0]


def declared_keys(ds):
    """The keys a model is called with: the declared names, a dict dataset's own keys, plus
    ``shift_labels`` for labels that are the next tokens (the forward takes **kwargs)."""
    if isinstance(ds, StokerDataset):
        names = ds._batch_names()
        if names:
            keys = set(names)
        else:  # batches are dicts already: the keys of one
            batch = next(iter(stoker.DataLoader(ds, batch_size=2, output="torch")))
            assert isinstance(batch, dict)
            keys = set(batch)
        if ds._labels_are_next_tokens and "labels" in keys:
            keys.add("shift_labels")
        if "position_ids" in keys and "attention_mask" not in keys:
            keys.add("use_cache")  # a pack: False, so that transformers masks it apart
        return keys
    return set(ds[0])


# --------------------------------------------------------------------------- the datasets


def jpeg(rng, size=(20, 24)):
    from PIL import Image
    img = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG")
    return buf.getvalue()


def make_arrays(tmp):
    rng = np.random.default_rng(0)
    return stoker.ArrayDataset(rng.normal(size=(10, 4)).astype(np.float32),
                               np.arange(10) % 2, names=["x", "labels"])


def token_file(tmp):
    rng = np.random.default_rng(1)
    tokens = rng.integers(1, 500, 400).astype(np.uint16)
    tokens[::13] = 0  # documents, for the packs: 0 is the eos
    path = tmp / "tokens.bin"
    tokens.tofile(path)
    return path


def make_tokens_concat(tmp):
    return stoker.TokenDataset(token_file(tmp), seq_len=8)


def make_tokens_best_fit(tmp):
    return stoker.TokenDataset(token_file(tmp), seq_len=16, pack="best_fit", eos=0)


def text_tokenizer():
    """A byte-level BPE trained here, with a ChatML template marking the assistant's text."""
    pytest.importorskip("stoker._text", reason="this build has no text module")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20,
                            trainer=trainers.BpeTrainer(
                                vocab_size=300, show_progress=False,
                                special_tokens=["<|im_start|>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    fast.chat_template = (
        "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
        "{%- if m.role == 'assistant' %}{% generation %}{{ m.content + '<|im_end|>' }}"
        "{% endgeneration %}{{ '\\n' }}{%- else %}{{ m.content + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}")
    return stoker.Tokenizer.from_hf(fast)


def make_text_sft(tmp):
    """Conversations, the loss on the assistant's tokens, packed best-fit."""
    path = tmp / "chat.jsonl"
    with open(path, "w") as f:
        for i in range(12):
            f.write(json.dumps({"messages": [
                {"role": "user", "content": "the quick fox " * (i % 3 + 1)},
                {"role": "assistant", "content": "over the lazy dog " * (i % 4 + 1)}]}) + "\n")
    return stoker.TextDataset(str(path), text_tokenizer(), messages="messages", seq_len=64,
                              pack="best_fit")


def make_text_rows(tmp):
    """Text rows, unpacked: a batch pads them."""
    path = tmp / "text.jsonl"
    with open(path, "w") as f:
        for i in range(8):
            f.write(json.dumps({"text": "the lazy dog " * (i + 1)}) + "\n")
    return stoker.TextDataset(str(path), text_tokenizer())


def make_image_folder(tmp):
    rng = np.random.default_rng(2)
    for c in ("cat", "dog"):
        (tmp / "images" / c).mkdir(parents=True)
        for i in range(3):
            (tmp / "images" / c / f"{i}.jpg").write_bytes(jpeg(rng))
    return stoker.ImageFolder(tmp / "images", transform=small_transform())


def make_tar_shards(tmp):
    rng = np.random.default_rng(3)
    path = tmp / "shard-0.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(6):
            for suffix, data in ((".jpg", jpeg(rng)), (".cls", str(i % 2).encode())):
                info = tarfile.TarInfo(f"{i:04d}{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return stoker.TarShards(str(path), transform=small_transform())


def make_image_text(tmp):
    """WebDataset shards of an image, a caption and a label, read as dicts of fields."""
    from stoker.image_text import Image, Label, Text
    rng = np.random.default_rng(6)
    path = tmp / "pairs-0.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(6):
            for suffix, data in ((".jpg", jpeg(rng)), (".txt", b"the lazy dog " * (i + 1)),
                                 (".cls", str(i % 2).encode())):
                info = tarfile.TarInfo(f"{i:04d}{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return stoker.TarShards(str(path), fields={
        "pixel_values": Image(small_transform()),
        "input_ids": Text(text_tokenizer(), max_length=8, pad_id=0), "labels": Label()})


def make_image_text_buckets(tmp):
    """Images of three aspect ratios in aspect-ratio buckets (diffusion), with their labels."""
    from PIL import Image as PILImage

    from stoker.image_text import Image, Label
    rng = np.random.default_rng(7)
    path = tmp / "buckets-0.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(6):
            buf = io.BytesIO()
            h, w = [(24, 24), (16, 40), (40, 16)][i % 3]
            PILImage.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG")
            for suffix, data in ((".jpg", buf.getvalue()), (".cls", str(i % 2).encode())):
                info = tarfile.TarInfo(f"{i:04d}{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return stoker.TarShards(str(path), fields={
        "pixel_values": Image(stoker.transforms.ToTensor(), buckets=[(8, 8), (8, 16), (16, 8)]),
        "labels": Label()})


def make_image_text_captions(tmp):
    """Captions of variable length (padding="longest") with a label."""
    from stoker.image_text import Label, Text
    path = tmp / "captions-0.tar"
    with tarfile.open(path, "w") as tar:
        for i in range(6):
            for suffix, data in ((".txt", b"the lazy dog " * (i + 1)), (".cls", str(i % 2).encode())):
                info = tarfile.TarInfo(f"{i:04d}{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return stoker.TarShards(str(path), fields={
        "input_ids": Text(text_tokenizer(), padding="longest", pad_id=0), "labels": Label()})


def make_table(tmp):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(4)
    table = pa.table({"x": rng.normal(size=8).astype(np.float32),
                      "labels": np.arange(8, dtype=np.int64)})
    pq.write_table(table, tmp / "t.parquet")
    return stoker.TableDataset(str(tmp / "t.parquet"))


def make_image_table(tmp):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(5)
    table = pa.table({"image": [jpeg(rng) for _ in range(6)],
                      "label": np.arange(6, dtype=np.int64) % 2})
    pq.write_table(table, tmp / "images.parquet")
    return stoker.TableDataset(str(tmp / "images.parquet"), image="image", label="label",
                               transform=small_transform())


def make_video_folder(tmp):
    pytest.importorskip("av")
    pytest.importorskip("stoker._video")
    from test_video import make_video  # the video tests' maker (PyAV)
    for c in ("jump", "run"):
        (tmp / "videos" / c).mkdir(parents=True)
        make_video(tmp / "videos" / c / "a.mp4", frames=8, gop=4, size=(32, 24))
    return stoker.VideoDataset(tmp / "videos", frames=2, stride=2, transform=small_transform())


def make_video_with_timestamps(tmp):
    make_video_folder(tmp)
    return stoker.VideoDataset(tmp / "videos", frames=2, stride=2, transform=small_transform(),
                               timestamps=True)


def make_lerobot(tmp):
    try:
        from test_lerobot import make_dataset  # skips where lerobot is not installed
    except pytest.skip.Exception as e:
        pytest.skip(f"LeRobotDataset: {e}")
    root = make_dataset(tmp / "lerobot", episodes=(4, 3))
    return stoker.LeRobotDataset(root)


def make_audio_nemo(tmp):
    pytest.importorskip("stoker._audio", reason="this build has no audio module")
    from test_audio import sweep, write_wav  # the audio tests' makers
    lines = []
    for i, seconds in enumerate((0.3, 0.5, 0.4)):
        write_wav(tmp / f"{i}.wav", sweep(seconds, 16000), 16000)
        lines.append({"audio_filepath": f"{i}.wav", "duration": seconds, "text": f"clip {i}"})
    (tmp / "manifest.json").write_text("\n".join(json.dumps(r) for r in lines))
    return stoker.AudioDataset(tmp / "manifest.json")


def make_audio_fbank(tmp):
    make_audio_nemo(tmp)
    return stoker.AudioDataset(tmp / "manifest.json", features=stoker.audio.Fbank(num_mel_bins=8))


class DictSamples(torch.utils.data.Dataset):
    """A Python map-style dataset of dict samples (Trainer's collator batches them)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "labels": i % 2}


def make_python_dicts(tmp):
    return DictSamples()


def make_mixture(tmp):
    def part(offset):
        return stoker.ArrayDataset(np.arange(offset, offset + 6, dtype=np.float32)[:, None],
                                   np.arange(6) % 2, names=["x", "labels"])
    return stoker.Mixture({"a": part(0), "b": part(100)})


IMAGES = {"pixel_values", "labels"}  # transformers' vision and video models' names
# Each dataset, and the keys its batches reach the model with (None: the dataset's own, as the
# LeRobot dataset's features name them).
DATASETS = {
    "arrays": (make_arrays, {"x", "labels"}),
    "tokens-concat": (make_tokens_concat, {"input_ids", "labels", "shift_labels"}),
    "tokens-best_fit": (make_tokens_best_fit, {"input_ids", "labels", "shift_labels",
                                               "position_ids", "cu_seqlens", "max_seqlen",
                                               "use_cache"}),
    "text-sft-best_fit": (make_text_sft, {"input_ids", "labels", "shift_labels", "position_ids",
                                          "cu_seqlens", "max_seqlen", "use_cache"}),
    "text-rows": (make_text_rows, {"input_ids", "labels", "shift_labels", "attention_mask",
                                   "lengths"}),
    "image-folder": (make_image_folder, IMAGES),
    "tar-shards": (make_tar_shards, IMAGES),
    "image-text": (make_image_text, IMAGES | {"input_ids", "attention_mask"}),
    "image-text-buckets": (make_image_text_buckets,
                           IMAGES | {"original_sizes", "crop_top_lefts"}),
    "image-text-captions": (make_image_text_captions,
                            {"input_ids", "attention_mask", "lengths", "labels"}),
    "table": (make_table, {"x", "labels"}),
    "image-table": (make_image_table, IMAGES),
    # VideoDataset once failed here at the first batch: model(**batch) with a tuple (TypeError)
    "video": (make_video_folder, IMAGES),
    "video-timestamps": (make_video_with_timestamps, IMAGES | {"timestamps"}),
    "lerobot": (make_lerobot, None),
    "audio": (make_audio_nemo, {"audio", "audio_lens", "text"}),
    "audio-fbank": (make_audio_fbank, {"features", "features_lens", "text"}),
    "python-dicts": (make_python_dicts, {"x", "labels"}),
    "mixture": (make_mixture, {"x", "labels"}),
}


@pytest.mark.parametrize("make, expected", DATASETS.values(), ids=DATASETS.keys())
def test_every_dataset_trains_a_step_with_dict_batches(make, expected, tmp_path):
    ds = make(tmp_path)
    keys = train_one_step(ds, tmp_path / "out")
    assert keys == declared_keys(ds)
    if expected is not None:
        assert keys == expected


def test_a_dataset_that_cannot_name_its_fields_says_so_before_the_first_step(tmp_path):
    ds = stoker.ArrayDataset(np.zeros((4, 2), np.float32), np.arange(4))  # no names
    with pytest.raises(ValueError, match="names="):
        train_one_step(ds, tmp_path)


# --------------------------------------------------------------------------- a new modality


class SensorDataset(StokerDataset):
    """A modality made the documented way (docs/architecture.md, "Adding a modality"): a
    StokerDataset subclass with a native engine source, declaring the protocol members. ``n``
    synthetic readings (float32, shape (8,)) and their int64 index ``idx``."""

    CALIBRATE_SECONDS = 0.25  # synthetic: the worker seconds one reading of the counters adds

    def __init__(self, n, seed=0):
        self.n = n
        self.readings = np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32)
        self.idx = np.arange(n, dtype=np.int64)
        self._source = _native.sources.ArraySource([self.readings, self.idx],
                                                   ["readings", "idx"], [])
        self._calibrated = 0.0  # seconds, counted up at each reading of the counters
        self._reads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.readings[i], self.idx[i]

    def _batch_names(self):
        return ("readings", "idx")

    def _stats(self):
        return {**super()._stats(), "sensor": {"samples": self.n}}

    def _counters(self):
        self._calibrated += self.CALIBRATE_SECONDS
        self._reads += 1
        return {"calibrate_s": self._calibrated, "reads": self._reads}

    def _figures(self, before, after):
        return [figure("calibrate seconds", after["calibrate_s"] - before["calibrate_s"], "s",
                       stage="calibrate", advice="calibrate fewer readings"),
                figure("readings", self.n, "readings")]

    def _identity(self):
        return ("sensor", self.n)

    def _where(self):
        return f"{self.n} synthetic sensor readings"


def sensor_batches(loader):
    return [tuple(np.asarray(f).copy() for f in b) for b in loader]


def test_sensor_every_sample_once_an_epoch_whatever_the_workers():
    ds = SensorDataset(20)
    epochs = {}
    for workers in (0, 2):
        loader = stoker.DataLoader(ds, batch_size=3, shuffle=True, seed=11,
                                   num_workers=workers, output="numpy")
        epochs[workers] = sensor_batches(loader)
    one = epochs[0]
    assert len(one) == 7
    order = [int(i) for _, idx in one for i in idx]
    assert sorted(order) == list(range(20)) and order != list(range(20))
    for readings, idx in one:
        np.testing.assert_array_equal(readings, ds.readings[idx])
    assert len(epochs[2]) == len(one)
    for a, b in zip(one, epochs[2]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("k", [1, 4])
def test_sensor_resumes_mid_epoch(k):
    kw = dict(batch_size=3, shuffle=True, seed=5, output="numpy")
    full = sensor_batches(stoker.DataLoader(SensorDataset(20), num_workers=2, **kw))
    loader = stoker.DataLoader(SensorDataset(20), num_workers=0, **kw)
    it = iter(loader)
    head = [tuple(np.asarray(f).copy() for f in next(it)) for _ in range(k)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = stoker.DataLoader(SensorDataset(20), num_workers=2, **kw)
    resumed.load_state_dict(state)
    rest = sensor_batches(resumed)
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full):
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_sensor_stats_and_diagnose_figures():
    ds = SensorDataset(30)
    loader = stoker.DataLoader(ds, batch_size=3, shuffle=True, num_workers=2, output="numpy")
    for _ in loader:
        pass
    stats = loader.stats()
    assert stats["sensor"] == {"samples": 30}
    report = stoker.diagnose(loader, max_batches=4, seconds=5)
    assert report["batches"] == 4
    by_name = {f["name"]: f for f in report["figures"]["source_figures"]}
    calibrate = by_name["calibrate seconds"]
    assert calibrate["stage"] == "calibrate" and calibrate["unit"] == "s"
    assert calibrate["value"] == pytest.approx(SensorDataset.CALIBRATE_SECONDS)
    assert calibrate["advice"] == "calibrate fewer readings"
    assert by_name["readings"]["value"] == 30 and by_name["readings"]["unit"] == "readings"
    assert isinstance(report["limiting_stage"], str) and report["verdict"]


def test_sensor_identity_and_where():
    ds = SensorDataset(7)
    assert ds._identity() == ("sensor", 7)
    assert ds._where() == "7 synthetic sensor readings"
    assert is_native(ds)  # read by the engine, through its declared _source


def test_sensor_trains_a_step_keyed_readings_and_idx(tmp_path):
    assert train_one_step(SensorDataset(10), tmp_path) == {"readings", "idx"}
