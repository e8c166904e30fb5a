"""Input checks shared by every intervention: fail early, with the bad value and the valid range."""

from __future__ import annotations

from typing import Any

import torch

from .types import InterventionError


def check_tokens(tokens: Any, d_vocab: int | None = None) -> torch.Tensor:
    """Return ``tokens`` if it is a non-empty ``[batch, pos]`` integer tensor of valid ids, else raise."""
    if not isinstance(tokens, torch.Tensor):
        raise InterventionError(
            f"tokens must be a torch.LongTensor of shape [batch, pos], got {type(tokens).__name__}; "
            f"use model.to_tokens(prompts)"
        )
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise InterventionError(
            f"tokens must hold integer token ids, got dtype {tokens.dtype}; convert with tokens.long()"
        )
    if tokens.ndim != 2:
        raise InterventionError(
            f"tokens must have shape [batch, pos], got {tuple(tokens.shape)}; add a batch dimension "
            f"with tokens[None]"
        )
    if tokens.numel() == 0:
        raise InterventionError(f"tokens is empty (shape {tuple(tokens.shape)}): need >= 1 prompt of >= 1 token")
    if d_vocab is not None:
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= d_vocab:
            bad = lo if lo < 0 else hi
            raise InterventionError(f"token id {bad} is out of range: valid ids are 0..{d_vocab - 1}")
    return tokens.long()


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InterventionError(f"{name}={value!r} is not valid: choose one of {', '.join(map(repr, choices))}")


def check_index(name: str, value: Any, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InterventionError(f"{name}={value!r} must be an integer >= {minimum}")
    return value
