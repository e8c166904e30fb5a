"""``af1 lens`` as an analysis of the runner: early decoding of the prompts and the interchange checks
of every operand and operator (pure), its run identity and its outputs (``lens.json``, ``report.html``)."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from circuits.analyses import Analysis, RunContext
from circuits.lens.config import LensConfig
from circuits.lens.result import LensResult
from circuits.logs import get_logger
from interventions.types import JsonDict, Model

if TYPE_CHECKING:
    from circuits.lens.counterfactual import CounterfactualSet
    from circuits.store.runs import RunDir
    from circuits.tasks.catalogue import TaskLike


def interchange_sets(model: Model, task: TaskLike, prompts: list[str], answers: list[int],
                     seed: int) -> list[CounterfactualSet]:
    """Counterfactual pair sets for every operand and every operator symbol of ``task``'s template (a name, task
    file or spec). A task of string slots or answers (a lookup) has none: the checks swap integer operands."""
    from circuits.lens.counterfactual import counterfactual_rows, counterfactual_set, parse_operands
    from circuits.tasks import catalogue as tasks

    spec = tasks.get_task(task)
    if not spec.numeric or spec.slot_values:
        get_logger("lens").info("lens: no interchange checks for %s: they swap integer operands", spec.name)
        return []
    rows = []
    for p, a in zip(prompts, answers):
        ops = parse_operands(spec.template, spec.operand_names, p[len(spec.prefix):] if
                                  p.startswith(spec.prefix) else p)
        if ops is not None:
            rows.append({"prompt": p, "answer": int(a), "operands": ops, "task": task})
    changes = [("operand", i, f"operand {name}") for i, name in enumerate(spec.operand_names)]
    n_ops = sum(re.sub(r"\{[^}]*\}", "", spec.template).count(c) for c in "+-")
    changes += [("operator", i, f"operator {i + 1}") for i in range(n_ops)]
    sets = []
    for change, index, label in changes:
        pairs = counterfactual_rows(rows, change=change, index=index, seed=seed, spec=spec)
        try:
            sets.append(counterfactual_set(model, pairs, label=label))
        except ValueError as err:
            get_logger("lens").warning("lens: skipping interchange '%s': %s", label, err)
    return sets


def lens_run(model: Model, config: LensConfig, ctx: RunContext) -> LensResult:
    """Early decoding of the kept prompts, and the interchange checks (pure): one :class:`LensResult`, its
    interchange checks in :attr:`~LensResult.interchanges` (run when ``config.interchange`` and the run's
    description names the task).

    Answers of ``k > 1`` tokens (``[n, k]``, digit-level tokenizers): the lens decodes the position that
    predicts the *first* answer token (the last prompt token; the teacher-forced answer tokens are left out)
    and scores that token, whose numeric value is its own (e.g. the leading digit); the interchange checks,
    which swap whole operands, need single-token answers and are skipped. Answers that are not integers (a
    lookup task, a prompt dataset of text answers): the numeric metrics (``abs_error``, the numeric value of the
    decoded top-1 token) are NaN, and the interchange checks are skipped."""
    import torch

    from circuits.lens.decode import early_decode
    from circuits.lens.interchange_check import interchange
    from circuits.tasks.tokens import is_number

    records = ctx.kept_prompts or []
    prompts = [r["prompt"] for r in records]
    numeric = bool(records) and all(not isinstance(r["answer"], str) or is_number(r["answer"]) for r in records)
    values = [int(r["answer"]) for r in records] if numeric else None
    tokens, answers = ctx.tokens, torch.as_tensor(ctx.answers)
    if answers.ndim == 2:  # the first answer token, predicted at the last prompt position
        tokens, answers, values = tokens[:, : tokens.shape[1] - answers.shape[1] + 1], answers[:, 0], None
    result = early_decode(model, tokens, answers=answers, answer_values=values,
                               prompts=prompts or None, decode=config.decode, top_k=config.top_k,
                               batch_size=config.batch_size)
    inter = []
    if config.interchange and values is not None and ctx.meta.get("task") is not None \
            and ctx.meta.get("source") != "prompts":
        for cf in interchange_sets(model, ctx.meta["task"], prompts, values, config.seed):
            inter.append(interchange(model, cf.tokens, cf.answers, cf.counter_tokens,
                                          counter_answers=cf.counter_answers, batch_size=config.batch_size,
                                          label=cf.label))
    result.interchanges = inter
    return result


def lens_identity(config: LensConfig, ctx: RunContext, model: Model) -> JsonDict:
    """The run identity of ``af1 lens``."""
    import interventions as iv
    from circuits.store.runs import tokens_sha256

    ad = iv.adapt(model)
    # seed: the prompts' (the config's); n_requested: the prompts asked for (before dropping any).
    described = {"seed": int(config.seed), "n_requested": n_requested(ctx), **ctx.meta}
    return {
        **{k: v for k, v in described.items() if k in ("model", "task", "seed", "n_requested", "numbers", "format")},
        "analysis": "lens",
        "n_prompts": int(ctx.tokens.shape[0]),
        "prompts_sha256": tokens_sha256(ctx.tokens, ctx.answers),
        "model_signature": ad.model_identity(),
        "decode": config.decode,
        "top_k": int(config.top_k),
        "interchange": bool(config.interchange),
    }


def n_requested(ctx: RunContext) -> int | None:
    """The prompts the run asked for: the prompt spec's count (``None`` for the caller's own tensors)."""
    return ctx.meta.get("n_requested", None if ctx.spec is None else int(ctx.spec.n_prompts))


def write_lens(result: LensResult, run_dir: RunDir, ctx: RunContext) -> None:
    """``lens.json``, ``lens.npz`` and ``report.html``."""
    from circuits.lens.report import write_lens_outputs

    seed = int(ctx.meta.get("seed", run_dir.identity.get("seed", 0)))
    meta = {"model": ctx.meta.get("model"), "task": ctx.meta.get("task"), "seed": seed,
            "n_requested": n_requested(ctx), "base_accuracy": ctx.meta.get("base_accuracy")}
    # the prompt format, when not the papers'
    meta.update({k: ctx.meta[k] for k in ("numbers", "format") if k in ctx.meta})
    meta["runtime_s"] = round(time.time() - ctx.meta.get("t0", ctx.started), 1)
    write_lens_outputs(run_dir.path, result, interchanges=result.interchanges, meta=meta, seed=seed)


def lens_row(result: LensResult) -> JsonDict:
    """A sweep row of early decoding: the final answer probability (in the faithfulness column)."""
    return {"faithfulness": float(result.rows(n_boot=200)[-1]["answer_prob"])}


LENS: Analysis[LensConfig, LensResult] = Analysis(
    name="lens",
    config_type=LensConfig,
    results_file=None,
    identity=lens_identity,
    run=lens_run,
    write=write_lens,
    summary_row=lens_row,
    base_correct_only=False,
)
"""``af1 lens`` as the runner runs it."""
