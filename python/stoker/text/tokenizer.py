"""``Tokenizer``: the text wing's native tokenizer (stoker._text, loaded on first use)."""

import hashlib
import json
import os


# The special tokens a tokenizer_config.json (or a transformers tokenizer) names, passed to chat
# templates as transformers passes them.
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
            "mask_token")


def _text_module():
    try:
        from .. import _text
    except ImportError as e:
        raise ImportError(
            f"this stoker was built without its text module ({e}): build it where the "
            f"development libraries of PCRE2, utf8proc and simdjson (and zlib, zstd) are found "
            f"by pkg-config (Debian: libpcre2-dev libutf8proc-dev libsimdjson-dev zlib1g-dev "
            f"libzstd-dev; scripts/system-deps.sh)"
        ) from None
    return _text


class Tokenizer:
    """Text to token ids and back, with the ids Hugging Face ``tokenizers`` gives for the same
    ``tokenizer.json``, or the ids the ``sentencepiece`` library gives for the same ``.model``
    (``add_special_tokens=True`` then adds the model's bos and eos ids, each where it has one).
    Immutable once loaded; every method may be called from many threads.

    ``chat_template``, ``bos_token`` and ``eos_token`` come from a ``tokenizer_config.json``
    beside the file (``from_file`` of a directory) or from a transformers tokenizer
    (``from_hf``); None otherwise.
    """

    def __init__(self, native, chat_template=None, bos_token=None, eos_token=None, *,
                 special_tokens=None, digest=None):
        self._native = native
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._special = dict(special_tokens or {})
        self._special.update(bos_token=bos_token, eos_token=eos_token)
        # What the ids depend on (a digest of the files or the serialized tokenizer): the
        # TextDataset store's key.
        self._digest = digest

    def template_tokens(self):
        """The special tokens a chat template sees (``bos_token``, ``eos_token``, ...), as
        text; None where the tokenizer has none."""
        return dict(self._special)

    @classmethod
    def from_file(cls, path, pattern=None, special_tokens=None):
        """A ``tokenizer.json``, a SentencePiece ``.model``, a tiktoken BPE file, or a directory
        holding a ``tokenizer.json`` or else a ``tokenizer.model`` (Llama 2's layout), and perhaps
        its ``tokenizer_config.json``. A ``.model`` the sentencepiece library does not load raises
        ValueError naming it.

        A tiktoken file (``cl100k_base.tiktoken``; lines of ``<base64 token> <rank>``) holds
        neither its split pattern nor its special tokens: ``pattern`` (tiktoken's ``pat_str``)
        and ``special_tokens`` (``{text: id}``) give them, and where not given, a file named after
        a known encoding (cl100k_base, o200k_base, r50k_base, p50k_base, p50k_edit) gets that
        encoding's; a file of another name without a pattern raises ValueError. Ids are
        tiktoken's ``encode(text, allowed_special="all")``: special tokens in the text are
        matched."""
        path = os.fspath(path)
        config = {}
        if os.path.isdir(path):  # the native from_file picks the directory's file
            config_path = os.path.join(path, "tokenizer_config.json")
            if os.path.exists(config_path):
                with open(config_path, encoding="utf-8") as f:
                    config = json.load(f)
        native = _text_module().Tokenizer.from_file(
            path, pattern, None if special_tokens is None else dict(special_tokens))
        chat_template = config.get("chat_template")
        if isinstance(chat_template, list):  # named templates: the default one
            chat_template = next((t.get("template") for t in chat_template
                                  if t.get("name") == "default"), None)
        if chat_template is None and os.path.isdir(path):
            jinja = os.path.join(path, "chat_template.jinja")  # transformers 4.43+'s own file
            if os.path.exists(jinja):
                with open(jinja, encoding="utf-8") as f:
                    chat_template = f.read()
        return cls(native, chat_template, _token_text(config.get("bos_token")),
                   _token_text(config.get("eos_token")),
                   special_tokens={k: _token_text(config.get(k)) for k in _SPECIAL},
                   digest=_digest([_file_digest(path).encode(), repr(pattern).encode(),
                                   json.dumps(special_tokens, sort_keys=True).encode()]))

    @classmethod
    def from_hf(cls, obj):
        """A ``tokenizers.Tokenizer``, or a transformers fast tokenizer (its backend tokenizer,
        chat template and bos/eos tokens)."""
        origin = f"{type(obj).__module__}.{type(obj).__name__} (from_hf)"  # errors name it
        backend = getattr(obj, "backend_tokenizer", None)
        if backend is not None:
            text = backend.to_str()
            native = _text_module().Tokenizer.from_json(text, origin)
            special = {k: _token_text(getattr(obj, k, None)) for k in _SPECIAL}
            template = getattr(obj, "chat_template", None)
            return cls(native, template, special["bos_token"], special["eos_token"],
                       special_tokens=special,
                       digest=_digest([text.encode(), (template or "").encode(),
                                       json.dumps(special, sort_keys=True).encode()]))
        if hasattr(obj, "to_str"):
            text = obj.to_str()
            return cls(_text_module().Tokenizer.from_json(text, origin),
                       digest=_digest([text.encode()]))
        raise TypeError(f"from_hf takes a tokenizers.Tokenizer or a transformers fast tokenizer, "
                        f"not {type(obj).__name__}")

    def encode(self, text, add_special_tokens=False):
        """The ids of ``text`` (a list of ints)."""
        return self._native.encode(text, bool(add_special_tokens))

    def encode_batch(self, texts, add_special_tokens=False):
        """``encode`` of each text, on min(len(texts), usable cores) threads."""
        return self._native.encode_batch(list(texts), bool(add_special_tokens))

    def encode_with_offsets(self, text, add_special_tokens=False):
        """``(ids, offsets)``: the ids of ``text`` and, per id, the ``(start, end)`` characters of
        ``text`` it stands for, as ``tokenizers``' ``Encoding.offsets`` gives them (a
        post-processor's special tokens ``(0, 0)``); so that ``Encoding.char_to_token`` (what
        transformers' assistant masks use) can be computed from them. For a ``.model``, the
        sentencepiece library's pieces' begin and end."""
        ids, offsets = self._native.encode_with_offsets(text, bool(add_special_tokens))
        return ids, offsets

    def encode_batch_with_offsets(self, texts, add_special_tokens=False):
        """``encode_with_offsets`` of each text (a list of ``(ids, offsets)``), on
        min(len(texts), usable cores) threads."""
        return self._native.encode_batch_with_offsets(list(texts), bool(add_special_tokens))

    def decode(self, ids, skip_special_tokens=False):
        return self._native.decode([int(i) for i in ids], bool(skip_special_tokens))

    @property
    def vocab_size(self):
        """Distinct tokens, the model's and the added ones (``get_vocab_size()``)."""
        return self._native.vocab_size

    def token_to_id(self, token):
        """The id of ``token``, or None."""
        return self._native.token_to_id(token)

    def id_to_token(self, id):
        """The token of ``id``, or None."""
        return self._native.id_to_token(int(id))

    def __repr__(self):
        return f"stoker.Tokenizer(vocab_size={self.vocab_size})"


def _token_text(token):
    """A bos/eos token as its text: tokenizer_config.json may hold it as an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content")
    return None if token is None else str(token)


def _digest(parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def _file_digest(path):
    """A digest of the tokenizer's files: the file, or a directory's tokenizer files."""
    if not os.path.isdir(path):
        files = [path]
    else:
        files = [os.path.join(path, n) for n in sorted(os.listdir(path))
                 if n in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                          "chat_template.jinja", "special_tokens_map.json")]
    parts = []
    for f in files:
        with open(f, "rb") as fh:
            parts += [os.path.basename(f).encode(), fh.read()]
    return _digest(parts)
