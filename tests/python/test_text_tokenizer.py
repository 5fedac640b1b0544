"""stoker.Tokenizer against Hugging Face ``tokenizers``: tokenizers of each supported family are
trained here (small vocabularies, the trainers of ``tokenizers`` itself, on Python's standard
library and a multilingual text), and stoker's ids and decoded text must equal theirs. SentencePiece
``.model`` files, trained here with the ``sentencepiece`` package, against that package."""

import base64
import io
import json
import os
import random
import re

import pytest
from conftest import ASAN_LANE

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import (AddedToken, Regex, Tokenizer as HfTokenizer, decoders,  # noqa: E402
                        models, normalizers, pre_tokenizers, processors, trainers)

import stoker  # noqa: E402

try:
    import stoker._text  # noqa: F401
except ImportError:
    pytest.skip("this build has no text module", allow_module_level=True)

MULTILINGUAL = (
    "The quick brown fox jumps over the lazy dog. It's 2026; we'll see what they've done!\n"
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # recursive\n"
    "\tindented\twith\ttabs   and     long      runs        of spaces          end\n"
    "Numbers: 3.14159 1234567890 42nd 1,000,000 0x1F ½ ² ٣٤٥\n"
    "Français: déjà vu, garçon, cœur, naïve, Ångström, Ærø, İstanbul, ẞtraße STRASSE\n"
    "中文：我们今天去公园散步，天气很好。日本語：東京は大きい都市です。한국어: 안녕하세요 세계\n"
    "Emoji 🙂👍🏽 👨‍👩‍👧‍👦 🇫🇷 and symbols ∑∫√∞ ≠ ≤ → ← “quotes” ‘single’ — dash… ellipsis\n"
    "Ελληνικά: Καλημέρα κόσμε. Русский: Привет, мир! עברית: שלום עולם. العربية: مرحبا بالعالم\n"
    "हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก. Tiếng Việt: Xin chào thế giới\n"
    "   leading spaces, trailing spaces   \n\n\n   \n"
    "URLs https://example.com/a?b=c&d=e#f and emails a.b@example.org; C++ i++ x->y a::b\n"
    "Contractions: I'M YOU'RE he'S they'LL don't can't won't shouldn't\n"
    "<|endoftext|> special <|im_start|>user\nhello<|im_end|> tokens <tool>  spaced  </tool>"
)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                  r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

STDLIB_FILES = ["argparse.py", "textwrap.py", "string.py", "difflib.py", "csv.py", "locale.py",
                "json/decoder.py", "email/message.py", "calendar.py", "unicodedata.py",
                "html/entities.py", "codecs.py"]


@pytest.fixture(scope="module")
def corpus():
    """Lines of Python's standard library (sources and docstrings), a fixed multilingual text."""
    stdlib = os.path.dirname(os.__file__)
    lines = []
    for name in STDLIB_FILES:
        path = os.path.join(stdlib, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                lines.extend(f.read().splitlines())
    return lines[:12000] + MULTILINGUAL.splitlines() * 20


@pytest.fixture(scope="module")
def texts(corpus):
    """What is compared: single lines, multi-line chunks (newlines, indentation), the
    multilingual text whole and line by line, and edge cases."""
    lines = [line for line in corpus[:6000:8]]
    chunks = ["\n".join(corpus[i:i + 12]) for i in range(0, 6000, 240)]
    return (lines + chunks + MULTILINGUAL.splitlines() + [MULTILINGUAL]
            + ["", " ", "  ", "\n", "a", " a", "hello  world", "<|endoftext|>",
               "x<|endoftext|>y", "<|im_start|><|im_end|>", "<tool>", "a <tool> b", "\u00a0x",
               "\U0001F600" * 5, "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", "ä" * 3,
               # single_word's \w (Rust's): a mark, a joiner, a circled letter are word
               # characters, a superscript digit is none.
               "a\u0301</tool>", "x\u200d</tool>", "\u24b6</tool>", "\u00b2</tool>"])


def _train(tok, trainer, corpus):
    # The ASan lane trains on every fourth line: `tokenizers`' trainer (Rust) allocates through
    # ASan's malloc there, which made this file 186 s of that lane's 13 minutes. The vocabularies
    # differ from the release lane's; every comparison with HF is the same.
    tok.train_from_iterator(corpus[::4] if ASAN_LANE else corpus, trainer=trainer)
    return tok


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _add_tokens(tok):
    tok.add_special_tokens(SPECIALS)
    tok.add_tokens([AddedToken("<tool>", lstrip=True, rstrip=True),
                    AddedToken("</tool>", single_word=True, normalized=False)])
    return tok


@pytest.fixture(scope="module")
def gpt2(corpus):
    tok = HfTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    _train(tok, trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()), corpus)
    return _add_tokens(tok)


@pytest.fixture(scope="module")
def llama3(corpus):
    tok = HfTokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    _train(tok, trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                    special_tokens=["<|begin_of_text|>"],
                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()), corpus)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return _add_tokens(tok)


def _sentencepiece_bpe(corpus, scheme):
    """Llama 2 (normalizer Prepend + Replace, no pre-tokenizer) or Mistral-style (Metaspace,
    prepend_scheme first): trained on words, then given byte fallback as Llama's file has it."""
    tok = HfTokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    _train(tok, trainers.BpeTrainer(vocab_size=2500, show_progress=False, limit_alphabet=120,
                                    special_tokens=["<unk>", "<s>", "</s>"]), corpus)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    if scheme == "llama2":
        spec["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        spec["pre_tokenizer"] = None
    else:
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                                 "prepend_scheme": "first", "split": False}
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}}}
    return _add_tokens(HfTokenizer.from_str(json.dumps(spec)))


@pytest.fixture(scope="module")
def llama2(corpus):
    return _sentencepiece_bpe(corpus, "llama2")


@pytest.fixture(scope="module")
def mistral(corpus):
    return _sentencepiece_bpe(corpus, "first")


@pytest.fixture(scope="module")
def bert(corpus):
    tok = HfTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    _train(tok, trainers.WordPieceTrainer(vocab_size=3000, show_progress=False,
                                          special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]),
           corpus)
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return _add_tokens(tok)


@pytest.fixture(scope="module")
def wordpiece_misc(corpus):
    """The other normalizers and pre-tokenizers: NFD, StripAccents, Lowercase, Strip; Whitespace,
    Punctuation, Digits."""
    tok = HfTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(),
                                           normalizers.Lowercase(), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(),
        pre_tokenizers.Digits(individual_digits=True)])
    tok.decoder = decoders.WordPiece()
    _train(tok, trainers.WordPieceTrainer(vocab_size=2000, show_progress=False,
                                          special_tokens=["[UNK]"]), corpus)
    return tok


@pytest.fixture(scope="module")
def unigram(corpus):
    tok = HfTokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    _train(tok, trainers.UnigramTrainer(vocab_size=2000, show_progress=False,
                                        special_tokens=["<unk>"], unk_token="<unk>"),
           corpus[:3000] + MULTILINGUAL.splitlines() * 5)
    return _add_tokens(tok)


QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="module")
def roberta(gpt2):
    """GPT-2's model with RoBERTa's prefix space and post-processor."""
    spec = json.loads(gpt2.to_str())
    spec["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                             "use_regex": True}
    spec["post_processor"] = {"type": "RobertaProcessing", "trim_offsets": True,
                              "add_prefix_space": True,
                              "sep": ["<|im_end|>", gpt2.token_to_id("<|im_end|>")],
                              "cls": ["<|im_start|>", gpt2.token_to_id("<|im_start|>")]}
    return HfTokenizer.from_str(json.dumps(spec))


@pytest.fixture(scope="module")
def qwen(gpt2):
    """GPT-2's model behind Qwen 2's pipeline: NFC, Qwen's regex, then bytes."""
    spec = json.loads(gpt2.to_str())
    spec["normalizer"] = {"type": "NFC"}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]}
    return HfTokenizer.from_str(json.dumps(spec))


FAMILIES = ["gpt2", "roberta", "qwen", "llama3", "llama2", "mistral", "bert", "wordpiece_misc",
            "unigram"]
WITH_POST_PROCESSOR = {"roberta", "llama3", "llama2", "mistral", "bert"}


@pytest.mark.parametrize("family", FAMILIES)
def test_ids_and_decode_equal_hugging_face(family, texts, request):
    hf = request.getfixturevalue(family)
    ours = stoker.Tokenizer.from_hf(hf)
    for special in [False, True] if family in WITH_POST_PROCESSOR else [False]:
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=special)]
        got = ours.encode_batch(texts, add_special_tokens=special)
        for text, w, g in zip(texts, want, got):
            assert g == w, f"{family}, add_special_tokens={special}: {text!r}"
        assert ours.encode(texts[-4], special) == want[-4]
    for ids in want:
        for skip in (False, True):
            assert ours.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip), (family, ids)
    assert ours.vocab_size == hf.get_vocab_size()
    for token in SPECIALS + ["the", "[UNK]", "nonexistent-token"]:
        assert ours.token_to_id(token) == hf.token_to_id(token)
    for i in (0, 5, hf.get_vocab_size() - 1, hf.get_vocab_size() + 10,
              *want[texts.index(MULTILINGUAL)]):
        assert ours.id_to_token(i) == hf.id_to_token(i)


# Random strings over scripts, marks, whitespace and controls, symbols, CJK, emoji. Characters
# assigned since Unicode 9 are left out: the libraries' Unicode tables differ there (tokenizers'
# Rust crates, PCRE2 10.42 and utf8proc each have their own version; a full scan of the code
# points finds them only in the Unicode-sensitive BERT normalizer, \w and marks, NFKC).
RANDOM_POOLS = [range(0x20, 0x7F), range(0xA0, 0x250), range(0x300, 0x370), range(0x370, 0x400),
                range(0x400, 0x500), range(0x590, 0x61D), range(0x900, 0x980), range(0xE00, 0xE5C),
                range(0x1100, 0x1200), range(0x2000, 0x2065), range(0x2100, 0x2190),
                range(0x3000, 0x3100), range(0x4E00, 0x4F00), range(0xAC00, 0xAD00),
                range(0xFF00, 0xFFEF), range(0x1F300, 0x1F5FF), range(0x20000, 0x20100),
                [0x9, 0xA, 0xB, 0xC, 0xD, 0x85, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000,
                 0x200B, 0x200C, 0x200D, 0xFEFF, 0x0, 0x7F, 0xAD, 0xE000, 0xFFFD, 0x130, 0x3A3,
                 0xDF, 0x1E9E]]


@pytest.mark.parametrize("family", FAMILIES)
def test_random_unicode_equals_hugging_face(family, request):
    rng = random.Random(20261129)
    texts = ["".join(chr(rng.choice(rng.choice(RANDOM_POOLS))) for _ in range(rng.randint(1, 40)))
             for _ in range(400)]
    hf = request.getfixturevalue(family)
    want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    ours = stoker.Tokenizer.from_hf(hf)
    assert ours.encode_batch(texts) == want
    assert [ours.decode(ids) for ids in want] == [hf.decode(ids, skip_special_tokens=False)
                                                  for ids in want]


def test_from_file_of_a_json_and_of_a_directory(gpt2, tmp_path, texts):
    gpt2.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "bos_token": {"content": "<|endoftext|>", "lstrip": False},
        "eos_token": "<|im_end|>"}))
    want = [e.ids for e in gpt2.encode_batch(texts[:50], add_special_tokens=False)]
    by_file = stoker.Tokenizer.from_file(tmp_path / "tokenizer.json")
    assert by_file.encode_batch(texts[:50]) == want
    assert by_file.chat_template is None
    by_dir = stoker.Tokenizer.from_file(tmp_path)
    assert by_dir.encode_batch(texts[:50]) == want
    assert by_dir.chat_template.startswith("{% for m in messages %}")
    assert (by_dir.bos_token, by_dir.eos_token) == ("<|endoftext|>", "<|im_end|>")


def test_from_hf_of_a_transformers_tokenizer(llama3, texts):
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=llama3,
                                                bos_token="<|begin_of_text|>",
                                                eos_token="<|endoftext|>")
    fast.chat_template = "{{ messages }}"
    ours = stoker.Tokenizer.from_hf(fast)
    assert (ours.chat_template, ours.bos_token, ours.eos_token) == (
        "{{ messages }}", "<|begin_of_text|>", "<|endoftext|>")
    for text in texts[:100]:
        assert ours.encode(text, add_special_tokens=True) == fast(text)["input_ids"]


def test_an_unsupported_component_is_named_when_loaded(gpt2):
    spec = json.loads(gpt2.to_str())
    spec["pre_tokenizer"] = {"type": "UnicodeScripts"}
    with pytest.raises(ValueError, match=r"^tokenizers\.Tokenizer \(from_hf\): pre-tokenizer "
                                         r"UnicodeScripts is not supported"):
        stoker.Tokenizer.from_hf(HfTokenizer.from_str(json.dumps(spec)))
    spec = json.loads(gpt2.to_str())
    spec["model"]["dropout"] = 0.2
    with pytest.raises(ValueError, match="dropout"):
        stoker.Tokenizer.from_hf(HfTokenizer.from_str(json.dumps(spec)))


def test_bad_input_raises(gpt2):
    ours = stoker.Tokenizer.from_hf(gpt2)
    with pytest.raises(TypeError):
        ours.encode(b"bytes")
    with pytest.raises(TypeError):
        stoker.Tokenizer.from_hf(object())


def test_a_build_without_the_text_module_says_what_it_needs(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "stoker._text", None)  # as if the build had none
    monkeypatch.delattr(stoker, "_text", raising=False)
    with pytest.raises(ImportError, match="without its text module.*PCRE2, utf8proc and simdjson"):
        stoker.Tokenizer.from_file("tokenizer.json")


def test_import_stoker_does_not_load_the_text_module():
    import subprocess
    import sys
    code = "import sys, stoker; stoker.Tokenizer; print('stoker._text' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_from_file_reads_numbers_as_hugging_face_reads_a_file(unigram, tmp_path, texts):
    # tokenizers reads a file's floats with serde_json's default parse, not correctly rounded: a
    # Unigram score can be an ulp off the file's digits, and on a tie (the same pieces in
    # another order: runs of dashes, tabs) the best path then differs. from_file reads them so;
    # from_hf takes the values in memory.
    path = tmp_path / "unigram.json"
    unigram.save(str(path))
    theirs = tokenizers.Tokenizer.from_file(str(path))
    ours = stoker.Tokenizer.from_file(path)
    runs = [c * n for c in ("-", "\t", "=", "#", " ", "*") for n in range(1, 160)]
    lines = runs + [f"    # -- {t} " + "-" * n for n, t in enumerate(texts[:80])]
    want = [e.ids for e in theirs.encode_batch(lines, add_special_tokens=False)]
    assert ours.encode_batch(lines) == want
    assert stoker.Tokenizer.from_hf(theirs).encode_batch(lines) == want


# SentencePiece .model files go through the sentencepiece library itself: models trained here
# with the sentencepiece package (BPE with byte fallback, as Llama 2's; Unigram, as T5's) must
# give the ids and text of that package's SentencePieceProcessor. The package (0.2.x here) is
# another version than the C++ library stoker links (Debian's libsentencepiece, 0.1.97), and
# where two Unigram segmentations tie (the same pieces in another order, the same score: one text
# of these, a run of '='), the two versions' Viterbi keeps a different one.
@pytest.fixture(scope="module", params=["bpe", "unigram"])
def sentencepiece_model(request, corpus, tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    if not stoker._text.SENTENCEPIECE:
        pytest.skip("this build's text module has no sentencepiece")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model,
                                   vocab_size=1000, model_type=request.param,
                                   byte_fallback=request.param == "bpe")
    path = tmp_path_factory.mktemp("sentencepiece") / f"{request.param}.model"
    path.write_bytes(model.getvalue())
    return path, spm.SentencePieceProcessor(model_file=str(path))


def test_sentencepiece_model_ids_equal_the_library(sentencepiece_model, texts):
    path, sp = sentencepiece_model
    ours = stoker.Tokenizer.from_file(path)
    rng = random.Random(20261129)
    texts = texts + ["".join(chr(rng.choice(rng.choice(RANDOM_POOLS)))
                             for _ in range(rng.randint(1, 40))) for _ in range(400)]
    want = sp.encode(texts)
    got = ours.encode_batch(texts)
    ties = []
    for text, w, g in zip(texts, want, got):
        if g != w:
            score = [sum(sp.get_score(i) for i in ids) for ids in (w, g)]
            assert sorted(g) == sorted(w), text
            assert score[0] == pytest.approx(score[1], abs=1e-4), text
            ties.append(text)
    # BPE has no ties to break; a Unigram only a few.
    assert len(ties) <= (0 if path.stem == "bpe" else 5), ties
    assert ours.encode(MULTILINGUAL) == sp.encode(MULTILINGUAL)
    assert sp.bos_id() >= 0 and sp.eos_id() >= 0  # the trainer's defaults: both framed
    assert ours.encode_batch(texts, add_special_tokens=True) == [
        [sp.bos_id()] + g + [sp.eos_id()] for g in got]
    assert ours.encode(texts[0], True) == sp.encode(texts[0], add_bos=True, add_eos=True)
    for ids in want:
        assert ours.decode(ids) == sp.decode(ids), ids
        assert ours.decode([sp.bos_id()] + ids + [sp.eos_id()]) == sp.decode(ids)
    assert ours.decode([sp.unk_id()], skip_special_tokens=True) == ""
    assert ours.vocab_size == sp.get_piece_size()
    for i in range(sp.get_piece_size()):
        assert ours.id_to_token(i) == sp.id_to_piece(i)
        assert ours.token_to_id(sp.id_to_piece(i)) == i
    assert ours.token_to_id("nonexistent-token") is None  # the library says unk_id
    assert ours.id_to_token(sp.get_piece_size()) is None


def test_from_file_of_a_directory_with_a_tokenizer_model(sentencepiece_model, tmp_path, texts):
    path, sp = sentencepiece_model
    (tmp_path / "tokenizer.model").write_bytes(path.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>",
                                                                "eos_token": "</s>"}))
    by_dir = stoker.Tokenizer.from_file(tmp_path)  # as a Llama 2 checkpoint ships it
    assert by_dir.encode_batch(texts[:50]) == sp.encode(texts[:50])
    assert (by_dir.bos_token, by_dir.eos_token) == ("<s>", "</s>")


def test_a_file_that_is_not_a_model_is_named(tmp_path):
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"this is not a SentencePiece model\n")
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        stoker.Tokenizer.from_file(bad, pattern=r"\w+")
    with pytest.raises(OSError):
        stoker.Tokenizer.from_file(tmp_path / "missing")


# Offsets: encode_with_offsets gives tokenizers' Encoding.offsets (characters of the str), which
# transformers' assistant masks read through Encoding.char_to_token.
def _random_texts(seed, count):
    rng = random.Random(seed)
    return ["".join(chr(rng.choice(rng.choice(RANDOM_POOLS))) for _ in range(rng.randint(1, 40)))
            for _ in range(count)]


@pytest.mark.parametrize("family", FAMILIES)
def test_offsets_equal_hugging_face(family, texts, request):
    hf = request.getfixturevalue(family)
    ours = stoker.Tokenizer.from_hf(hf)
    cases = texts + _random_texts(20261130, 400) + [" " + MULTILINGUAL + "  ", "İstanbul ÅÅ ﬁ ①"]
    for special in [False, True] if family in WITH_POST_PROCESSOR else [False]:
        want = hf.encode_batch(cases, add_special_tokens=special)
        got = ours.encode_batch_with_offsets(cases, add_special_tokens=special)
        for text, w, (ids, offsets) in zip(cases, want, got):
            assert ids == w.ids, f"{family}, add_special_tokens={special}: {text!r}"
            assert offsets == w.offsets, f"{family}, add_special_tokens={special}: {text!r}"
        assert ours.encode_with_offsets(cases[-1], special) == (want[-1].ids, want[-1].offsets)


def _byte_level(**options):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True,
            **options}


# Pipelines the families above leave out, on GPT-2's model (any text has ids) or Mistral's:
# ByteLevel's trim_offsets with and without the prefix space, the normalizers that move text
# (NFKD, StripAccents, a regex Replace, Strip, an expanding Replace after Prepend, NFD,
# BertNormalizer), the split behaviours, Metaspace's other schemes.
OFFSET_PIPELINES = {
    "trim_offsets": ("gpt2", {"post_processor": _byte_level()}),
    "prefix_space_trim_offsets": ("gpt2", {"pre_tokenizer": _byte_level(add_prefix_space=True),
                                           "post_processor": _byte_level(add_prefix_space=True)}),
    "nfkd_strip_accents_replace_lowercase_strip": ("gpt2", {"normalizer": {
        "type": "Sequence", "normalizers": [
            {"type": "NFKD"}, {"type": "StripAccents"},
            {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
            {"type": "Lowercase"}, {"type": "Strip", "strip_left": True, "strip_right": True}]}}),
    "nfkc_split_behaviours": ("gpt2", {"normalizer": {"type": "NFKC"}, "pre_tokenizer": {
        "type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\d"}, "behavior": "MergedWithPrevious",
             "invert": False},
            {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext",
             "invert": False},
            {"type": "Punctuation", "behavior": "Contiguous"}, _byte_level(use_regex=False)]}}),
    "prepend_expanding_replace_nfd": ("gpt2", {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581\u2581"},
        {"type": "NFD"}]}}),
    "bert_normalizer_bytes": ("gpt2", {
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": True, "lowercase": True},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Whitespace"}, {"type": "Digits", "individual_digits": False},
            _byte_level(use_regex=False)]}}),
    "metaspace_never": ("mistral", {"pre_tokenizer": {
        "type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True}}),
    "metaspace_always_unsplit_nfkc": ("mistral", {"normalizer": {"type": "NFKC"}, "pre_tokenizer": {
        "type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": False}}),
}


@pytest.mark.parametrize("pipeline", OFFSET_PIPELINES)
def test_offsets_of_other_pipelines_equal_hugging_face(pipeline, texts, request):
    family, changes = OFFSET_PIPELINES[pipeline]
    spec = json.loads(request.getfixturevalue(family).to_str())
    spec.update(changes)
    hf = HfTokenizer.from_str(json.dumps(spec))
    ours = stoker.Tokenizer.from_hf(hf)
    cases = texts + _random_texts(20261134, 300)
    for special in (False, True):
        want = hf.encode_batch(cases, add_special_tokens=special)
        got = ours.encode_batch_with_offsets(cases, add_special_tokens=special)
        for text, w, (ids, offsets) in zip(cases, want, got):
            assert (ids, offsets) == (w.ids, w.offsets), f"{pipeline}, {special}: {text!r}"


def _char_to_token(offsets, position):
    """Encoding.char_to_token from offsets alone: the first token whose range holds the
    character."""
    return next((i for i, (start, end) in enumerate(offsets) if start <= position < end), None)


@pytest.mark.parametrize("family", FAMILIES)
def test_char_to_token_from_offsets_equals_hugging_face(family, texts, request):
    hf = request.getfixturevalue(family)
    ours = stoker.Tokenizer.from_hf(hf)
    special = family in WITH_POST_PROCESSOR
    for text in texts[-40:] + _random_texts(20261131, 50):
        want = hf.encode(text, add_special_tokens=special)
        _, offsets = ours.encode_with_offsets(text, add_special_tokens=special)
        for position in range(len(text)):
            assert _char_to_token(offsets, position) == want.char_to_token(position), (
                family, text, position)


def test_sentencepiece_model_offsets_equal_the_library(sentencepiece_model, texts):
    path, sp = sentencepiece_model
    ours = stoker.Tokenizer.from_file(path)
    for text in texts + _random_texts(20261132, 200):
        proto = sp.encode(text, out_type="proto")  # (immutable_proto, as 0.2.0 called it)
        ids, offsets = ours.encode_with_offsets(text)
        if ids != [p.id for p in proto.pieces]:
            continue  # a Unigram tie the two library versions break differently (see above)
        # The library's offsets are bytes of the UTF-8 text; ours characters of the str.
        char_of = [i for i, c in enumerate(text) for _ in c.encode("utf-8")] + [len(text)]
        assert offsets == [(char_of[p.begin], char_of[p.end]) for p in proto.pieces], text
    ids, offsets = ours.encode_with_offsets("ab", add_special_tokens=True)
    assert (ids[0], ids[-1], offsets[0], offsets[-1]) == (sp.bos_id(), sp.eos_id(), (0, 0), (0, 0))


# tiktoken BPE files: none can be downloaded here, so the GPT-2 style fixture's vocabulary is
# written as one (token bytes, rank = id), and tiktoken's own Encoding over the same ranks, with the
# patterns and special tokens its openai_public defines, is what the ids must equal.
TIKTOKEN_NAMES = ["cl100k_base", "o200k_base", "r50k_base", "p50k_base", "p50k_edit"]


def _gpt2_byte_of_char():
    """GPT-2's printable character of each byte, reversed (bytes_to_unicode)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


@pytest.fixture(scope="module")
def tiktoken_ranks(gpt2):
    byte_of = _gpt2_byte_of_char()
    vocab = gpt2.get_vocab(with_added_tokens=False)
    return {bytes(byte_of[c] for c in token): rank for token, rank in vocab.items()}


def _write_tiktoken(path, ranks):
    lines = [f"{base64.b64encode(token).decode()} {rank}\n"
             for token, rank in sorted(ranks.items(), key=lambda item: item[1])]
    path.write_text("".join(lines))
    return path


def _tiktoken_spec(name, ranks, monkeypatch):
    """tiktoken's own definition of the encoding `name`, over `ranks` instead of its download."""
    pytest.importorskip("tiktoken")
    from tiktoken_ext import openai_public
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *args, **kwargs: ranks)
    return openai_public.ENCODING_CONSTRUCTORS[name]()


@pytest.mark.parametrize("name", TIKTOKEN_NAMES)
def test_tiktoken_file_ids_equal_tiktoken(name, tiktoken_ranks, texts, tmp_path, monkeypatch):
    tiktoken = pytest.importorskip("tiktoken")
    spec = _tiktoken_spec(name, tiktoken_ranks, monkeypatch)
    theirs = tiktoken.Encoding(name, pat_str=spec["pat_str"], mergeable_ranks=tiktoken_ranks,
                               special_tokens=spec["special_tokens"])
    ours = stoker.Tokenizer.from_file(_write_tiktoken(tmp_path / f"{name}.tiktoken",
                                                      tiktoken_ranks))
    specials = "".join(spec["special_tokens"])
    cases = texts + _random_texts(20261133, 300) + [specials, f"a{specials}b {specials} c",
                                                    "<|endoftext", "x<|endoftext|>\n\n"]
    want = [theirs.encode(text, allowed_special="all") for text in cases]
    got = ours.encode_batch(cases)
    for text, w, g in zip(cases, want, got):
        assert g == w, f"{name}: {text!r}"
    assert ours.encode(cases[0], add_special_tokens=True) == want[0]  # tiktoken adds none
    for ids in want:
        assert ours.decode(ids) == theirs.decode(ids), ids
    assert ours.decode(want[-4], skip_special_tokens=True) == ""
    ids, offsets = ours.encode_with_offsets(MULTILINGUAL)
    assert ids == theirs.encode(MULTILINGUAL, allowed_special="all") and len(offsets) == len(ids)
    for token, rank in list(tiktoken_ranks.items())[:300]:
        assert ours.id_to_token(rank) is not None
    for special, id in spec["special_tokens"].items():
        assert ours.token_to_id(special) == id and ours.id_to_token(id) == special


def test_tiktoken_file_of_any_name_with_its_pattern(tiktoken_ranks, texts, tmp_path, monkeypatch):
    tiktoken = pytest.importorskip("tiktoken")
    pattern = _tiktoken_spec("cl100k_base", tiktoken_ranks, monkeypatch)["pat_str"]
    path = _write_tiktoken(tmp_path / "my-encoding.bpe", tiktoken_ranks)
    with pytest.raises(ValueError, match=r"my-encoding\.bpe: a tiktoken file holds no split "
                                         r"pattern.*cl100k_base.*give its pattern"):
        stoker.Tokenizer.from_file(path)
    # No special tokens: tiktoken's encode_ordinary (special tokens' text is ordinary text).
    theirs = tiktoken.Encoding("mine", pat_str=pattern, mergeable_ranks=tiktoken_ranks,
                               special_tokens={})
    ours = stoker.Tokenizer.from_file(path, pattern=pattern)
    assert ours.encode_batch(texts) == [theirs.encode_ordinary(text) for text in texts]
    specials = {"<|mine|>": len(tiktoken_ranks) + 5, "<tool>": len(tiktoken_ranks)}
    theirs = tiktoken.Encoding("mine", pat_str=pattern, mergeable_ranks=tiktoken_ranks,
                               special_tokens=specials)
    ours = stoker.Tokenizer.from_file(path, pattern=pattern, special_tokens=specials)
    cases = texts + ["a<|mine|>b<tool><|mine|>"]
    assert ours.encode_batch(cases) == [theirs.encode(t, allowed_special="all") for t in cases]
    assert ours.vocab_size == len(tiktoken_ranks) + 2
    # The known encoding's special tokens give way to those given.
    named = _write_tiktoken(tmp_path / "cl100k_base", tiktoken_ranks)
    assert stoker.Tokenizer.from_file(named, special_tokens={}).encode("<|endoftext|>") == \
        theirs.encode_ordinary("<|endoftext|>")


def test_tiktoken_options_are_refused_for_other_files(gpt2, tmp_path):
    gpt2.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="are for tiktoken files"):
        stoker.Tokenizer.from_file(tmp_path / "tokenizer.json", pattern=r"\w+")
    bad = tmp_path / "broken.tiktoken"
    bad.write_text("IQ== 0\nnot base64!! x\n")
    with pytest.raises(ValueError, match=r"broken\.tiktoken: line 2 of a tiktoken file"):
        stoker.Tokenizer.from_file(bad, pattern=r"\w+")
