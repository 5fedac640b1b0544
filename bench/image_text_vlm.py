"""The VLM SFT part of bench/bench_image_text.py (its docstring says what is measured): the data,
and the measurement children of stoker.VLMDataset and of Hugging Face's processor over
``datasets.map`` and torch's DataLoader."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

VLM_BATCH = 16
CROP = 336  # LLaVA-1.5's CLIP ViT-L/14-336: 576 image tokens an image
TEXT_ONLY = 0.1  # LLaVA-665k's mix has text-only conversations too
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


def make_vlm_data(root, samples, words):
    """LLaVA-format rows over the samples' photographs (vlm/llava.json, image paths relative to
    their folder) and a LLaVA-1.5 processor saved by transformers (vlm/processor: CLIP's 336
    resize and crop, 576 image tokens, the bench's BPE with ``<image>``, a bos before each
    text). Returns the folder."""
    vlm = Path(root) / "vlm"
    if (vlm / "llava.json").exists():
        return vlm
    import os

    import transformers
    from tokenizers import Tokenizer, processors
    rng = random.Random(1)
    folder = os.path.commonpath([s["jpg"] for s in samples])
    rows = []
    for i, s in enumerate(samples):
        def text(lo, hi):
            at = rng.randrange(len(words))
            return " ".join(words[(at + k) % len(words)] for k in range(rng.randint(lo, hi)))
        turns = []
        for t in range(rng.randint(1, 3)):
            turns += [{"from": "human", "value": text(4, 20) + "?"},
                      {"from": "gpt", "value": text(5, 80) + "."}]
        row = {"id": s["key"], "conversations": turns}
        if rng.random() >= TEXT_ONLY:
            row["image"] = os.path.relpath(s["jpg"], folder)
            turns[0]["value"] = "<image>\n" + turns[0]["value"]
        rows.append(row)
    vlm.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(Path(root) / "tokenizer" / "tokenizer.json"))
    tok.add_special_tokens(["<image>", "<pad>"])
    bos = tok.token_to_id("<|startoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A", special_tokens=[("<|startoftext|>", bos)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
        pad_token="<pad>")
    clip = transformers.CLIPImageProcessor(size={"shortest_edge": CROP},
                                           crop_size={"height": CROP, "width": CROP})
    transformers.LlavaProcessor(
        image_processor=clip, tokenizer=fast, patch_size=14, num_additional_image_tokens=1,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_TEMPLATE).save_pretrained(vlm / "processor")
    (vlm / "llava.json").write_text(json.dumps(rows))
    (vlm / "folder.txt").write_text(folder)
    return vlm


def child_stoker_vlm(a):
    """stoker.VLMDataset from the JSON and the processor directory, made inside the clock (the
    rendering, tokenizing and image headers are the processing)."""
    import torch  # noqa: F401  (imported before the clock, as the peers' imports are)

    import stoker
    vlm = Path(a.root) / "vlm"
    t0 = time.perf_counter()
    ds = stoker.VLMDataset(str(vlm / "llava.json"), str(vlm / "processor"),
                           images=(vlm / "folder.txt").read_text())
    loader = stoker.DataLoader(ds, batch_size=VLM_BATCH, shuffle=True, seed=0)
    samples = tokens = 0
    for batch in loader:
        assert batch["pixel_values"].shape[1:] == (3, CROP, CROP)
        samples += len(batch["input_ids"])
        tokens += int(batch["lengths"].sum())
    return {"wall_s": time.perf_counter() - t0, "samples": samples, "tokens": tokens}


def _messages(row, folder):
    """transformers' messages for a LLaVA row, the image item holding its path."""
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    out = []
    for turn in row["conversations"]:
        items = []
        for k, piece in enumerate(turn["value"].split("<image>")):
            if k:
                items.append({"type": "image", "path": f"{folder}/{row['image']}"})
            if piece.strip():
                items.append({"type": "text", "text": piece.strip()})
        out.append({"role": roles[turn["from"]], "content": items})
    return out


def child_peer_vlm(a):
    """Hugging Face's way, two recipes:
    * hf-map: ``datasets.Dataset.from_list(rows).map(fn)`` where fn is
      ``processor.apply_chat_template(messages, tokenize=True, return_dict=True,
      return_assistant_tokens_mask=True)`` (the image loaded from its path), so the map stores
      input_ids, the assistant mask and pixel_values; torch's DataLoader pads and stacks them.
    * hf-collate (TRL's vision collator): the map only converts the rows to messages; the
      collate runs that apply_chat_template on the batch (padding=True).
    labels = input_ids where the assistant mask is 1 and the token is not the image token, -100
    elsewhere. The map runs inside the clock."""
    import datasets
    import torch
    import transformers
    vlm = Path(a.root) / "vlm"
    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()  # a kwargs notice per call otherwise
    processor = transformers.AutoProcessor.from_pretrained(str(vlm / "processor"))
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    pad = processor.tokenizer.pad_token_id
    folder = (vlm / "folder.txt").read_text()
    rows = json.loads((vlm / "llava.json").read_text())
    t0 = time.perf_counter()
    ds = datasets.Dataset.from_list([{"messages": json.dumps(_messages(r, folder))}
                                     for r in rows])

    def labels_of(ids, mask):
        return torch.where((mask == 1) & (ids != image_id), ids, torch.full_like(ids, -100))

    if a.peer == "hf-map":
        def process(row):
            out = processor.apply_chat_template(
                json.loads(row["messages"]), tokenize=True, return_dict=True,
                return_assistant_tokens_mask=True, return_tensors="np")
            got = {"input_ids": out["input_ids"][0], "assistant_masks": out["assistant_masks"][0]}
            if "pixel_values" in out:
                got["pixel_values"] = out["pixel_values"]
            else:
                got["pixel_values"] = None
            return got
        ds = ds.map(process, remove_columns=["messages"]).with_format("torch")

        def collate(items):
            n = max(len(x["input_ids"]) for x in items)
            ids = torch.full((len(items), n), pad)
            mask = torch.zeros((len(items), n), dtype=torch.long)
            assistant = torch.zeros((len(items), n), dtype=torch.long)
            for i, x in enumerate(items):
                k = len(x["input_ids"])
                ids[i, :k], mask[i, :k], assistant[i, :k] = x["input_ids"], 1, x["assistant_masks"]
            pixels = [x["pixel_values"] for x in items if x["pixel_values"] is not None]
            return {"input_ids": ids, "attention_mask": mask, "labels": labels_of(ids, assistant),
                    "pixel_values": torch.cat(pixels) if pixels else None}
    else:
        def collate(items):
            out = processor.apply_chat_template(
                [json.loads(x["messages"]) for x in items], tokenize=True, return_dict=True,
                return_assistant_tokens_mask=True, padding=True, return_tensors="pt")
            out["labels"] = labels_of(out["input_ids"], out["assistant_masks"])
            return out
    loader = torch.utils.data.DataLoader(ds, batch_size=VLM_BATCH, shuffle=True,
                                         num_workers=a.workers, collate_fn=collate)
    samples = tokens = 0
    for batch in loader:
        samples += len(batch["input_ids"])
        tokens += int(batch["attention_mask"].sum())
    return {"wall_s": time.perf_counter() - t0, "samples": samples, "tokens": tokens}
