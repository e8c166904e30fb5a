"""Input checks shared by every intervention: fail early, with the bad value and the valid range.

The scalar checks (:func:`check_int`, :func:`check_positive`, :func:`check_fraction`, :func:`check_choice`)
are the toolkit's one set: they raise :class:`~interventions.InterventionError` here, and
:mod:`circuits.validation` binds them to :class:`circuits.errors.ArgumentError`. A ``name`` spelled as a flag
(``"--n-prompts"``) reads ``--n-prompts 0 is out of range``, a keyword (``"n_boot"``) ``n_boot=0 must be ...``.
Torch is imported only by the tensor checks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import InterventionError

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from jaxtyping import Int

    from .types import Model

ErrorType = type[Exception]


def _shown(name: str, value: object) -> str:
    """``--flag value`` for a command-line flag, ``name=value`` for a keyword argument or a field."""
    return f"{name} {value}" if name.startswith("-") else f"{name}={value!r}"


def check_int(name: str, value: object, minimum: int = 0, maximum: int | None = None, *,
              error: ErrorType = InterventionError) -> int:
    """``value`` if it is an integer in ``minimum .. maximum`` (no upper bound when ``maximum`` is ``None``;
    booleans are refused), else ``error`` naming it and the valid range."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum \
            or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        if name.startswith("-"):
            raise error(f"{_shown(name, value)} is out of range: give an integer {bound}")
        raise error(f"{_shown(name, value)} must be an integer {bound}")
    return value


def check_positive(name: str, value: object, maximum: int | None = None, *,
                   error: ErrorType = InterventionError) -> int:
    """``value`` if it is an integer ``>= 1`` (``n_boot``, batch sizes, counts; at most ``maximum``), else
    ``error``."""
    return check_int(name, value, 1, maximum, error=error)


def check_fraction(name: str, value: object, *, error: ErrorType = InterventionError) -> float:
    """``value`` as a float in [0, 1] (a faithfulness fraction; NaN refused), else ``error``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= float(value) <= 1.0:
        raise error(f"{_shown(name, value)} is out of range: a faithfulness fraction in [0, 1], e.g. 0.9")
    return float(value)


def check_choice(name: str, value: object, choices: Sequence[str], *, error: ErrorType = InterventionError) -> str:
    """``value`` if it is one of ``choices``, else ``error`` listing them."""
    if not isinstance(value, str) or value not in choices:
        raise error(f"{_shown(name, value)} is not valid: choose one of {', '.join(map(repr, choices))}")
    return value


def check_tokens(tokens: object, d_vocab: int | None = None) -> Int[torch.Tensor, "batch pos"]:
    """Return ``tokens`` if it is a non-empty ``[batch, pos]`` integer tensor of valid ids, else raise."""
    import torch

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


def check_answers(answers: object, n_prompts: int, d_vocab: int | None = None) -> Int[torch.Tensor, " n_prompts *k"]:
    """``answers`` as a ``[n_prompts]`` long tensor of token ids in ``0..d_vocab-1`` (one answer token per
    prompt), or ``[n_prompts, k]`` (``k`` answer tokens per prompt, read under teacher forcing from the
    prompts' last ``k`` positions), else raise."""
    import torch

    try:
        answers = torch.as_tensor(answers)
    except (TypeError, ValueError, RuntimeError):
        raise InterventionError(f"answers must be token ids, one per prompt; got {type(answers).__name__}") from None
    if answers.is_floating_point() or answers.is_complex() or answers.dtype == torch.bool:
        raise InterventionError(f"answers must hold integer token ids, got dtype {answers.dtype}")
    if answers.shape != (n_prompts,) and not (answers.ndim == 2 and answers.shape[0] == n_prompts
                                               and answers.shape[1] >= 1):
        raise InterventionError(
            f"answers must hold one token id per prompt (or [n_prompts, k] for k answer tokens): got shape "
            f"{tuple(answers.shape)} for {n_prompts} prompts"
        )
    if d_vocab is not None and answers.numel():
        lo, hi = int(answers.min()), int(answers.max())
        if lo < 0 or hi >= d_vocab:
            raise InterventionError(
                f"answer token id {lo if lo < 0 else hi} is out of range: valid ids are 0..{d_vocab - 1} "
                f"(answers are token ids, not numbers: use tasks.answer_token_ids(model, values))"
            )
    return answers.long()


def special_token_ids(model: Model) -> tuple[int | None, int | None]:
    """``(bos_id, pad_id)`` of the model's tokenizer (``None`` where it has none or no tokenizer). A
    tokenizer without a BOS token (Qwen2) marks the start with its EOS token, which then counts as BOS."""
    tok = getattr(model, "tokenizer", None)
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        bos = getattr(tok, "eos_token_id", None)
    pad = getattr(tok, "pad_token_id", None)
    return (int(bos) if bos is not None else None, int(pad) if pad is not None else None)


def check_layout(tokens: Int[torch.Tensor, "batch pos"], *, bos_id: int | None = None,
                 pad_id: int | None = None) -> None:
    """Prompts of one layout: BOS at position 0 of every prompt, and no padding.

    With ``bos_id`` every prompt must start with it; without, position 0 must hold the same token in every
    prompt. A position ``>= 1`` holding ``pad_id`` (when it differs from ``bos_id`` or follows a
    non-pad token) marks a padded batch of mixed-length prompts, whose per-position means would be wrong.
    """
    first = tokens[:, 0]
    if bos_id is not None and bool((first != bos_id).any()):
        row = int((first != bos_id).nonzero()[0, 0])
        raise InterventionError(
            f"prompt {row} does not start with the BOS token (id {bos_id}) at position 0 (found id "
            f"{int(first[row])}): prepend BOS (model.to_tokens(text, prepend_bos=True), or --prepend-bos)"
        )
    if bos_id is None and bool((first != first[0]).any()):
        raise InterventionError(
            "position 0 must hold the same token (BOS) in every prompt: prepend BOS to every prompt"
        )
    if pad_id is not None and tokens.shape[1] > 1:
        rest = tokens[:, 1:]
        padded = (rest == pad_id).any(dim=1) if pad_id != bos_id else (rest[:, -1] == pad_id)
        if bool(padded.any()):
            row = int(padded.nonzero()[0, 0])
            raise InterventionError(
                f"prompt {row} holds the pad token (id {pad_id}) after position 0: a padded batch of prompts of "
                f"different lengths; group prompts by token length (circuits.tasks.to_layouts) and run each "
                f"layout on its own"
            )
