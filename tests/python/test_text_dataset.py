"""stoker.TextDataset: raw text and conversations tokenized natively, then packed or batched.

The reference is Hugging Face's own: a byte-level BPE trained here with ``tokenizers``, wrapped
in a transformers fast tokenizer whose ``apply_chat_template`` (ids and assistant masks) and
``__call__`` stoker's documents must equal. Every row exactly once an epoch, the same batches
whatever the workers, resume mid-epoch with a document cut across samples, every input format
giving the same documents, bad rows named by file and line."""

import gzip
import json
import os

import numpy as np
import pytest

import stoker

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
pytest.importorskip("pyarrow")
try:
    import stoker._text  # noqa: F401
except ImportError:
    pytest.skip("this build has no text module", allow_module_level=True)

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from tokenizers import Tokenizer as HfTokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402,E501

# ChatML with the assistant's text (and its end of turn) marked for the loss.
CHATML_GENERATION = (
    "{%- if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- if tools %}{{ '<|im_start|>tools\\n' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' and message['content'].startswith('!') %}"
    "{{ raise_exception('a user message may not start with !') }}{%- endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}{% generation %}"
    "{%- if message.tool_calls %}{% for call in message.tool_calls %}"
    "{{ '<tool_call>' + (call.function | tojson) + '</tool_call>' }}{% endfor %}"
    "{%- else %}{{ message['content'] }}{%- endif %}"
    "{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{%- else %}{{ message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
# The same turns, unmarked: assistant spans by the documented prefix rule.
CHATML_PLAIN = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ("the quick brown fox jumps over a lazy dog while déjà vu and naïve cœur meet 中文 "
         "日本語 🙂 and tabs\tand  spaces, numbers 12345 and code x->y a::b").split(" ")


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def hf():
    """A transformers fast tokenizer over a byte-level BPE trained here."""
    tok = HfTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = np.random.default_rng(0)
    text = [sentence(rng, 30) for _ in range(400)]
    tok.train_from_iterator(text, trainer=trainers.BpeTrainer(
        vocab_size=600, show_progress=False, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML_GENERATION
    return fast


@pytest.fixture(scope="module")
def tokenizer(hf):
    return stoker.Tokenizer.from_hf(hf)


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(1)
    return [{"text": sentence(rng, int(rng.integers(1, 60))), "id": i} for i in range(300)]


def conversations(n, seed=2):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        turns = []
        if i % 3 == 0:
            turns.append({"role": "system", "content": sentence(rng, 4)})
        for _ in range(int(rng.integers(1, 4))):
            turns.append({"role": "user", "content": sentence(rng, int(rng.integers(1, 20)))})
            turns.append({"role": "assistant", "content": sentence(rng, int(rng.integers(1, 30)))})
        row = {"messages": turns}
        if i % 5 == 0:
            row["tools"] = [{"type": "function", "function": {
                "name": "lookup", "description": "Finds a word", "parameters": {
                    "type": "object", "properties": {"word": {"type": "string"}}}}}]
            turns.append({"role": "user", "content": "look it up"})
            turns.append({"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "lookup",
                                                  "arguments": {"word": sentence(rng, 1)}}}]})
        out.append(row)
    return out


def documents(ds):
    return [ds.document(d).tolist() for d in range(ds.num_documents)]


def hf_text_ids(hf, text):
    return hf(text)["input_ids"] + [hf.eos_token_id]


def test_text_rows_are_the_tokenizers_ids_with_eos(tmp_path, hf, tokenizer, rows):
    ds = stoker.TextDataset(write_jsonl(tmp_path / "a.jsonl", rows), tokenizer)
    assert documents(ds) == [hf_text_ids(hf, r["text"]) for r in rows]
    assert len(ds) == len(rows)
    assert ds.stats["rows"] == len(rows) and ds.stats["skipped"] == 0
    sample = ds[7]
    ids = hf_text_ids(hf, rows[7]["text"])
    assert sample["input_ids"].tolist() == ids
    assert sample["labels"].tolist() == ids[1:] + [-100]


def test_every_input_format_gives_the_same_documents(tmp_path, tokenizer, rows):
    want = documents(stoker.TextDataset(write_jsonl(tmp_path / "a.jsonl", rows), tokenizer))
    gz = write_jsonl(tmp_path / "a.jsonl.gz", rows, opener=gzip.open)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=70)
    with pa.OSFile(str(tmp_path / "a.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=50)
    for source in (gz, str(tmp_path / "a.parquet"), str(tmp_path / "a.arrow"), table):
        assert documents(stoker.TextDataset(source, tokenizer)) == want, source
    datasets = pytest.importorskip("datasets")
    hf_ds = datasets.Dataset.from_list(rows).shuffle(seed=3).select(range(100))
    order = [r["id"] for r in hf_ds]
    assert documents(stoker.TextDataset(hf_ds, tokenizer)) == [want[i] for i in order]
    # several files, in order, each named by its own lines
    half = write_jsonl(tmp_path / "b.jsonl", rows[:10])
    ds = stoker.TextDataset([half, str(tmp_path / "a.jsonl")], tokenizer)
    assert documents(ds) == want[:10] + want
    assert ds._corpus.path(12) == f"{tmp_path / 'a.jsonl'}:3"


def test_zstd_jsonl(tmp_path, tokenizer, rows):
    zstandard = pytest.importorskip("zstandard")
    plain = write_jsonl(tmp_path / "a.jsonl", rows)
    with open(plain, "rb") as f, open(tmp_path / "a.jsonl.zst", "wb") as out:
        out.write(zstandard.ZstdCompressor().compress(f.read()))
    assert documents(stoker.TextDataset(str(tmp_path / "a.jsonl.zst"), tokenizer)) == \
        documents(stoker.TextDataset(plain, tokenizer))


@pytest.mark.parametrize("template", [CHATML_GENERATION, "plain"])
def test_conversations_equal_apply_chat_template_and_its_assistant_mask(tmp_path, hf, template):
    hf.chat_template = CHATML_GENERATION if template != "plain" else CHATML_PLAIN
    try:
        convs = conversations(60)
        if template == "plain":
            convs = [{"messages": [m for m in c["messages"] if "tool_calls" not in m]}
                     for c in convs]
        ds = stoker.TextDataset(write_jsonl(tmp_path / "chat.jsonl", convs),
                                stoker.Tokenizer.from_hf(hf), messages="messages")
        for d, c in enumerate(convs):
            if template == "plain":
                want_ids, want_mask = prefix_rule(hf, c["messages"])
            else:
                out = hf.apply_chat_template(c["messages"], tools=c.get("tools"), tokenize=True,
                                             return_dict=True, return_assistant_tokens_mask=True)
                want_ids, want_mask = out["input_ids"], out["assistant_masks"]
            assert ds.document(d).tolist() == want_ids, d
            assert ds.trained(d).tolist() == want_mask, d
            assert any(want_mask)
            labels = ds[d]["labels"].tolist()
            # labels are next tokens, kept only where that token is the assistant's
            assert labels == [t if m else -100 for t, m in zip(want_ids[1:], want_mask[1:])] + [-100]
    finally:
        hf.chat_template = CHATML_GENERATION


def prefix_rule(hf, messages):
    """docs/text.md's rule for a template without {% generation %}: assistant message i's span
    is what render(messages[:i], add_generation_prompt=True) lacks of render(messages[:i+1]);
    a token is trained on when its offsets overlap a span."""
    render = lambda msgs, gen: hf.apply_chat_template(msgs, tokenize=False,  # noqa: E731
                                                       add_generation_prompt=gen)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            spans.append((len(render(messages[:i], True)), len(render(messages[:i + 1], False))))
    text = render(messages, False)
    enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(e > a and s < b for a, b in spans)) for s, e in enc["offset_mapping"]]
    # a hand check of the rule: the trained tokens are the assistants' replies and ends of turn
    trained = hf.decode([t for t, k in zip(enc["input_ids"], mask) if k])
    assert trained == "".join(m["content"] + "<|im_end|>\n" for m in messages
                              if m["role"] == "assistant")
    return enc["input_ids"], mask


def test_packed_rows_every_token_once_and_labels_stay_in_their_row(tmp_path, tokenizer, rows):
    ds = stoker.TextDataset(write_jsonl(tmp_path / "a.jsonl", rows), tokenizer, seq_len=64,
                            pack="best_fit", loss_mask=True, max_length=64)  # none split
    assert ds.stats["truncated"] > 0
    docs = documents(ds)
    seen = []
    loader = stoker.DataLoader(ds, batch_size=4, shuffle=True, seed=5, output="numpy")
    for batch in loader:
        for b in range(len(batch["input_ids"])):
            ids, labels, cu = batch["input_ids"][b], batch["labels"][b], batch["cu_seqlens"][b]
            for s, e in zip(cu[:-1], cu[1:]):
                if s == e:
                    continue
                piece = ids[s:e].tolist()
                if batch["loss_mask"][b][s:e].any():  # a row (>= 2 tokens), not the padding
                    seen.append(piece)
                    assert labels[s:e].tolist() == piece[1:] + [-100]
    assert sorted(map(tuple, seen)) == sorted(map(tuple, docs))
    assert ds.padding_fraction < 0.2


@pytest.mark.parametrize("pack", ["concat", "best_fit", None])
def test_batches_do_not_depend_on_workers_and_resume_with_a_row_cut_across_samples(
        tmp_path, tokenizer, pack):
    convs = conversations(120, seed=9)
    ds = stoker.TextDataset(write_jsonl(tmp_path / "c.jsonl", convs), tokenizer,
                            messages="messages", seq_len=48 if pack else None, pack=pack)

    def run(workers, state=None):
        loader = stoker.DataLoader(ds, batch_size=3, shuffle=True, seed=11, num_workers=workers,
                                   output="numpy")
        if state is not None:
            loader.load_state_dict(state)
        return loader

    def flat(batches):
        return [[np.asarray(batch[k]).tobytes() for k in sorted(batch)] for batch in batches]

    whole = flat(run(0))
    assert whole == flat(run(3))
    loader = run(2)
    it = iter(loader)
    first = [next(it) for _ in range(5)]  # concat: a row goes on past each sample's end
    state = json.loads(json.dumps(loader.state_dict()))
    assert flat(first) + flat(run(1, state)) == whole


def test_bad_rows_are_named_by_file_and_line_or_skipped_and_counted(tmp_path, tokenizer):
    good = json.dumps({"messages": [{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "the fox"}]})
    lines = [good] * 9
    lines[2] = '{"messages": [{"role": "user"'                                 # not JSON
    lines[4] = json.dumps({"conversation": []})                                 # no field
    lines[6] = json.dumps({"messages": [{"role": "user", "content": "!no"}]})   # template raises
    path = tmp_path / "bad.jsonl"
    path.write_bytes(("\n".join(lines) + "\n").encode()
                     + b'{"messages": [{"role": "user", "content": "\xff"}]}\n')  # not UTF-8
    with pytest.raises(stoker.SampleError, match=r"bad\.jsonl:3.*not a JSON line") as e:
        stoker.TextDataset(str(path), tokenizer, messages="messages")
    assert e.value.path.endswith("bad.jsonl:3")
    with pytest.warns(UserWarning, match="skipped 4 bad rows of 10"):
        ds = stoker.TextDataset(str(path), tokenizer, messages="messages", on_error="skip")
    assert ds.num_documents == 6
    reasons = "\n".join(ds.stats["skipped_reasons"])
    assert "bad.jsonl:5: no field \"messages\" (fields: conversation)" in reasons
    assert "bad.jsonl:7: a user message may not start with !" in reasons
    assert "bad.jsonl:10" in reasons
    with pytest.raises(stoker.SampleError, match=r"bad\.jsonl:1.*no field \"text\""):
        stoker.TextDataset(str(path), tokenizer)


def test_the_token_store_is_kept_in_cache_dir_and_reopened(tmp_path, tokenizer, rows):
    src = write_jsonl(tmp_path / "a.jsonl", rows)
    cache = tmp_path / "cache"
    a = stoker.TextDataset(src, tokenizer, cache_dir=cache)
    stores = os.listdir(cache)
    assert len(stores) == 1 and stores[0].startswith("text-")
    b = stoker.TextDataset(src, tokenizer, cache_dir=cache)
    assert documents(a) == documents(b)
    stoker.TextDataset(src, tokenizer, cache_dir=cache, max_length=8)  # other options: another
    assert len(os.listdir(cache)) == 2
    write_jsonl(src, rows[:5])  # the file changed: tokenized again
    assert stoker.TextDataset(src, tokenizer, cache_dir=cache).num_documents == 5


def test_a_mixture_with_a_token_dataset_and_a_budget(tmp_path, tokenizer, rows):
    text = stoker.TextDataset(write_jsonl(tmp_path / "a.jsonl", rows), tokenizer, seq_len=32,
                              pack="best_fit", max_segments=32)
    tokens = np.arange(1, 4000, dtype=np.uint16) % 500
    tokens[::37] = 0
    tokens.tofile(tmp_path / "t.bin")
    token_ds = stoker.TokenDataset(str(tmp_path / "t.bin"), seq_len=32, pack="best_fit", eos=0,
                                   max_segments=32)
    mix = stoker.Mixture({"text": text, "tokens": token_ds}, weights={"text": 1, "tokens": 1})
    batches = list(stoker.DataLoader(mix, batch_size=4, output="numpy"))
    assert batches and all(b["input_ids"].shape[1:] == (32,) for b in batches)
    assert sum(len(b["input_ids"]) for b in batches) == len(text) + len(token_ds)
    unpacked = stoker.TextDataset(str(tmp_path / "a.jsonl"), tokenizer)
    loader = stoker.DataLoader(unpacked, batch_size=stoker.Budget(tokens=256), shuffle=True,
                               output="numpy")
    seen = sum(int(b["lengths"].shape[0]) for b in loader)
    assert seen == len(rows)


def test_the_options_are_checked(tmp_path, tokenizer, rows):
    src = write_jsonl(tmp_path / "a.jsonl", rows)
    with pytest.raises(ValueError, match="seq_len"):
        stoker.TextDataset(src, tokenizer, pack="best_fit")
    with pytest.raises(ValueError, match="pack must be"):
        stoker.TextDataset(src, tokenizer, seq_len=8, pack="document")
    with pytest.raises(ValueError, match='loss="assistant" is for conversations'):
        stoker.TextDataset(src, tokenizer, loss="assistant")
    with pytest.raises(ValueError, match="not both"):
        stoker.TextDataset(src, tokenizer, field="text", messages="messages")
    with pytest.raises(ValueError, match="template_kwargs may not set"):
        stoker.TextDataset(src, tokenizer, messages="messages", template_kwargs={"tools": []})
    bare = stoker.Tokenizer.from_hf(tokenizer_without_template())
    with pytest.raises(ValueError, match="need a chat template"):
        stoker.TextDataset(src, bare, messages="messages")
    with pytest.raises(FileNotFoundError):
        stoker.TextDataset(str(tmp_path / "none.jsonl"), tokenizer)


def tokenizer_without_template():
    tok = HfTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["a b c"], trainer=trainers.BpeTrainer(
        vocab_size=280, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def test_sft_through_stoker_trainer_on_a_real_causal_lm(tmp_path, hf):
    """StokerTrainer fine-tunes a (tiny) Llama on packed conversations: the batches reach the
    model as padding-free packs (position_ids restart at each conversation), the loss counts
    the assistant's tokens only, and a few steps lower it."""
    import torch
    from stoker.integrations.transformers import StokerTrainer

    convs = conversations(40, seed=4)
    ds = stoker.TextDataset(write_jsonl(tmp_path / "sft.jsonl", convs),
                            stoker.Tokenizer.from_hf(hf), messages="messages", seq_len=128,
                            pack="best_fit")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(hf), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256))
    seen = []
    forward = model.forward

    def recording(**kwargs):
        seen.append({k: v.clone() if torch.is_tensor(v) else v for k, v in kwargs.items()})
        return forward(**kwargs)
    model.forward = recording
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4,
        learning_rate=3e-3, report_to=[], use_cpu=True, save_strategy="no",
        remove_unused_columns=False, disable_tqdm=True, logging_steps=1)
    trainer = StokerTrainer(model=model, args=args, train_dataset=ds)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 6 and all(np.isfinite(losses)) and losses[-1] < losses[0]
    batch = seen[0]
    assert batch["input_ids"].shape == (4, 128)
    assert (batch["position_ids"][:, 0] == 0).all()
    assert batch["use_cache"] is False and "attention_mask" not in batch  # packs masked apart
    labels = batch["shift_labels"]
    trained = labels != -100
    assert 0 < trained.sum() < labels.numel()  # the prompts are not trained on


def test_reasoning_reaches_the_template_under_transformers_aliases(tmp_path, hf):
    """transformers passes a message's reasoning (reasoning_content, thinking or reasoning) as
    both thinking and reasoning_content: a template reading either renders the same here."""
    template = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
                "{%- if m.thinking is defined %}{{ '<think>' + m.thinking + '|' + "
                "m.reasoning_content + '</think>' }}{%- endif %}"
                "{{ m.content + '<|im_end|>\\n' }}{%- endfor %}")
    convs = [{"messages": [{"role": "user", "content": "why"},
                           {"role": "assistant", "content": "fox", key: "the lazy dog"}]}
             for key in ("reasoning_content", "thinking", "reasoning")]
    convs.append({"messages": [{"role": "user", "content": "plain"}]})
    ds = stoker.TextDataset(write_jsonl(tmp_path / "r.jsonl", convs), stoker.Tokenizer.from_hf(hf),
                            messages="messages", chat_template=template, loss="all")
    for d, c in enumerate(convs):
        assert ds.document(d).tolist() == hf.apply_chat_template(
            c["messages"], chat_template=template, tokenize=True, return_dict=True)["input_ids"]


def test_conversations_from_datasets_whose_messages_vary_in_shape(tmp_path, tokenizer):
    """datasets stores messages of varying keys (tool calls in some) as Arrow's JSON extension
    type: they are read as the JSON they hold, as from JSONL; messages that are not objects are
    a bad row, not an empty rendering."""
    datasets = pytest.importorskip("datasets")
    convs = conversations(30, seed=6)
    want = documents(stoker.TextDataset(write_jsonl(tmp_path / "c.jsonl", convs), tokenizer,
                                        messages="messages"))
    ds = datasets.Dataset.from_list(convs)
    got = stoker.TextDataset(ds, tokenizer, messages="messages")
    assert documents(got) == want
    bad = write_jsonl(tmp_path / "strings.jsonl", [{"messages": ["hi", "there"]}])
    with pytest.raises(stoker.SampleError, match=r"strings\.jsonl:1.*message 0 is a string"):
        stoker.TextDataset(bad, tokenizer, messages="messages")
