"""stoker.VLMDataset: conversations with images as a vision-language model's Hugging Face
processor makes them (include/stoker/image_text/vlm_source.h). Against transformers' own
LlavaProcessor and Qwen2VLProcessor (their PIL image processors): input_ids equal to
processor.apply_chat_template plus the processor's call, labels to its assistant mask, pixel
values within the stated tolerance (docs/image-text.md); packing, exactly once, worker
independence and resume; bad rows named or skipped."""

from __future__ import annotations

import functools
import json
import os
import tarfile

import numpy as np
import pytest

import stoker

PIL = pytest.importorskip("PIL.Image")
pytest.importorskip("stoker._text")
transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer as HfTokenizer, decoders, models, pre_tokenizers, processors, \
    trainers  # noqa: E402

from test_image_processors import QWEN, SLOW_ATOL, encode, encode_transparent, \
    hf_processor  # noqa: E402

# LLaVA-1.5's template as llava-hf publishes it (its assistant text in generation blocks).
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")
# Qwen2-VL's, with the assistant's turns in generation blocks (for the reference mask).
QWEN_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% set body %}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endset %}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ body }}{% endgeneration %}"
    "{% else %}{{ body }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

WORDS = ("a cat sits on the mat while two dogs run in the snow and a red boat floats near "
         "city lights at dusk what is shown here describe the picture briefly").split()
SPECIALS = ["<s>", "</s>", "<pad>", "<image>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
            "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# (width, height, format) of the folder's images
# (RGBA and P: PNGs with transparency, which the processors composite on white)
SIZES = [(64, 48, "JPEG"), (37, 53, "PNG"), (90, 31, "JPEG"), (54, 48, "PNG"), (120, 80, "JPEG"),
         (48, 64, "PNG"), (41, 35, "RGBA"), (30, 44, "P")]


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def hf_tokenizer():
    tok = HfTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = np.random.default_rng(0)
    tok.train_from_iterator([sentence(rng, 20) for _ in range(200)], trainer=trainers.BpeTrainer(
        vocab_size=400, show_progress=False, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    # Llama's: a bos before the text (the processor's call adds it; the template does not).
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


@pytest.fixture(scope="module")
def llava(hf_tokenizer):
    from test_image_processors import SMALL_CLIP
    clip = {**SMALL_CLIP, "crop_size": {"height": 28, "width": 28}, "size": {"shortest_edge": 28}}
    return transformers.LlavaProcessor(
        image_processor=hf_processor(clip), tokenizer=hf_tokenizer, patch_size=14,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template=LLAVA_TEMPLATE)


# LLaVA-NeXT's processor at 28 px tiles: pinpoints of 1 to 3 tiles, 14 px patches.
NEXT = {"image_processor_type": "LlavaNextImageProcessor", "size": {"shortest_edge": 28},
        "crop_size": {"height": 28, "width": 28}, "resample": 3,
        "image_grid_pinpoints": [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]}


@pytest.fixture(scope="module")
def llava_next(hf_tokenizer):
    from transformers.models.llava_next import image_processing_pil_llava_next as pil
    images = pil.LlavaNextImageProcessorPil(
        **{k: v for k, v in NEXT.items() if k != "image_processor_type"})
    return transformers.LlavaNextProcessor(
        image_processor=images, tokenizer=hf_tokenizer, patch_size=14,
        vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template=LLAVA_TEMPLATE)


@pytest.fixture(scope="module")
def qwen(hf_tokenizer):
    return transformers.Qwen2VLProcessor(
        image_processor=hf_processor(QWEN), tokenizer=hf_tokenizer,
        video_processor=transformers.Qwen2VLVideoProcessor(), chat_template=QWEN_TEMPLATE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("images")
    for i, (w, h, fmt) in enumerate(SIZES):
        data = encode(w, h, fmt, i) if fmt in ("JPEG", "PNG") else \
            encode_transparent(w, h, fmt, i)
        (d / image_name(i)).write_bytes(data)
    return d


def image_name(i):
    return f"img{i}.{'jpg' if SIZES[i][2] == 'JPEG' else 'png'}"


def llava_rows(n, seed=3):
    """LLaVA-format rows: one image, none, or two (placeholders where the images go)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        kind = i % 4
        turns, images = [], []
        if kind == 3:
            turns.append({"from": "system", "value": sentence(rng, 3)})
        for t in range(int(rng.integers(1, 3))):
            question = sentence(rng, int(rng.integers(2, 8)))
            if t == 0 and kind in (0, 3):
                question = "<image>\n" + question
                images.append(image_name(int(rng.integers(len(SIZES)))))
            elif t == 0 and kind == 2:
                question = "<image>\n" + question + "\n<image>"
                images += [image_name(int(k)) for k in rng.integers(len(SIZES), size=2)]
            turns.append({"from": "human", "value": question})
            turns.append({"from": "gpt", "value": sentence(rng, int(rng.integers(1, 10)))})
        row = {"id": str(i), "conversations": turns}
        if images:
            row["image"] = images[0] if len(images) == 1 else images
        rows.append(row)
    return rows


def as_messages(row):
    """transformers' messages for a LLaVA row (the conversion VLMDataset documents)."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    out = []
    for turn in row["conversations"]:
        items = []
        for k, piece in enumerate(turn["value"].split("<image>")):
            if k:
                items.append({"type": "image"})
            if piece.strip():
                items.append({"type": "text", "text": piece.strip()})
        out.append({"role": roles[turn["from"]], "content": items})
    return out


def reference(processor, row, folder):
    """processor.apply_chat_template(..., tokenize=True, return_assistant_tokens_mask=True):
    (input_ids, labels, pixel_values, image_grid_thw or None, mm_token_type_ids or None)."""
    names = row.get("image", [])
    names = [names] if isinstance(names, str) else names
    images = [PIL.open(folder / n) for n in names]  # as opened: the processor converts them
    messages = as_messages(row)
    k = 0
    for m in messages:
        for item in m["content"]:
            if item["type"] == "image":
                item["image"] = images[k]
                k += 1
    out = processor.apply_chat_template(messages, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True, return_tensors="np")
    ids = out["input_ids"][0]
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    labels = np.where((out["assistant_masks"][0] == 1) & (ids != image_id), ids, -100)
    types = out["mm_token_type_ids"][0] if "mm_token_type_ids" in out else None
    pixels, info = out.get("pixel_values"), out.get("image_grid_thw")
    if "image_sizes" in out:  # LLaVA-NeXT: [images, most tiles, 3, H, W], less the padding
        info = out["image_sizes"]
        tiles = [next_tiles(processor.image_processor, *size) for size in info]
        pixels = np.concatenate([pixels[k, :n] for k, n in enumerate(tiles)])
    return ids, labels, pixels, info, types


def next_tiles(image_processor, height, width):
    """LLaVA-NeXT's tiles of an image, by transformers' own resolution choice."""
    from transformers.image_processing_utils import select_best_resolution
    h, w = select_best_resolution((int(height), int(width)), image_processor.image_grid_pinpoints)
    side = image_processor.crop_size["height"]
    return 1 + (h // side) * (w // side)


def write_json(path, rows):
    path.write_text(json.dumps(rows))
    return str(path)


def check_batches(ds, processor, rows, folder, batch_size=3, workers=2):
    """Every row once, each equal to the processor's."""
    refs = [reference(processor, row, folder) for row in rows]
    seen = []
    for b in stoker.DataLoader(ds, batch_size=batch_size, shuffle=True, seed=5,
                               num_workers=workers, output="numpy"):
        image = 0
        patch = 0
        for r in range(len(b["input_ids"])):
            n = int(b["lengths"][r])
            ids = b["input_ids"][r, :n]
            # the row whose processor output these tokens are (the rows differ)
            match = [i for i, ref in enumerate(refs) if i not in seen and len(ref[0]) == n and
                     (ref[0] == ids).all()]
            assert match, "a sample equal to no row's processor output"
            seen.append(match[0])
            _, want_labels, want_px, want_grid, want_types = refs[match[0]]
            np.testing.assert_array_equal(b["labels"][r, :n], want_labels)
            assert (want_types is None) == ("mm_token_type_ids" not in b)
            if want_types is not None:
                np.testing.assert_array_equal(b["mm_token_type_ids"][r, :n], want_types)
            assert (b["attention_mask"][r, :n] == 1).all() and (b["attention_mask"][r, n:] == 0).all()
            assert (b["labels"][r, n:] == -100).all()
            count = int(b["image_counts"][r])
            if want_px is None:
                assert count == 0
                continue
            if want_grid is None:
                np.testing.assert_allclose(b["pixel_values"][image:image + count], want_px,
                                           atol=SLOW_ATOL, rtol=0)
            else:  # dynamic: rows of patches or tiles, and each image's grid or size
                rows_px = len(want_px)
                np.testing.assert_allclose(b["pixel_values"][patch:patch + rows_px], want_px,
                                           atol=SLOW_ATOL, rtol=0)
                info = "image_grid_thw" if "image_grid_thw" in b else "image_sizes"
                np.testing.assert_array_equal(b[info][image:image + count], want_grid)
                patch += rows_px
            image += count
        info = next((k for k in ("image_grid_thw", "image_sizes") if k in b), "pixel_values")
        assert image == len(b[info])
    assert sorted(seen) == list(range(len(rows)))


def test_llava_rows_equal_the_llava_processor(tmp_path, llava, folder):
    rows = llava_rows(16)
    ds = stoker.VLMDataset(write_json(tmp_path / "llava.json", rows), llava, images=folder)
    assert ds.image_token == "<image>"
    s = ds.stats()
    assert s["kept"] == 16 and s["skipped"] == 0
    assert s["image_tokens"] == 4 * s["images"]  # (28 / 14)^2 + 1 (CLS) - 1 ("default")
    check_batches(ds, llava, rows, folder)


def test_llava_next_rows_equal_the_llava_next_processor(tmp_path, llava_next, folder):
    """LLaVA-NeXT's any-resolution images: each image's tokens from its size (the grid chosen,
    its padding rows or columns dropped, a newline a row, the base tile), pixel_values its tiles
    one image after another ([tiles, 3, 28, 28]: transformers' [images, most tiles, ...] less
    the padding, which its model drops), image_sizes; ids, labels and pixels equal to the
    processor's."""
    rows = llava_rows(12, seed=7)
    ds = stoker.VLMDataset(write_json(tmp_path / "n.json", rows), llava_next, images=folder)
    assert ds.image_token == "<image>"
    processor = ds.image_processor
    assert isinstance(processor, stoker.image_text.TileImageProcessor)
    for w, h, _ in SIZES:  # the count transformers' processor gives
        want = llava_next._get_number_of_features(h, w, 28, 28) - 1
        assert processor.num_image_tokens(h, w) == want
    assert len({processor.tiles(h, w) for w, h, _ in SIZES}) >= 2
    check_batches(ds, llava_next, rows, folder, batch_size=3, workers=2)


def test_a_llava_next_batch_gives_the_logits_of_the_processors(tmp_path, llava_next, folder):
    """A tiny LlavaNextForConditionalGeneration on a Stoker batch and on the processor's own
    batch of the same conversations: the same logits (the model splits the tiles by
    image_sizes); and StokerTrainer trains a step on it."""
    import torch
    from stoker.integrations.transformers import StokerTrainer
    tok = llava_next.tokenizer
    torch.manual_seed(0)
    config = transformers.LlavaNextConfig(
        vision_config={"model_type": "clip_vision_model", "hidden_size": 16,
                       "intermediate_size": 32, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
        text_config={"model_type": "llama", "vocab_size": len(tok), "hidden_size": 32,
                     "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "max_position_embeddings": 4096},
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=NEXT["image_grid_pinpoints"],
        vision_feature_select_strategy="default")
    model = transformers.LlavaNextForConditionalGeneration(config).eval()
    rows = [r for r in llava_rows(8, seed=9) if "image" in r][:3]
    ds = stoker.VLMDataset(write_json(tmp_path / "l.json", rows), llava_next, images=folder)
    refs = {}
    for row in rows:
        ids, _, _, _, _ = reference(llava_next, row, folder)
        refs[tuple(ids.tolist())] = row
    for b in stoker.DataLoader(ds, batch_size=1, output="torch"):
        n = int(b["lengths"][0])
        row = refs[tuple(b["input_ids"][0, :n].tolist())]
        names = row["image"] if isinstance(row["image"], list) else [row["image"]]
        messages = as_messages(row)
        k = 0
        for m in messages:
            for item in m["content"]:
                if item["type"] == "image":
                    item["image"] = PIL.open(folder / names[k])
                    k += 1
        hf = llava_next.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            return_tensors="pt")
        with torch.no_grad():
            want = model(**hf).logits
            got = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                        pixel_values=b["pixel_values"], image_sizes=b["image_sizes"]).logits
        torch.testing.assert_close(got[:, :n], want, atol=1e-5, rtol=1e-4)

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
        learning_rate=3e-3, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
        logging_steps=1)
    trainer = StokerTrainer(model=model.train(), args=args, train_dataset=ds)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_qwen2_vl_rows_equal_the_qwen2_vl_processor(tmp_path, qwen, folder):
    rows = llava_rows(12, seed=4)
    ds = stoker.VLMDataset(write_json(tmp_path / "q.json", rows), qwen, images=folder)
    assert ds.image_token == "<|image_pad|>"
    assert "image_grid_thw" in ds[0] or "image_grid_thw" in ds._names
    check_batches(ds, qwen, rows, folder, batch_size=2, workers=1)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_later_qwen_vl_processors_give_the_same(tmp_path, hf_tokenizer, folder, family):
    """Qwen2.5-VL's and Qwen3-VL's processors (Qwen2-VL's image processor; Qwen3-VL's with 16 px
    patches and mean/std 0.5, as its checkpoints configure it): ids, labels, patches and grids
    equal to theirs."""
    image_config = dict(QWEN)
    if family == "qwen3_vl":
        image_config.update(patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                            min_pixels=4 * 32 * 32, max_pixels=24 * 32 * 32)
        processor = transformers.Qwen3VLProcessor(
            image_processor=hf_processor(image_config), tokenizer=hf_tokenizer,
            video_processor=transformers.Qwen3VLVideoProcessor(), chat_template=QWEN_TEMPLATE)
    else:
        processor = transformers.Qwen2_5_VLProcessor(
            image_processor=hf_processor(image_config), tokenizer=hf_tokenizer,
            video_processor=transformers.Qwen2VLVideoProcessor(), chat_template=QWEN_TEMPLATE)
    rows = llava_rows(8, seed=5)
    ds = stoker.VLMDataset(write_json(tmp_path / "q.json", rows), processor, images=folder)
    assert ds.image_processor.options["patch_size"] == image_config["patch_size"]
    check_batches(ds, processor, rows, folder, batch_size=2, workers=1)


def test_a_template_without_generation_blocks_trains_the_same_tokens(tmp_path, qwen, folder):
    """Qwen2-VL's template as published has no {% generation %} block: the assistant's tokens
    are found by rendering the conversation up to each turn (text.md's prefix rule), the same
    tokens as the marked template's."""
    published = (QWEN_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", ""))
    rows = llava_rows(10, seed=6)
    src = write_json(tmp_path / "g.json", rows)
    marked = stoker.VLMDataset(src, qwen, images=folder)
    plain = stoker.VLMDataset(src, qwen, images=folder, chat_template=published)
    for i in range(len(marked)):
        a, b = marked[i], plain[i]
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
        np.testing.assert_array_equal(a["labels"], b["labels"])
        assert (a["labels"] != -100).any()


def test_a_model_directory_gives_what_the_processor_object_gives(tmp_path, llava, folder):
    llava.save_pretrained(tmp_path / "model")
    rows = llava_rows(8)
    src = write_json(tmp_path / "rows.json", rows)
    a = stoker.VLMDataset(src, llava, images=folder)
    b = stoker.VLMDataset(src, str(tmp_path / "model"), images=folder)
    for i in range(len(a)):
        for k, v in a[i].items():
            np.testing.assert_array_equal(v, b[i][k])


def test_images_from_bytes_in_parquet_and_from_tars_equal_the_folder(tmp_path, llava, folder):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    rows = llava_rows(10)
    want = stoker.VLMDataset(write_json(tmp_path / "r.json", rows), llava, images=folder)
    # datasets' Image feature: {"bytes", "path"}; the conversation as JSONL rows hold it
    table_rows = []
    for row in rows:
        names = row.get("image", [])
        names = [names] if isinstance(names, str) else names
        table_rows.append({"conversations": json.dumps(row["conversations"]),
                           "images": [{"bytes": (folder / n).read_bytes(), "path": n}
                                      for n in names]})
    table = pa.Table.from_pylist(table_rows)
    table = table.set_column(0, "conversations", pa.array(
        [json.loads(r["conversations"]) for r in table_rows]))
    pq.write_table(table, tmp_path / "r.parquet")
    from_bytes = stoker.VLMDataset(str(tmp_path / "r.parquet"), llava)
    shard = tmp_path / "images.tar"
    with tarfile.open(shard, "w") as tar:
        for i in range(len(SIZES)):
            tar.add(folder / image_name(i), arcname=f"coco/{image_name(i)}")
    tar_rows = json.loads(json.dumps(rows))
    for row in tar_rows:
        if "image" in row:
            row["image"] = ([f"coco/{n}" for n in row["image"]] if isinstance(row["image"], list)
                            else f"coco/{row['image']}")
    from_tar = stoker.VLMDataset(write_json(tmp_path / "t.json", tar_rows), llava,
                                 images=str(shard))
    # a datasets.Dataset of those rows, its images a List(Image()) column (PIL images when
    # read as they are: the dataset reads their bytes)
    datasets = pytest.importorskip("datasets")
    hub = datasets.Dataset.from_list(table_rows).cast_column(
        "images", datasets.List(datasets.Image()))
    hub = hub.map(lambda r: {"conversations": json.loads(r["conversations"])})
    assert type(hub[0]["images"][0]).__module__.startswith("PIL")
    from_hub = stoker.VLMDataset(hub, llava)
    for other in (from_bytes, from_tar, from_hub):
        assert len(other) == len(want)
        for i in range(len(want)):
            for k, v in want[i].items():
                np.testing.assert_array_equal(v, other[i][k])


def test_the_index_is_kept_in_cache_dir_and_opened_again(tmp_path, llava, folder):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    rows = llava_rows(8)
    table = pa.Table.from_pylist([{"conversations": r["conversations"], "images": [
        (folder / n).read_bytes() for n in ([r["image"]] if isinstance(r.get("image"), str)
                                            else r.get("image", []))]} for r in rows])
    pq.write_table(table, tmp_path / "c.parquet")
    src, cache = str(tmp_path / "c.parquet"), tmp_path / "cache"
    plain = stoker.VLMDataset(src, llava)
    first = stoker.VLMDataset(src, llava, cache_dir=cache)
    stores = sorted(p.name for p in cache.iterdir())
    assert len(stores) == 1 and stores[0].startswith("vlm-")
    assert (cache / stores[0] / "images.bin").stat().st_size > 0  # the rows' image bytes
    again = stoker.VLMDataset(src, llava, cache_dir=cache, pack="best_fit", seq_len=256)
    reopened = stoker.VLMDataset(src, llava, cache_dir=cache)
    assert sorted(p.name for p in cache.iterdir()) == stores  # opened, not built again
    for i in range(len(plain)):
        for k, v in plain[i].items():
            np.testing.assert_array_equal(v, first[i][k])
            np.testing.assert_array_equal(v, reopened[i][k])
    assert len(again) < len(plain)
    os.utime(src, ns=(1, 1))  # the source changed: another index
    stoker.VLMDataset(src, llava, cache_dir=cache)
    assert len(list(cache.iterdir())) == 2


def test_packs_hold_whole_conversations_by_tokens_with_cu_seqlens(tmp_path, llava, folder):
    rows = llava_rows(30)
    src = write_json(tmp_path / "p.json", rows)
    single = stoker.VLMDataset(src, llava, images=folder)
    lengths = [len(single[i]["input_ids"]) for i in range(len(single))]
    ds = stoker.VLMDataset(src, llava, images=folder, pack="best_fit", seq_len=96)
    assert len(ds) < len(single)
    seen = []
    for b in stoker.DataLoader(ds, batch_size=1, shuffle=True, seed=1, num_workers=2,
                               output="numpy"):
        n = int(b["lengths"][0])
        assert n <= 96
        cu = b["cu_seqlens"][0, :int(b["cu_seqlens_lengths"][0])]
        assert cu[0] == 0 and cu[-1] == n
        segments = np.diff(cu)
        assert int(b["max_seqlen"][0]) == segments.max()
        pos = b["position_ids"][0, :n]
        for start, length in zip(cu[:-1], segments):
            np.testing.assert_array_equal(pos[start:start + length], np.arange(length))
        ids = b["input_ids"][0, :n]
        # each segment is one conversation, equal to its unpacked sample
        for start, length in zip(cu[:-1], segments):
            match = [i for i in range(len(single)) if i not in seen and lengths[i] == length and
                     (single[i]["input_ids"] == ids[start:start + length]).all()]
            assert match
            seen.append(match[0])
            np.testing.assert_array_equal(b["labels"][0, start:start + length],
                                          single[match[0]]["labels"])
        image_tokens = int((ids == ds.image_token_id).sum())
        assert len(b["pixel_values"]) * 4 == image_tokens
    assert sorted(seen) == list(range(len(single)))
    assert ds.stats()["padding"] == 96 * len(ds) - sum(lengths)


def test_batches_do_not_depend_on_workers_and_resume(tmp_path, qwen, folder):
    rows = llava_rows(24, seed=8)
    ds = stoker.VLMDataset(write_json(tmp_path / "w.json", rows), qwen, images=folder)

    def run(workers, state=None):
        loader = stoker.DataLoader(ds, batch_size=3, shuffle=True, seed=11, num_workers=workers,
                                   output="numpy")
        if state is not None:
            loader.load_state_dict(state)
        return loader

    def flat(batches):
        return [[np.asarray(batch[k]).tobytes() for k in sorted(batch)] for batch in batches]

    whole = flat(run(0))
    assert whole == flat(run(2))
    loader = run(2)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert flat(first) + flat(run(1, state)) == whole


def test_ranks_share_the_conversations_and_resume_on_another_world_size(tmp_path, llava, folder):
    rows = llava_rows(42, seed=10)
    ds = stoker.VLMDataset(write_json(tmp_path / "r.json", rows), llava, images=folder)
    want = sorted(tuple(ds[i]["input_ids"].tolist()) for i in range(len(ds)))
    assert len(set(want)) == len(want)

    def keys(b):
        return [tuple(b["input_ids"][r, :n].tolist()) for r, n in enumerate(b["lengths"])]

    seen = []
    old = [stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=4, rank=r, world_size=2,
                             output="numpy") for r in range(2)]
    for loader in old:
        it = iter(loader)
        for _ in range(3):
            seen += keys(next(it))
    state = json.loads(json.dumps(old[0].state_dict()))
    for r in range(3):  # the job resumes on 3 ranks
        new = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=4, rank=r, world_size=3,
                                output="numpy")
        new.load_state_dict(state)
        for b in new:
            seen += keys(b)
    assert sorted(seen) == want


def test_a_token_budget_counts_the_image_tokens(tmp_path, qwen, folder):
    rows = llava_rows(30, seed=2)
    ds = stoker.VLMDataset(write_json(tmp_path / "b.json", rows), qwen, images=folder)
    lengths = ds._lengths("tokens")
    assert all(lengths[i] == len(ds[i]["input_ids"]) for i in range(len(ds)))
    assert lengths.max() > 60  # image tokens counted
    seen = 0
    for b in stoker.DataLoader(ds, batch_size=stoker.Budget(tokens=400), shuffle=True, seed=3,
                               output="numpy"):
        assert b["input_ids"].size <= 400
        seen += len(b["input_ids"])
    assert seen == len(ds)


def write_jsonl_bytes(path, lines):
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def test_bad_rows_are_named_or_skipped_and_counted(tmp_path, llava, folder):
    good = [json.dumps(r).encode() for r in llava_rows(6)]
    too_many = {"image": image_name(0), "conversations": [
        {"from": "human", "value": "<image> and <image>"}, {"from": "gpt", "value": "two"}]}
    too_few = {"image": [image_name(0), image_name(1)], "conversations": [
        {"from": "human", "value": "<image> one"}, {"from": "gpt", "value": "one"}]}
    missing = {"image": "nowhere.jpg", "conversations": [
        {"from": "human", "value": "<image> one"}, {"from": "gpt", "value": "one"}]}
    cases = [
        (b"{not json", r"bad\.jsonl:3: not JSON"),
        (b'{"conversations": [{"from": "human", "value": "caf\xe9"}]}', r"bad\.jsonl:3: not JSON"),
        (json.dumps(too_many).encode(), r"bad\.jsonl: row 2.*2 image placeholders and 1 image"),
        (json.dumps(too_few).encode(), r"bad\.jsonl: row 2.*1 image placeholder and 2 images"),
        (json.dumps(missing).encode(), r"bad\.jsonl: row 2.*nowhere\.jpg"),
    ]
    for line, message in cases:
        path = write_jsonl_bytes(tmp_path / "bad.jsonl", good[:2] + [line] + good[2:])
        with pytest.raises(stoker.SampleError, match=message):
            stoker.VLMDataset(path, llava, images=folder)
        with pytest.warns(UserWarning, match="skipped 1 bad rows"):
            ds = stoker.VLMDataset(path, llava, images=folder, on_error="skip")
        assert len(ds) == 6 and ds.stats()["skipped"] == 1
    with pytest.raises(ValueError, match=r"broken\.json: not JSON"):
        (tmp_path / "broken.json").write_text("[{")
        stoker.VLMDataset(str(tmp_path / "broken.json"), llava, images=folder)
    # an image that decodes badly: the loader names the sample
    (tmp_path / "imgs").mkdir()
    for i in range(len(SIZES)):
        (tmp_path / "imgs" / image_name(i)).write_bytes((folder / image_name(i)).read_bytes())
    rows = llava_rows(8)
    (tmp_path / "imgs" / image_name(2)).write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all")
    ds = stoker.VLMDataset(write_json(tmp_path / "d.json", rows), llava, images=tmp_path / "imgs")
    uses = [i for i, r in enumerate(rows) if image_name(2) in json.dumps(r.get("image", []))]
    assert uses
    with pytest.raises(stoker.SampleError, match=r"d\.json: row"):
        list(stoker.DataLoader(ds, batch_size=2, output="numpy"))
    loader = stoker.DataLoader(ds, batch_size=1, output="numpy", on_error="skip")
    list(loader)
    assert loader.stats()["skipped"] == len(uses)


def test_the_options_are_checked(tmp_path, llava, folder):
    src = write_json(tmp_path / "o.json", llava_rows(4))
    with pytest.raises(ValueError, match="seq_len"):
        stoker.VLMDataset(src, llava, images=folder, seq_len=64)
    with pytest.raises(ValueError, match="pack"):
        stoker.VLMDataset(src, llava, images=folder, pack="concat", seq_len=64)
    with pytest.raises(ValueError, match="image token"):
        stoker.VLMDataset(src, llava, images=folder, image_token="<nope>")
    with pytest.raises(stoker.SampleError, match="more than max_length 5"):
        stoker.VLMDataset(src, llava, images=folder, max_length=5)


def test_stoker_trainer_trains_a_llava_step(tmp_path, llava, folder):
    """StokerTrainer trains a (tiny) LLaVA on the batches: the images reach the vision tower
    as the model takes them, the loss is finite and falls."""
    import torch
    from stoker.integrations.transformers import StokerTrainer

    rows = llava_rows(24, seed=12)
    ds = stoker.VLMDataset(write_json(tmp_path / "t.json", rows), llava, images=folder)
    tok = llava.tokenizer
    torch.manual_seed(0)
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            image_size=28, patch_size=14, projection_dim=16),
        text_config=transformers.LlamaConfig(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512),
        image_token_index=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-1,
        vision_feature_select_strategy="default")
    model = transformers.LlavaForConditionalGeneration(config)
    seen = record_forward(model)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=5, per_device_train_batch_size=4,
        learning_rate=3e-3, report_to=[], use_cpu=True, save_strategy="no",
        remove_unused_columns=True, disable_tqdm=True, logging_steps=1)
    trainer = StokerTrainer(model=model, args=args, train_dataset=ds)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 5 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    batch = seen[0]
    assert "shift_labels" not in batch  # the labels are transformers' own, not shifted
    n_images = int((batch["input_ids"] == config.image_token_index).sum()) // 4
    assert batch["pixel_values"].shape == (n_images, 3, 28, 28)


def record_forward(model):
    """A list that receives the keywords of each model.forward call (tensors copied); the
    wrapper keeps forward's signature, whose names Trainer keeps as columns."""
    import torch
    seen = []
    forward = model.forward

    @functools.wraps(forward)
    def recording(**kwargs):
        seen.append({k: v.clone() if torch.is_tensor(v) else v for k, v in kwargs.items()})
        return forward(**kwargs)
    model.forward = recording
    return seen


def tiny_qwen2_vl(tok):
    """A Qwen2-VL of one layer, float32, seeded."""
    import torch
    torch.manual_seed(0)
    config = transformers.Qwen2VLConfig(
        vision_config={"depth": 1, "embed_dim": 16, "hidden_size": 32, "num_heads": 2,
                       "mlp_ratio": 2, "patch_size": 14, "spatial_merge_size": 2,
                       "temporal_patch_size": 2},
        text_config={"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "max_position_embeddings": 4096,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                         "mrope_section": [2, 3, 3]}},
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"))
    return transformers.Qwen2VLForConditionalGeneration(config)


def test_stoker_trainer_trains_a_qwen2_vl_step(tmp_path, qwen, folder):
    """Qwen2-VL's layout reaches its model: the batch's patches one after the other
    ([patches, 1176]) with image_grid_thw, each image's tokens its grid's / merge_size**2."""
    import torch
    from stoker.integrations.transformers import StokerTrainer

    rows = llava_rows(16, seed=13)
    ds = stoker.VLMDataset(write_json(tmp_path / "q.json", rows), qwen, images=folder)
    model = tiny_qwen2_vl(qwen.tokenizer)
    config = model.config
    seen = record_forward(model)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=4,
        learning_rate=3e-3, report_to=[], use_cpu=True, save_strategy="no",
        remove_unused_columns=True, disable_tqdm=True, logging_steps=1)
    trainer = StokerTrainer(model=model, args=args, train_dataset=ds)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    for batch in seen:
        grid = batch["image_grid_thw"]
        assert batch["pixel_values"].shape == (int(grid.prod(dim=1).sum()), 1176)
        assert int((batch["input_ids"] == config.image_token_id).sum()) == \
            int(grid.prod(dim=1).sum()) // 4


def test_packed_qwen2_vl_conversations_have_the_logits_they_have_alone(tmp_path, qwen, folder):
    """A Qwen2-VL pack's position_ids are [4, B, L]: each conversation's text positions, then
    its M-RoPE (t, h, w) positions, equal to transformers' get_rope_index of the conversation
    alone. The model masks the pack apart by the text positions (without a cache, as
    StokerTrainer passes use_cache=False), so each conversation's logits in a pack equal its
    logits alone; a trainer step takes the pack."""
    import torch
    rows = llava_rows(12, seed=6)
    src = write_json(tmp_path / "m.json", rows)
    single = stoker.VLMDataset(src, qwen, images=folder)
    ds = stoker.VLMDataset(src, qwen, images=folder, pack="best_fit", seq_len=160)
    assert len(ds) < len(single)
    model = tiny_qwen2_vl(qwen.tokenizer).eval()
    alone = {tuple(single[i]["input_ids"].tolist()): single[i] for i in range(len(single))}
    checked, with_images = 0, 0
    for b in stoker.DataLoader(ds, batch_size=1, shuffle=True, seed=3, output="torch"):
        pos = b["position_ids"]
        assert pos.shape == (4,) + tuple(b["input_ids"].shape)
        inputs = {k: b[k] for k in ("input_ids", "pixel_values", "image_grid_thw",
                                    "mm_token_type_ids")}
        with torch.no_grad():
            packed = model(**inputs, position_ids=pos, use_cache=False).logits[0]
        cu = b["cu_seqlens"][0, :int(b["cu_seqlens_lengths"][0])].tolist()
        for s, e in zip(cu[:-1], cu[1:]):
            ids = b["input_ids"][0, s:e]
            one = alone[tuple(ids.tolist())]
            types = torch.as_tensor(one["mm_token_type_ids"])[None]
            grid = torch.as_tensor(one["image_grid_thw"]) if len(one["image_grid_thw"]) else None
            want, _ = model.model.get_rope_index(ids[None], types, grid)
            np.testing.assert_array_equal(pos[1:, 0, s:e].numpy(), want[:, 0].numpy())
            np.testing.assert_array_equal(pos[0, 0, s:e].numpy(), np.arange(e - s))
            kwargs = {"input_ids": ids[None], "mm_token_type_ids": types,
                      "attention_mask": torch.ones_like(ids)[None]}
            if grid is not None:
                kwargs.update(pixel_values=torch.as_tensor(one["pixel_values"]),
                              image_grid_thw=grid)
                with_images += 1
            with torch.no_grad():
                ref = model(**kwargs).logits[0]
            torch.testing.assert_close(packed[s:e], ref, atol=2e-5, rtol=1e-4)
            checked += 1
    assert checked == len(single) and with_images >= 6

    from stoker.integrations.transformers import StokerTrainer
    seen = record_forward(model)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=1,
        learning_rate=3e-3, report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    StokerTrainer(model=model.train(), args=args, train_dataset=ds).train()
    assert len(seen) == 2
    for kwargs in seen:
        assert kwargs["use_cache"] is False and "attention_mask" not in kwargs
        assert kwargs["position_ids"].shape == (4,) + tuple(kwargs["input_ids"].shape)
