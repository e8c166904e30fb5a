"""Prompts longer than the model's positions: refused in one line before a forward pass would index past the
position table (``IndexError`` from the embedding), and a prompt text too long to fit is refused from its length
in characters alone, before it is tokenised (a 5 MB prefix is refused at once, in bounded memory).

A token covers at most as many characters as its longest vocabulary entry has, so a text of ``c`` characters
takes at least ``ceil(c / longest)`` tokens (:func:`fewest_tokens`); that bound, never an estimate, decides the
early refusal. Torch-free; imports nothing of the task layer (the tokenizer is passed in).
"""

from __future__ import annotations

from circuits.errors import PromptError

__all__ = ["FIX", "check_positions", "check_text_fits", "fewest_tokens", "longest_token", "positions_of"]

FIX = "shorten the task's prefix, lower --shots, or use fewer or shorter slots"
"""How to make prompts shorter, said by every refusal of this module."""


def positions_of(model: object) -> int | None:
    """The model's positions (``cfg.n_ctx``: the length of its position table or rotary cache), ``None`` when it
    does not say."""
    n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", None)
    return int(n_ctx) if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None


def longest_token(tokenizer: object) -> int:
    """Characters of the tokenizer's longest vocabulary entry (at least 1; 64 when it lists no vocabulary)."""
    vocab = getattr(tokenizer, "get_vocab", None)
    entries = vocab() if callable(vocab) else {}
    return max((len(t) for t in entries), default=64) or 1


def fewest_tokens(text: str, tokenizer: object) -> int:
    """A lower bound of the tokens ``text`` takes: its characters over :func:`longest_token`, rounded up."""
    longest = longest_token(tokenizer)
    return -(-len(text) // longest)


def check_text_fits(text: str, model: object, tokenizer: object, what: str) -> None:
    """:class:`~circuits.errors.PromptError` when ``text`` (``what`` names it, e.g. ``"the prefix of task 'add'"``)
    cannot fit the model's positions whatever it tokenises to (:func:`fewest_tokens`); nothing is tokenised."""
    n_ctx = positions_of(model)
    if n_ctx is None:
        return
    least = fewest_tokens(text, tokenizer)
    if least > n_ctx:
        raise PromptError(f"{what} has {len(text):,} characters, at least {least:,} tokens: more than the {n_ctx} "
                          f"positions of this model; {FIX}")


def check_positions(model: object, n_tokens: int, example: str | None = None) -> None:
    """:class:`~circuits.errors.PromptError` when prompts of ``n_tokens`` tokens (BOS and teacher-forced answer
    tokens included; ``example``: one of them) exceed the model's positions."""
    n_ctx = positions_of(model)
    if n_ctx is not None and n_tokens > n_ctx:
        shown = f" (e.g. {example[:60]!r}{'...' if len(example) > 60 else ''})" if example is not None else ""
        raise PromptError(f"prompts of {n_tokens} tokens{shown} exceed the {n_ctx} positions of this model; {FIX}")
