"""The AF1 search over ``(wait, transfer)``: evaluation order, resumable results and outputs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import torch
from jaxtyping import Int
from tqdm.auto import tqdm

import interventions as iv
from circuits.faithfulness import last_token_metrics, summarize
from circuits.runs import dist_version, tokens_sha256
from circuits.search.evaluators import FastEvaluator, NaiveEvaluator
from circuits.search.results import ConfigResult, SearchResult
from circuits.search.rule import (
    ABLATIONS, GRIDS, METHODS, Config, configurations, scan, select, smallest_transfers,
)
from interventions.types import Tokens
from interventions.validation import check_choice, check_tokens


def search_af1(
    model: Any,
    tokens: Tokens,
    answers: Int[torch.Tensor, "batch"],
    *,
    cache: iv.MeanCache | None = None,
    threshold: float = 0.9,
    grid: Literal["auto", "full"] = "auto",
    ablation: Literal["cama", "mean", "zero"] = "cama",
    out_dir: str | Path | None = None,
    seed: int = 0,
    batch_size: int = 128,
    progress: bool = True,
    method: Literal["fast", "naive"] = "fast",
    n_boot: int = 1000,
    meta: Mapping[str, Any] | None = None,
    prompts: Sequence[Mapping[str, Any]] | None = None,
) -> SearchResult:
    """Search the AF1 configurations of ``model`` on ``tokens`` and apply the selection rule.

    Args:
        model: a TransformerLens model (eval mode).
        tokens: ``[batch, pos]`` token ids of one layout, BOS at position 0. Prompts the unmodified
            model gets wrong are dropped first (``base_accuracy`` in the result says how many were kept).
        answers: ``[batch]`` answer token ids.
        cache: the :class:`interventions.MeanCache` for CAMA / mean ablation; fitted on ``tokens``
            (the kept prompts) when ``None`` (and loaded from ``out_dir/means.safetensors`` on resume).
        threshold: faithfulness (fraction in [0, 1]) a configuration needs to be sufficient.
        grid: ``"full"`` evaluates every configuration; ``"auto"`` only what the selection needs.
        ablation: ``"cama"`` (default), ``"mean"`` or ``"zero"`` at ``blocks.{wait}.hook_resid_post``.
        out_dir: if given, results are appended to ``out_dir/results.jsonl`` as they are known, and
            ``prompts.jsonl``, ``means.safetensors``, ``summary.json`` and ``report.html`` are written.
            Re-running into the same directory resumes; a different command raises ``RunMismatchError``.
        seed: seed of the bootstrap confidence intervals (recorded in the run identity).
        batch_size: prompts per forward pass. ``progress``: show tqdm bars.
        method: ``"fast"`` (exact shortcuts) or ``"naive"`` (one full forward pass per configuration).
        n_boot: bootstrap resamples per confidence interval.
        meta: identity of the command (e.g. ``model``, ``task``, ``source``, ``command``); recorded in
            ``run.json`` / ``summary.json``. ``base_accuracy``/``n_checked`` there override the values
            measured on ``tokens`` (the caller filtered earlier). ``command`` is not part of the identity.
        prompts: ``{"prompt", "answer"}`` records aligned with ``tokens`` for ``prompts.jsonl``
            (default: token ids and answer token ids).
    """
    t0 = time.perf_counter()
    check_choice("grid", grid, GRIDS)
    check_choice("ablation", ablation, ABLATIONS)
    check_choice("method", method, METHODS)
    if not isinstance(threshold, (int, float)) or not 0.0 <= float(threshold) <= 1.0:
        raise ValueError(f"threshold={threshold!r} must be a fraction in [0, 1]")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
    info = iv.adapt(model).info
    tokens = check_tokens(tokens, d_vocab=info.d_vocab)
    answers = torch.as_tensor(answers, dtype=torch.long)
    if answers.shape != (tokens.shape[0],):
        raise ValueError(
            f"answers must hold one token id per prompt: got shape {tuple(answers.shape)} for {tokens.shape[0]} prompts"
        )
    meta = dict(meta or {})
    n_layers = info.n_layers

    # Base check: keep the prompts the unmodified model answers correctly.
    with torch.inference_mode():
        base_logits = torch.cat([model(tokens[s : s + batch_size])[:, -1].float() for s in range(0, len(tokens), batch_size)])
    keep = last_token_metrics(base_logits, answers)[0].cpu()
    n_given = int(tokens.shape[0])
    tokens, answers = tokens[keep], answers[keep]
    if prompts is not None:
        prompts = [p for p, k in zip(prompts, keep.tolist()) if k]
    if len(tokens) == 0:
        raise ValueError(f"the unmodified model answers none of the {n_given} prompts correctly: nothing to search")
    base_accuracy = float(meta.pop("base_accuracy", keep.float().mean().item()))
    n_checked = int(meta.pop("n_checked", n_given))

    identity = {
        **{k: v for k, v in meta.items() if k != "command"},
        "n_prompts": int(tokens.shape[0]),
        "prompts_sha256": tokens_sha256(tokens, answers),
        "model_signature": {**info.signature(), "fingerprint": iv.adapt(model).fingerprint()},
        "threshold": float(threshold),
        "ablation": ablation,
        "seed": int(seed),
        "n_boot": int(n_boot),
        # A cache fitted here is a function of the model and prompts above; a given one is named by hash.
        "means": None if ablation == "zero" else (cache.sha256 if cache is not None else "fitted on the prompts"),
    }
    run_dir = None
    known: dict[Config, ConfigResult] = {}
    if out_dir is not None:
        from circuits.runs import RunDir

        run_dir = RunDir(out_dir, identity).open()
        for rec in run_dir.load_records():
            r = ConfigResult.from_dict(rec)
            known[r.config] = r
        if prompts is None:
            prompts = [
                {"prompt": " ".join(map(str, row)), "answer": int(a)}
                for row, a in zip(tokens.tolist(), answers.tolist())
            ]
        run_dir.write_jsonl("prompts.jsonl", prompts)

    if ablation in ("cama", "mean") and cache is None:
        saved = Path(out_dir) / "means.safetensors" if out_dir is not None else None
        if saved is not None and saved.exists():
            cache = iv.MeanCache.load(saved)
            cache.check_model(model)
        else:
            cache = iv.MeanCache.fit(model, tokens, batch_size=batch_size, progress=progress)
    if cache is not None:
        cache.check_model(model)
        if out_dir is not None:
            target = Path(out_dir) / "means.safetensors"
            if not target.exists() or iv.MeanCache.load(target).sha256 != cache.sha256:
                cache.save(target)
            else:
                cache.source = str(target)

    evaluator_cls = FastEvaluator if method == "fast" else NaiveEvaluator
    evaluator = evaluator_cls(model, tokens, answers, cache, ablation, batch_size)
    counts = {"evaluated": 0, "resumed": 0}

    def evaluate(w: int, t: int) -> ConfigResult:
        if (w, t) in known:
            counts["resumed"] += 1
            return known[(w, t)]
        res = summarize(*evaluator.evaluate(w, t), n_boot=n_boot, seed=seed)
        r = ConfigResult.from_faithfulness(w, t, res, ablation)
        counts["evaluated"] += 1
        if run_dir is not None:
            run_dir.append(r.to_dict())
        return r

    bar = tqdm(total=len(configurations(n_layers)), desc=f"AF1 search ({grid} grid)", unit="config", disable=not progress)
    try:
        results = scan(n_layers, threshold, grid, evaluate, bar=bar)
    finally:
        bar.close()
    n_evaluated, n_resumed = counts["evaluated"], counts["resumed"]
    # Results resumed from an earlier (e.g. full-grid) run count too: they can only add information.
    for c, r in known.items():
        results.setdefault(c, r)
    faith = {c: r.faithfulness for c, r in results.items()}
    chosen = select(faith, threshold)
    selected = results[chosen] if chosen is not None else None
    specs: list[dict[str, Any]] = []
    if selected is not None:
        specs = [x.to_dict() for x in iv.af1_subgraph(n_layers, selected.wait, selected.transfer, cache, ablation)]
    seconds = time.perf_counter() - t0
    result = SearchResult(
        n_layers=n_layers,
        threshold=float(threshold),
        ablation=ablation,
        grid=grid,
        method=method,
        results=sorted(results.values(), key=lambda r: (-r.wait, r.transfer)),
        selected=selected,
        smallest_transfer=smallest_transfers(faith, n_layers, threshold),
        n_evaluated=n_evaluated,
        n_resumed=n_resumed,
        passes=evaluator.passes,
        seconds=seconds,
        base_accuracy=base_accuracy,
        n_prompts=int(tokens.shape[0]),
        out_dir=Path(out_dir) if out_dir is not None else None,
        interventions=specs,
    )
    if run_dir is not None:
        write_outputs(result, run_dir.path, meta=meta, seed=seed, n_checked=n_checked, identity=identity)
    return result


def write_outputs(
    result: SearchResult,
    out_dir: str | Path,
    *,
    meta: Mapping[str, Any],
    seed: int,
    n_checked: int,
    identity: Mapping[str, Any],
) -> None:
    """``summary.json`` and ``report.html`` of a finished search in ``out_dir``."""
    import transformer_lens

    import circuits
    from circuits import report
    from circuits.runs import write_json

    out_dir = Path(out_dir)
    sel = result.selected
    summary = {
        "model": meta.get("model"),
        "task": meta.get("task"),
        "seed": int(seed),
        "threshold": result.threshold,
        "base_accuracy": result.base_accuracy,
        "n_checked": n_checked,
        "n_prompts": result.n_prompts,
        "selected": None
        if sel is None
        else {"wait": sel.wait, "transfer": sel.transfer, "faithfulness": sel.faithfulness,
              "ci_low": sel.ci_low, "ci_high": sel.ci_high, "n": sel.n},
        "selected_message": result.summary_line(),
        "interventions": result.interventions,
        "seconds": result.seconds,
        "circuits_version": circuits.__version__,
        "transformer_lens_version": getattr(transformer_lens, "__version__", None) or dist_version("transformer-lens"),
        "torch_version": torch.__version__,
        "smallest_transfer_per_wait": {str(w): t for w, t in sorted(result.smallest_transfer.items())},
        "grid": result.grid,
        "method": result.method,
        "ablation": result.ablation,
        "n_layers": result.n_layers,
        "n_configs_total": len(configurations(result.n_layers)),
        "n_configs_evaluated": len(result.results),
        "n_evaluated_this_run": result.n_evaluated,
        "n_resumed": result.n_resumed,
        "passes": result.passes,
        "command": list(meta.get("command") or sys.argv),
        "identity": dict(identity),
        "source": meta.get("source"),
        "means": "means.safetensors" if (out_dir / "means.safetensors").exists() else None,
    }
    write_json(out_dir / "summary.json", summary)
    title = f"AF1 search: {meta.get('model') or 'model'} on {meta.get('task') or 'prompts'} ({result.ablation})"
    report.search_report(result, out_dir / "report.html", title=title)


def load_summary(out_dir: str | Path) -> dict[str, Any]:
    """``summary.json`` of a finished search directory."""
    import json

    path = Path(out_dir) / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"no summary.json in {out_dir}: the search has not finished there")
    return json.loads(path.read_text())
