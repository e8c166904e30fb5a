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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from jaxtyping import Int
from tqdm.auto import tqdm

import interventions as iv
from circuits.analyses import Analysis, RunContext, configured
from circuits.faithfulness import answer_width, faithfulness
from circuits.models.spec import LoadedModel
from circuits.prompts.ready import ReadyPrompts
from circuits.runner import RunOptions, run
from circuits.store import files
from circuits.store.records import RecordSchema, faithfulness_fields, layer_field
from circuits.store.runs import RunDir, tokens_sha256
from circuits.validation import check_int, check_positive
from interventions.types import DataFrame, Figure, JsonDict, JsonMapping, Model, Tokens

if TYPE_CHECKING:
    from interventions.adapter import ModelInfo


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

    def to_dict(self) -> JsonDict:
        return asdict(self)


@dataclass
class NecessityResult:
    """Per-block results (``blocks[l]`` for block ``l``), the prompts used and the wall time.

    :meth:`load` reopens a run directory without a model; :meth:`to_pandas` and :meth:`plot` give the table
    and the report's bar chart."""

    blocks: list[BlockNecessity]
    n_prompts: int
    seconds: float
    n_resumed: int = 0

    @classmethod
    def load(cls, run_dir: str | Path) -> NecessityResult:
        """The sweep stored in ``run_dir`` (``af1 necessity --out``, :func:`necessity_sweep` with ``out_dir``):
        the blocks of ``necessity.jsonl`` in the order of ``necessity.json`` (block order while unfinished)."""
        from circuits.store.runs import read_json_object, read_jsonl

        path = Path(run_dir)
        if not (path / files.IDENTITY).is_file():
            raise FileNotFoundError(f"{path} holds no {files.IDENTITY}: not a run directory")
        identity = read_json_object(path / files.IDENTITY)
        summary_path = path / files.NECESSITY_SUMMARY
        summary: JsonDict = read_json_object(summary_path) if summary_path.is_file() else {}
        names = BlockNecessity.__dataclass_fields__
        rows = summary.get("blocks") or sorted(read_jsonl(path / files.NECESSITY_RESULTS), key=lambda r: r["layer"])
        values: list[JsonDict] = [{k: float("nan") if rec.get(k) is None else rec[k] for k in names}
                                        for rec in rows]
        blocks = [BlockNecessity(**v) for v in values]
        counted: int = identity.get("n_prompts", 0)
        return cls(blocks=blocks, n_prompts=int(summary.get("n_prompts", counted)),
                   seconds=float(summary.get("seconds", 0.0)), n_resumed=int(summary.get("n_resumed", 0)))

    def to_pandas(self) -> DataFrame:
        """A ``pandas.DataFrame``: one row per block (the fields of :class:`BlockNecessity`)."""
        from circuits.store.frames import dataframe

        return dataframe([b.to_dict() for b in self.blocks], BlockNecessity.__dataclass_fields__)

    def plot(self, title: str = "Necessity sweep") -> Figure:
        """The report's bar chart: faithfulness per block with its 95% interval (a plotly figure)."""
        from circuits import report

        return report.necessity_figure([b.layer for b in self.blocks], [b.faithfulness for b in self.blocks],
                                       [(b.ci_low, b.ci_high) for b in self.blocks], title)

    def figures(self, title: str = "Necessity sweep") -> list[Figure]:
        """Every figure of the report."""
        return [self.plot(title)]

    def table(self) -> str:
        lines = [f"{'block':>5} {'faithfulness':>13} {'95% CI':>17}"]
        for b in self.blocks:
            lines.append(f"{b.layer:>5} {b.faithfulness:>13.3f}   [{b.ci_low:.3f}, {b.ci_high:.3f}]")
        return "\n".join(lines)


@dataclass(frozen=True)
class NecessityConfig:
    """What determines a necessity sweep besides the model and the prompts: ``layers`` to test
    (0-indexed; ``None`` = every block), bootstrap ``seed`` and ``n_boot``, ``batch_size`` (prompts per
    forward pass)."""

    layers: tuple[int, ...] | None = None
    seed: int = 0
    batch_size: int = 128
    n_boot: int = 1000

    def validate(self, info: ModelInfo | None = None) -> NecessityConfig:
        """Raise :class:`~circuits.errors.ArgumentError` naming the first bad field."""
        check_int("seed", self.seed, -(2**63))
        check_positive("batch_size", self.batch_size)
        check_positive("n_boot", self.n_boot)
        if info is not None:
            for layer in self.layers or ():
                info.check_layer(layer, "necessity layer")
        return self

    def blocks(self, n_layers: int) -> list[int]:
        return list(range(n_layers)) if self.layers is None else [int(x) for x in self.layers]


def necessity_sweep(
    model: Model,
    tokens: Tokens,
    answers: Int[torch.Tensor, " batch"],
    *,
    config: NecessityConfig | None = None,
    layers: Sequence[int] | None = None,
    out_dir: str | Path | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    n_boot: int | None = None,
    meta: JsonMapping | None = None,
) -> NecessityResult:
    """Faithfulness per block with the last token's attention cut to every non-BOS earlier token.

    ``tokens``: ``[batch, pos]`` of one layout, BOS at position 0; prompts the unmodified model gets
    wrong are dropped first. ``layers``: blocks to test (default all, 0-indexed). With ``out_dir``,
    results are appended to ``necessity.jsonl`` as they are known and an interrupted run resumes.
    ``config``: a :class:`NecessityConfig` (default ``NecessityConfig()``); ``layers``, ``seed`` (default 0),
    ``batch_size`` (128) and ``n_boot`` (1000) given as keywords override its fields.
    """
    config = configured(NecessityConfig, config, layers=None if layers is None else tuple(int(x) for x in layers),
                        seed=seed, batch_size=batch_size, n_boot=n_boot)
    return run(NECESSITY, config, LoadedModel(model, name=(meta or {}).get("model")),
               ReadyPrompts(tokens, answers, meta=dict(meta or {})), RunOptions(out=out_dir, progress=progress))


def run_necessity(model: Model, config: NecessityConfig, ctx: RunContext) -> NecessityResult:
    """The sweep itself (pure): one faithfulness per block not already in ``ctx.store``."""
    t0 = time.perf_counter()
    known = {int(rec["layer"]): BlockNecessity(**{k: rec[k] for k in BlockNecessity.__dataclass_fields__})
             for rec in ctx.store.records()}
    blocks = []
    n_resumed = 0
    for layer in tqdm(config.blocks(iv.adapt(model).info.n_layers), desc="necessity sweep", unit="block",
                      disable=not ctx.progress):
        if layer in known:
            blocks.append(known[layer])
            n_resumed += 1
            continue
        peek = iv.Peek([layer], mode="self", queries="last", n_last=answer_width(ctx.answers))
        r = faithfulness(model, ctx.tokens, ctx.answers, [peek], assume_correct=True,
                         batch_size=config.batch_size, n_boot=config.n_boot, seed=config.seed)
        b = BlockNecessity(layer=layer, **r.to_dict())
        blocks.append(b)
        ctx.store.append(b.to_dict())
    return NecessityResult(blocks=blocks, n_prompts=int(len(ctx.tokens)), seconds=time.perf_counter() - t0,
                           n_resumed=n_resumed)


def necessity_identity(config: NecessityConfig, ctx: RunContext, model: Model) -> JsonDict:
    """The run identity of a sweep (the keys of the first release, so that its directories resume)."""
    ad = iv.adapt(model)
    return {
        **{k: v for k, v in ctx.meta.items() if k not in ("command", "base_accuracy", "n_checked")},
        "analysis": "necessity",
        "n_prompts": int(len(ctx.tokens)),
        "prompts_sha256": tokens_sha256(ctx.tokens, ctx.answers),
        "model_signature": ad.model_identity(),
        "seed": int(config.seed),
        "n_boot": int(config.n_boot),
    }


def necessity_schema(config: NecessityConfig, info: ModelInfo, n_prompts: int) -> RecordSchema:
    """The schema of a ``necessity.jsonl`` line (a block of this model, ``n`` = the run's prompts)."""
    return RecordSchema(fields=(layer_field("layer", info.n_layers), *faithfulness_fields(n_prompts)), key=("layer",))


def write_necessity_outputs(result: NecessityResult, run_dir: RunDir, ctx: RunContext) -> None:
    """``necessity.json`` and ``report.html`` of a finished sweep."""
    from circuits import report
    from circuits.tasks.formats import describe_prompts

    meta = ctx.meta
    run_dir.write_json(files.NECESSITY_SUMMARY, {
        **{k: meta.get(k) for k in ("model", "task", "source", "base_accuracy", "n_checked", "command")},
        "prompt_format": describe_prompts(meta),
        "seed": int(run_dir.identity.get("seed", 0)),
        "n_prompts": result.n_prompts,
        "seconds": result.seconds,
        "n_resumed": result.n_resumed,
        "blocks": [b.to_dict() for b in result.blocks],
        "identity": run_dir.identity,
    })
    title = f"Necessity sweep: {meta.get('model') or 'model'} on {meta.get('task') or 'prompts'}"
    notes = [f"Faithfulness when the last token attends only to BOS and itself in one block (all other blocks "
             f"unchanged); {result.n_prompts} prompts.", f"Prompts: {describe_prompts(meta)}."]
    report.write_page(run_dir.path / files.REPORT, title, result.figures(title), notes)


def necessity_row(result: NecessityResult) -> JsonDict:
    """A sweep row of a necessity sweep: the most necessary block (``wait`` = that block) and its faithfulness."""
    pick = min(result.blocks, key=lambda b: b.faithfulness)
    return {"wait": pick.layer, "faithfulness": pick.faithfulness, "ci_low": pick.ci_low, "ci_high": pick.ci_high}


NECESSITY: Analysis[NecessityConfig, NecessityResult] = Analysis(
    name="necessity",
    config_type=NecessityConfig,
    results_file=files.NECESSITY_RESULTS,
    identity=necessity_identity,
    schema=necessity_schema,
    run=run_necessity,
    write=write_necessity_outputs,
    summary_row=necessity_row,
)
"""The necessity sweep as the runner runs it."""
