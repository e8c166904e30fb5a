"""Necessity sweep: which blocks does the last token need to read the other tokens in?

In the otherwise unmodified model, for one block ``l`` (0-indexed) at a time, the last token may attend
only to BOS and itself (``Peek([l], "self", "last")``); faithfulness per block says how much the answer
depends on that block's attention from the last token to the earlier (non-BOS) tokens. On Llama-3-8B
only the transfer blocks are catastrophic.

Output (``out_dir``): ``necessity.jsonl`` (one line per block, appended as soon as it is known; re-running
resumes), ``necessity.json`` (all blocks and the run identity) and ``report.html`` (bar chart).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from jaxtyping import Int
from tqdm.auto import tqdm

import interventions as iv
from circuits.faithfulness import faithfulness
from interventions.types import Tokens
from interventions.validation import check_tokens


@dataclass(frozen=True)
class BlockNecessity:
    """Faithfulness (fraction of ``n`` prompts) with the last token self-peeking in block ``layer``."""

    layer: int
    faithfulness: float
    ci_low: float
    ci_high: float
    n: int
    n_faithful: int
    mean_answer_prob: float
    mean_logit_diff: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class NecessityResult:
    """Per-block results (``blocks[l]`` for block ``l``), the prompts used and the wall time."""

    blocks: list[BlockNecessity]
    n_prompts: int
    seconds: float
    n_resumed: int = 0

    def table(self) -> str:
        lines = [f"{'block':>5} {'faithfulness':>13} {'95% CI':>17}"]
        for b in self.blocks:
            lines.append(f"{b.layer:>5} {b.faithfulness:>13.3f}   [{b.ci_low:.3f}, {b.ci_high:.3f}]")
        return "\n".join(lines)


def necessity_sweep(
    model: Any,
    tokens: Tokens,
    answers: Int[torch.Tensor, "batch"],
    *,
    layers: Sequence[int] | None = None,
    out_dir: str | Path | None = None,
    seed: int = 0,
    batch_size: int = 128,
    progress: bool = True,
    n_boot: int = 1000,
    meta: Mapping[str, Any] | None = None,
) -> NecessityResult:
    """Faithfulness per block with the last token's attention cut to every non-BOS earlier token.

    ``tokens``: ``[batch, pos]`` of one layout, BOS at position 0; prompts the unmodified model gets
    wrong are dropped first. ``layers``: blocks to test (default all, 0-indexed). With ``out_dir``,
    results are appended to ``necessity.jsonl`` as they are known and an interrupted run resumes.
    """
    t0 = time.perf_counter()
    info = iv.adapt(model).info
    tokens = check_tokens(tokens, d_vocab=info.d_vocab)
    answers = torch.as_tensor(answers, dtype=torch.long)
    layers = list(range(info.n_layers)) if layers is None else [int(x) for x in layers]
    for layer in layers:
        info.check_layer(layer, "necessity layer")
    from circuits.faithfulness import base_correct

    keep = base_correct(model, tokens, answers, batch_size=batch_size)
    tokens, answers = tokens[keep], answers[keep]
    if len(tokens) == 0:
        raise ValueError("the unmodified model answers none of the prompts correctly: nothing to sweep")
    meta = dict(meta or {})
    known: dict[int, BlockNecessity] = {}
    run_dir = None
    if out_dir is not None:
        from circuits.runs import RunDir
        from circuits.search import tokens_sha256

        identity = {
            **{k: v for k, v in meta.items() if k not in ("command", "base_accuracy", "n_checked")},
            "analysis": "necessity",
            "n_prompts": int(len(tokens)),
            "prompts_sha256": tokens_sha256(tokens, answers),
            "model_signature": {**info.signature(), "fingerprint": iv.adapt(model).fingerprint()},
            "seed": int(seed),
            "n_boot": int(n_boot),
        }
        run_dir = RunDir(out_dir, identity, results_name="necessity.jsonl").open()
        for rec in run_dir.load_records():
            known[int(rec["layer"])] = BlockNecessity(**{k: rec[k] for k in BlockNecessity.__dataclass_fields__})
    blocks = []
    n_resumed = 0
    for layer in tqdm(layers, desc="necessity sweep", unit="block", disable=not progress):
        if layer in known:
            blocks.append(known[layer])
            n_resumed += 1
            continue
        r = faithfulness(model, tokens, answers, [iv.Peek([layer], mode="self", queries="last")],
                         assume_correct=True, batch_size=batch_size, n_boot=n_boot, seed=seed)
        b = BlockNecessity(layer=layer, **r.to_dict())
        blocks.append(b)
        if run_dir is not None:
            run_dir.append(b.to_dict())
    result = NecessityResult(blocks=blocks, n_prompts=int(len(tokens)), seconds=time.perf_counter() - t0,
                             n_resumed=n_resumed)
    if run_dir is not None:
        from circuits import report

        run_dir.write_json("necessity.json", {
            **{k: meta.get(k) for k in ("model", "task", "source", "base_accuracy", "n_checked", "command")},
            "seed": int(seed),
            "n_prompts": result.n_prompts,
            "seconds": result.seconds,
            "blocks": [b.to_dict() for b in blocks],
            "identity": run_dir.identity,
        })
        title = f"Necessity sweep: {meta.get('model') or 'model'} on {meta.get('task') or 'prompts'}"
        report.necessity_report(
            [b.layer for b in blocks], [b.faithfulness for b in blocks], Path(out_dir) / "report.html",
            ci=[(b.ci_low, b.ci_high) for b in blocks], title=title,
            notes=[f"Faithfulness when the last token attends only to BOS and itself in one block "
                   f"(all other blocks unchanged); {result.n_prompts} prompts."],
        )
    return result
