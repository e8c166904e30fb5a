"""What an evaluation needs of the last position's logits, in four numbers per prompt.

A search only needs, per prompt, whether the answer is the argmax, its probability and its margin over
the best other token. :func:`answer_readout` reduces ``[batch, d_vocab]`` logits to ``[batch, 4]`` from
which all three follow exactly (:func:`readout_metrics`); a remote backend computes it on the server
and sends 16 bytes per prompt instead of the vocabulary (512 kB per prompt for Llama-3 in float32).
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int

READOUT = ("answer_logit", "best_other_logit", "logsumexp", "argmax")
"""The columns of :func:`answer_readout` (logits in float32; ``argmax`` a token id stored as a float)."""


def answer_positions(logits: Float[torch.Tensor, "batch pos d_vocab"],
                     answers: Int[torch.Tensor, " batch *k"]) -> Float[torch.Tensor, "batch *k d_vocab"]:
    """The logits that predict the answer: the last position (``[batch, d_vocab]``) for one answer token per
    prompt (``answers`` ``[batch]``), the last ``k`` positions (``[batch, k, d_vocab]``) for ``k`` answer tokens
    read under teacher forcing (``answers`` ``[batch, k]``: the prompt's tokens are followed by the first
    ``k-1`` answer tokens, so position ``-k+j`` predicts answer token ``j``)."""
    return logits[:, -1] if answers.ndim == 1 else logits[:, -answers.shape[1]:]


def answer_readout(last: Float[torch.Tensor, "batch *k d_vocab"],
                   answers: Int[torch.Tensor, " batch *k"]) -> Float[torch.Tensor, "batch *k 4"]:
    """Per prompt (and, for ``[batch, k]`` answers, per answer token), in float32: the answer's logit, the
    largest logit of any other token, the log-sum-exp of all logits and the argmax token id (first maximum,
    as ``torch.argmax``). ``last``: :func:`answer_positions` (``[batch, d_vocab]`` or ``[batch, k, d_vocab]``);
    returns ``[batch, 4]`` or ``[batch, k, 4]``."""
    if answers.ndim == 2:
        b, k = answers.shape
        return answer_readout(last.reshape(b * k, -1), answers.reshape(b * k)).reshape(b, k, len(READOUT))
    logits = last.float()
    answers = answers.to(logits.device).long()
    answer = logits.gather(-1, answers[:, None]).squeeze(-1)
    other = logits.scatter(-1, answers[:, None], float("-inf")).max(-1).values
    return torch.stack([answer, other, logits.logsumexp(-1), logits.argmax(-1).float()], dim=-1)


def readout_metrics(
    readout: Float[torch.Tensor, "batch *k 4"], answers: Int[torch.Tensor, " batch *k"]
) -> tuple[Bool[torch.Tensor, " batch"], Float[torch.Tensor, " batch"], Float[torch.Tensor, " batch"]]:
    """Per prompt from :func:`answer_readout`: correct (argmax == answer), the answer's probability
    (a fraction in [0, 1]) and its logit minus the best other logit. For ``[batch, k]`` answers (``readout``
    ``[batch, k, 4]``): correct when every answer token is the argmax, the answer's probability under teacher
    forcing (the product over its tokens) and the smallest margin of its tokens; for ``k = 1`` exactly the
    single-token numbers."""
    r = readout.float()
    correct = r[..., 3].long() == answers.to(r.device).long()
    prob, margin = (r[..., 0] - r[..., 2]).exp(), r[..., 0] - r[..., 1]
    if answers.ndim == 2:
        return correct.all(dim=1), prob.prod(dim=1), margin.min(dim=1).values
    return correct, prob, margin
