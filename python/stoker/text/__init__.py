"""The text modality: ``Tokenizer`` (tokenizer.py: Hugging Face ``tokenizer.json`` files run
natively, SentencePiece ``.model`` files through the sentencepiece library itself, tiktoken files)
and ``TextDataset`` (dataset.py: raw text and conversations, chat templates rendered natively,
tokenized into a store and packed).

The tokenizer is the C++ text wing (include/stoker/text/tokenizer.h says what it supports); its
extension, ``stoker._text``, is imported on first use, so that ``import stoker`` never needs it.
A file naming a component the wing does not implement is refused when loaded (ValueError naming
it): never ids that differ from ``tokenizers``.
"""

from .tokenizer import Tokenizer

__all__ = ["TextDataset", "Tokenizer"]


def __getattr__(name):
    if name == "TextDataset":  # its module imports the sources; loaded on first use
        from .dataset import TextDataset
        return TextDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
