"""The word-level tokenizer shared by every zoo model.

Every integer 0..``MAX_NUMBER`` is one token, so an answer is always a single next token. The
pre-tokenizer splits on whitespace (which is dropped), separates digit runs from letters and isolates
each punctuation character (``+ - = ; ( ) # ? : , .``). Template words are whole tokens. Anything else
maps to ``<unk>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import transformers

MAX_NUMBER = 520
"""Largest integer that is a single token (the GPT-2 / GPT-J single-token range of the paper)."""

BOS, PAD, UNK = "<bos>", "<pad>", "<unk>"
SPECIALS = [BOS, PAD, UNK]
OPERATORS = ["+", "-", "="]
PUNCTUATION = ["?", ":", ",", ".", ";", "(", ")", "#"]
WORDS = [
    "The", "sum", "of", "and", "is", "difference", "What", "Answer", "If", "you", "add", "to", "will",
    "get", "subtract", "from", "John", "has", "cookies", "Jane", "Together", "they", "have", "He",
    "gave", "now", "a", "b", "print", "should",
    "the",  # appended later (Question template): ids of the words above are unchanged
]


def vocabulary(max_number: int = MAX_NUMBER, words: list[str] | None = None) -> dict[str, int]:
    """Token -> id. Specials first (``<bos>`` = 0, ``<pad>`` = 1, ``<unk>`` = 2), then the integers
    0..``max_number`` in order, then operators, punctuation and template words."""
    toks = SPECIALS + [str(i) for i in range(max_number + 1)] + OPERATORS + PUNCTUATION
    toks += list(WORDS if words is None else words)
    vocab: dict[str, int] = {}
    for t in toks:
        vocab.setdefault(t, len(vocab))
    return vocab


def build_backend(vocab: dict[str, int]):
    """A :class:`tokenizers.Tokenizer` (WordLevel model) for ``vocab``; BOS is *not* added here (the
    HookedTransformer prepends it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=False),
         pre_tokenizers.Punctuation()]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with single spaces
    return tok


def wrap(backend) -> transformers.PreTrainedTokenizerFast:
    """Wrap a :class:`tokenizers.Tokenizer` as a Hugging Face fast tokenizer with BOS/PAD/UNK set."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=BOS, pad_token=PAD, unk_token=UNK,
        add_bos_token=True, name_or_path="af1-zoo-wordlevel",
    )
    tok.padding_side = "right"
    return tok


def build_tokenizer(max_number: int = MAX_NUMBER, words: list[str] | None = None):
    """The Hugging Face tokenizer of the zoo: see the module docstring."""
    return wrap(build_backend(vocabulary(max_number, words)))


def load_tokenizer(path: str | Path):
    """Load a tokenizer saved as ``tokenizer.json`` (a :mod:`tokenizers` file), offline."""
    from tokenizers import Tokenizer

    return wrap(Tokenizer.from_file(str(path)))


def save_tokenizer(tokenizer, path: str | Path) -> None:
    """Write the backend of ``tokenizer`` as ``tokenizer.json``: the vocabulary and splitting only, without
    the truncation and padding a ``HookedTransformer`` sets on the tokenizer it is given."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    backend.save(str(path))
