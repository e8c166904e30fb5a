"""What an evaluation needs of the last position's logits, in four numbers per prompt.

A search only needs, per prompt, whether the answer is the argmax, its probability and its margin over
the best other token. :func:`answer_readout` reduces ``[batch, d_vocab]`` logits to ``[batch, 4]`` from
which all three follow exactly (:func:`readout_metrics`); a remote backend computes it on the server
and sends 16 bytes per prompt instead of the vocabulary (512 kB per prompt for Llama-3 in float32).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int

READOUT = ("answer_logit", "best_other_logit", "logsumexp", "argmax")
"""The columns of :func:`answer_readout` (logits in float32; ``argmax`` a token id stored as a float)."""


def answer_readout(last: Float[torch.Tensor, "batch d_vocab"], answers: Int[torch.Tensor, "batch"]
                   ) -> Float[torch.Tensor, "batch 4"]:
    """Per prompt, in float32: the answer's logit, the largest logit of any other token, the log-sum-exp of
    all logits and the argmax token id (first maximum, as ``torch.argmax``)."""
    logits = last.float()
    answers = answers.to(logits.device).long()
    answer = logits.gather(-1, answers[:, None]).squeeze(-1)
    other = logits.scatter(-1, answers[:, None], float("-inf")).max(-1).values
    return torch.stack([answer, other, logits.logsumexp(-1), logits.argmax(-1).float()], dim=-1)


def readout_metrics(readout: Float[torch.Tensor, "batch 4"], answers: Int[torch.Tensor, "batch"]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per prompt from :func:`answer_readout`: correct (argmax == answer), the answer's probability
    (a fraction in [0, 1]) and its logit minus the best other logit."""
    r = readout.float()
    correct = r[:, 3].long() == answers.to(r.device).long()
    return correct, (r[:, 0] - r[:, 2]).exp(), r[:, 0] - r[:, 1]
