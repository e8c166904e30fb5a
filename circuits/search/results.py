"""Result records of the AF1 search: one :class:`ConfigResult` per configuration (a line of
``results.jsonl``; field names and order are part of the file format) and the :class:`SearchResult`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from circuits.faithfulness import FaithfulnessResult
from circuits.search.rule import Config


@dataclass(frozen=True)
class ConfigResult:
    """Faithfulness of one configuration. ``faithfulness`` is a fraction of the ``n`` prompts."""

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

    @property
    def config(self) -> Config:
        return (self.wait, self.transfer)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ConfigResult":
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
        )

    @classmethod
    def from_faithfulness(cls, wait: int, transfer: int, r: FaithfulnessResult, ablation: str) -> "ConfigResult":
        return cls(wait=wait, transfer=transfer, ablation=ablation, **r.to_dict())


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
    interventions: list[dict[str, Any]] = field(default_factory=list)

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
