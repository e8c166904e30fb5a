"""Result records of the AF1 search: one :class:`ConfigResult` per configuration (a line of
``results.jsonl``; field names and order are part of the file format) and the :class:`SearchResult`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from circuits.errors import CorruptRunError
from circuits.faithfulness import FaithfulnessResult
from circuits.search.rule import Config, select, smallest_transfers
from circuits.store import fields as jf  # typed fields of run.json and summary.json
from circuits.store.outcomes import PromptOutcomes
from interventions.types import DataFrame, Figure, JsonDict, JsonMapping

RECORD_FIELDS = ("wait", "transfer", "faithfulness", "ci_low", "ci_high", "n", "n_faithful", "mean_answer_prob",
                 "mean_logit_diff", "ablation")
"""The aggregate fields of a ``results.jsonl`` line (and the columns of :meth:`SearchResult.to_pandas`); a line
of this release adds the per-prompt outcomes (:data:`circuits.store.outcomes.FIELDS`)."""


@dataclass(frozen=True)
class ConfigResult:
    """Faithfulness of one configuration. ``faithfulness`` is a fraction of the ``n`` prompts; ``outcomes``:
    prompt by prompt (``None`` for a record of an earlier release, which stored none)."""

    wait: int
    transfer: int
    faithfulness: float
    ci_low: float
    ci_high: float
    n: int
    n_faithful: int
    mean_answer_prob: float
    mean_logit_diff: float
    ablation: str
    outcomes: PromptOutcomes | None = field(default=None, compare=False, repr=False)

    @property
    def config(self) -> Config:
        return (self.wait, self.transfer)

    def to_dict(self) -> JsonDict:
        """The ``results.jsonl`` line: :data:`RECORD_FIELDS` plus the per-prompt outcomes when known."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "outcomes"}
        if self.outcomes is not None:
            out.update(self.outcomes.to_record())
        return out

    @classmethod
    def from_dict(cls, d: JsonMapping) -> ConfigResult:
        nan = float("nan")
        return cls(
            wait=int(d["wait"]),
            transfer=int(d["transfer"]),
            faithfulness=float(d["faithfulness"]),
            ci_low=nan if d.get("ci_low") is None else float(d["ci_low"]),
            ci_high=nan if d.get("ci_high") is None else float(d["ci_high"]),
            n=int(d["n"]),
            n_faithful=int(d.get("n_faithful", round(float(d["faithfulness"]) * int(d["n"])))),
            mean_answer_prob=float(d.get("mean_answer_prob", nan)),
            mean_logit_diff=float(d.get("mean_logit_diff", nan)),
            ablation=str(d.get("ablation", "cama")),
            outcomes=PromptOutcomes.from_record(d),
        )

    @classmethod
    def from_faithfulness(cls, wait: int, transfer: int, r: FaithfulnessResult, ablation: str,
                          outcomes: PromptOutcomes | None = None) -> ConfigResult:
        return cls(wait=wait, transfer=transfer, ablation=ablation, outcomes=outcomes, **r.to_dict())


def config_row(result: ConfigResult | None) -> JsonDict:
    """A sweep row of one configuration (:attr:`circuits.analyses.Analysis.summary_row`): its ``wait``,
    ``transfer``, ``faithfulness`` and 95% interval (nothing for ``None``)."""
    if result is None:
        return {}
    return {"wait": result.wait, "transfer": result.transfer, "faithfulness": result.faithfulness,
            "ci_low": result.ci_low, "ci_high": result.ci_high}


@dataclass
class SearchResult:
    """Outcome of :func:`search_af1`.

    Attributes:
        n_layers: blocks of the model. ``threshold``: faithfulness needed (fraction).
        results: every evaluated configuration (including ones resumed from ``out_dir``).
        selected: the configuration the selection rule picks, or ``None`` if none is sufficient.
        smallest_transfer: per wait, the smallest sufficient transfer (``None``: none; ``"not
            evaluated"``: the auto grid skipped that wait).
        n_evaluated: configurations computed by this call; ``n_resumed``: read back from ``out_dir``.
        passes: model forward calls made by this call; ``seconds``: wall time of the search.
        base_accuracy: fraction of the given prompts the unmodified model answers correctly;
            ``n_prompts``: prompts kept (answered correctly), the faithfulness denominator.
        prompts: the text of the scored prompts (as in ``prompts.jsonl``), when known.

    Reopen a run directory without a model with :meth:`load`; :meth:`with_threshold` applies the selection
    rule with another threshold to the same results; :meth:`to_pandas` and :meth:`plot` give the table and
    the report's figures.
    """

    n_layers: int
    threshold: float
    ablation: str
    grid: str
    method: str
    results: list[ConfigResult]
    selected: ConfigResult | None
    smallest_transfer: dict[int, int | None | str]
    n_evaluated: int
    n_resumed: int
    passes: int
    seconds: float
    base_accuracy: float
    n_prompts: int
    out_dir: Path | None = None
    interventions: list[JsonDict] = field(default_factory=list)
    prompts: list[str] | None = None

    # --- reopening ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, run_dir: str | Path, *, threshold: float | None = None) -> SearchResult:
        """The search stored in ``run_dir`` (written by ``af1 search``, :func:`~circuits.search.search_af1`
        with ``out_dir``, a sweep cell or ``af1 groundtruth``), without a model: the configurations of
        ``results.jsonl``, the selection with ``threshold`` (default: the run's), and what ``summary.json``
        says of the run (grid, method, timings; absent while a run has not finished)."""
        from circuits.store import files
        from circuits.store.runs import read_json_object, read_jsonl

        path = Path(run_dir)
        ident_path = path / files.IDENTITY
        if not ident_path.is_file():
            raise FileNotFoundError(f"{path} holds no {files.IDENTITY}: not a run directory")
        identity = read_json_object(ident_path)
        summary: JsonDict = read_json_object(path / files.SUMMARY) if (path / files.SUMMARY).is_file() else {}
        results = [ConfigResult.from_dict(r) for r in checked_records(path / files.SEARCH_RESULTS, identity, summary)]
        prompts = [str(p.get("prompt")) for p in read_jsonl(path / files.PROMPTS)] or None
        if prompts is not None:
            results = [replace(r, outcomes=replace(r.outcomes, prompts=prompts))
                       if r.outcomes is not None and r.outcomes.n == len(prompts) else r for r in results]
        ident, summ = path / files.IDENTITY, path / files.SUMMARY
        n_layers = stored_n_layers(path, identity, summary)
        if n_layers is None:
            raise jf.corrupt(ident, "model_signature", "is missing (and summary.json records no n_layers)")
        stored = jf.fraction(summary, "threshold", summ, None)
        stored = jf.fraction(identity, "threshold", ident, 0.9) if stored is None else stored
        base = cls(
            n_layers=n_layers, threshold=stored,
            ablation=jf.text(summary, "ablation", summ, "") or jf.text(identity, "ablation", ident, "cama"),
            grid=jf.text(summary, "grid", summ, "auto"), method=jf.text(summary, "method", summ, "fast"),
            results=sorted(results, key=lambda r: (-r.wait, r.transfer)), selected=None, smallest_transfer={},
            n_evaluated=jf.integer(summary, "n_evaluated_this_run", summ, 0),
            n_resumed=jf.integer(summary, "n_resumed", summ, 0), passes=jf.integer(summary, "passes", summ, 0),
            seconds=jf.number(summary, "seconds", summ, 0.0),
            base_accuracy=jf.fraction(summary, "base_accuracy", summ, float("nan")),
            n_prompts=jf.integer(identity, "n_prompts", ident, 0) or jf.integer(summary, "n_prompts", summ, 0),
            out_dir=path, interventions=list(summary.get("interventions") or []), prompts=prompts,
        )
        reselected = base.with_threshold(stored)
        reselected.interventions = base.interventions
        return reselected if threshold is None else reselected.with_threshold(threshold)

    def with_threshold(self, threshold: float) -> SearchResult:
        """The same results with the selection rule applied at ``threshold`` (nothing is evaluated). The
        selected subgraph's ``interventions`` are kept when the selection is unchanged, else left empty (they
        name the means cache, which needs the model)."""
        from circuits.validation import check_fraction

        threshold = check_fraction("threshold", threshold)
        faith = self.faithfulness_map()
        chosen = select(faith, threshold)
        selected = self.result(*chosen) if chosen is not None else None
        same = (selected is None and self.selected is None) or (
            selected is not None and self.selected is not None and selected.config == self.selected.config)
        return replace(self, threshold=threshold, selected=selected,
                       smallest_transfer=smallest_transfers(faith, self.n_layers, threshold),
                       interventions=list(self.interventions) if same else [])

    # --- per prompt, tables, figures --------------------------------------------------------------
    def prompt_outcomes(self, wait: int, transfer: int) -> PromptOutcomes:
        """Prompt by prompt, for configuration ``(wait, transfer)``: which prompts keep their answer, the
        answer's probability and margin (:class:`~circuits.store.outcomes.PromptOutcomes`; ``.flipped()``: the
        prompts it changes). ``KeyError`` if the configuration was not evaluated, ``ValueError`` for a run of
        an earlier release, which stored aggregates only."""
        r = self.result(wait, transfer)
        if r is None:
            raise KeyError(f"configuration wait={wait}, transfer={transfer} was not evaluated in this search")
        if r.outcomes is None:
            raise CorruptRunError(f"configuration wait={wait}, transfer={transfer} has no per-prompt outcomes: it was "
                                  f"stored by an earlier release; rerun it into a new directory to have them")
        out = r.outcomes
        if out.prompts is None and self.prompts is not None and len(self.prompts) == out.n:
            out = replace(out, prompts=list(self.prompts))
        return out

    def to_pandas(self) -> DataFrame:
        """A ``pandas.DataFrame``: one row per evaluated configuration (:data:`RECORD_FIELDS`), plus
        ``selected`` (the configuration the rule picks at this threshold)."""
        from circuits.store.frames import dataframe

        chosen = self.selected.config if self.selected is not None else None
        rows = [{**{k: getattr(r, k) for k in RECORD_FIELDS}, "selected": r.config == chosen} for r in self.results]
        return dataframe(rows, (*RECORD_FIELDS, "selected"))

    def plot_heatmap(self, title: str = "AF1 search") -> Figure:
        """The report's faithfulness heatmap over ``wait`` x ``transfer`` (a plotly figure)."""
        from circuits import report

        return report.search_heatmap(self, title)

    def plot_smallest_transfer(self) -> Figure:
        """The report's chart of the smallest sufficient transfer per wait (a plotly figure)."""
        from circuits import report

        return report.smallest_transfer_figure(self)

    def plot(self, title: str = "AF1 search") -> Figure:
        """:meth:`plot_heatmap` (shows inline in a notebook)."""
        return self.plot_heatmap(title)

    def figures(self, title: str = "AF1 search") -> list[Figure]:
        """Every figure of the report, in its order."""
        return [self.plot_heatmap(title), self.plot_smallest_transfer()]

    def faithfulness_map(self) -> dict[Config, float]:
        return {r.config: r.faithfulness for r in self.results}

    def result(self, wait: int, transfer: int) -> ConfigResult | None:
        return next((r for r in self.results if r.config == (wait, transfer)), None)

    def grid_array(self) -> np.ndarray:
        """``[n_layers+1, n_layers+1]`` faithfulness, row ``wait+1``, column ``transfer``; NaN where
        the configuration does not exist or was not evaluated."""
        a = np.full((self.n_layers + 1, self.n_layers + 1), np.nan)
        for r in self.results:
            a[r.wait + 1, r.transfer] = r.faithfulness
        return a

    def table(self) -> str:
        """A plain-text table: per wait, the smallest sufficient transfer and its faithfulness."""
        faith = self.faithfulness_map()
        lines = [f"{'wait':>5} {'smallest transfer':>18} {'faithfulness':>13}"]
        for w, t in sorted(self.smallest_transfer.items(), reverse=True):
            if isinstance(t, int):
                mark = "  <- selected" if self.selected is not None and self.selected.config == (w, t) else ""
                lines.append(f"{w:>5} {t:>18} {faith[(w, t)]:>13.3f}{mark}")
            else:
                best = max((f for (ww, _), f in faith.items() if ww == w), default=None)
                shown = "none" if t is None else t
                extra = f"(best {best:.3f})" if best is not None else ""
                lines.append(f"{w:>5} {shown:>18} {extra:>13}")
        return "\n".join(lines)

    def most_faithful(self, min_transfer: int = 0) -> ConfigResult | None:
        """The evaluated configuration with the highest faithfulness among those with at least ``min_transfer``
        transfer blocks; ties go to the later wait, then the shorter transfer (the selection rule's order). ``None``
        if there is none."""
        pool = [r for r in self.results if r.transfer >= min_transfer]
        return max(pool, key=lambda r: (r.faithfulness, r.wait, -r.transfer), default=None)

    def summary_line(self) -> str:
        if self.selected is None:
            best = max(self.results, key=lambda r: (r.faithfulness, r.wait, -r.transfer), default=None)
            detail = (
                f"; the most faithful is wait={best.wait}, transfer={best.transfer} at {best.faithfulness:.3f}"
                if best is not None else ""
            )
            return (
                f"no configuration reaches faithfulness {self.threshold:g} "
                f"({len(self.results)} configurations evaluated): selected = None{detail}"
            )
        s = self.selected
        return (
            f"selected wait={s.wait}, transfer={s.transfer}: faithfulness {s.faithfulness:.3f} "
            f"[{s.ci_low:.3f}, {s.ci_high:.3f}] on {s.n} prompts (threshold {self.threshold:g})"
        )


def stored_n_layers(run_dir: Path, identity: JsonMapping, summary: JsonMapping) -> int | None:
    """The model's blocks of the run in ``run_dir``: ``run.json``'s ``model_signature.n_layers``, else
    ``summary.json``'s ``n_layers`` (``None`` when neither records it: an identity of the first releases). A
    summary that contradicts ``run.json``, or a value that is not a positive integer, is a
    :class:`~circuits.errors.CorruptRunError` naming the file and the field."""
    from circuits.store import files

    ident, summ = run_dir / files.IDENTITY, run_dir / files.SUMMARY
    signature = jf.mapping(identity, "model_signature", ident, None)
    recorded = None
    if signature is not None:
        name = "model_signature.n_layers"
        recorded = jf.integer({name: signature.get("n_layers")}, name, ident, None, minimum=1)
    summarised = jf.integer(summary, "n_layers", summ, None, minimum=1)
    if recorded is not None and summarised is not None and recorded != summarised:
        raise jf.corrupt(summ, "n_layers", f"= {summarised} contradicts {ident}, whose "
                                           f"model_signature.n_layers = {recorded}")
    return recorded if recorded is not None else summarised


def checked_records(path: Path, identity: JsonMapping, summary: JsonMapping) -> list[JsonDict]:
    """The records of a search's ``results.jsonl``, checked as a resumed run checks them (types, ranges, totals
    that agree with the per-prompt outcomes; :func:`circuits.search.schema.record_schema`): a malformed or
    forged line is a :class:`~circuits.errors.CorruptRunError` naming the file, the line and the field."""
    from circuits.search.schema import record_schema
    from circuits.store.runs import read_jsonl

    n_layers = stored_n_layers(path.parent, identity, summary)
    n_prompts = identity.get("n_prompts", summary.get("n_prompts"))
    numbered = read_jsonl(path, with_lines=True)
    if not isinstance(n_layers, int) or not isinstance(n_prompts, int):
        return [r for _, r in numbered]  # an identity of the first releases: nothing to check against
    ints = {k: identity.get(k) for k in ("seed", "n_boot")}
    ints = {k: v if isinstance(v, int) and not isinstance(v, bool) else None for k, v in ints.items()}
    ablation = identity.get("ablation") if isinstance(identity.get("ablation"), str) else None
    return record_schema(n_layers, n_prompts, ablation, **ints).validate(path, numbered)
