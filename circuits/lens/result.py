"""The early-decoding result (:class:`LensResult`), its per-sub-layer summary rows and strict JSON.

Summary statistics over prompts: mean (NaN-skipping), population std and a 95% percentile bootstrap
interval of the mean (one shared resampling of prompts per call, ``numpy.random.default_rng(seed)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from circuits.errors import ArgumentError
from circuits.lens import figures as lens_figures
from circuits.lens.figures import METRICS
from circuits.lens.jsonable import json_number, json_ready
from interventions.types import DataFrame, Figure, JsonDict

if TYPE_CHECKING:
    from circuits.lens.interchange_check import InterchangeResult

__all__ = ["ARRAYS", "METRICS", "LensResult", "json_ready"]

ARRAYS = ("answers", "answer_values", "layout_lengths", *METRICS, "top1_token", "visible")
"""The per-prompt arrays of a :class:`LensResult`, as ``lens.npz`` stores them."""
INTERCHANGE_ARRAYS = ("layers", "clean_prob", "patched_prob", "orig_top1", "counter_prob", "counter_top1")


@dataclass
class LensResult:
    """Per-prompt early-decoding metrics.

    Arrays are numpy, shaped ``[n_prompts, n_layers, n_sublayers]`` (``visible``:
    ``[n_prompts, n_layers, n_sublayers, n_tracked]``), in the order of ``prompts``/``answers``.
    ``layers`` are 0-indexed block indices; ``sublayers`` is ``("attn", "mlp")`` (post-attention,
    post-MLP). Probabilities and shares in [0, 1]; ranks 0 = top-1; ``abs_error`` in answer units (NaN
    where the answer value is unknown); ``visible`` is NaN where a prompt lacks that tracked token.
    """

    layers: list[int]
    sublayers: tuple[str, ...]
    decode: str
    top_k: int
    answers: np.ndarray
    answer_values: np.ndarray
    prompts: list[str]
    layout_lengths: np.ndarray
    answer_prob: np.ndarray
    answer_rank: np.ndarray
    numeric_mass: np.ndarray
    top1_numeric: np.ndarray
    top10_numeric: np.ndarray
    abs_error: np.ndarray
    top1_token: np.ndarray
    tracked: list[str]
    visible: np.ndarray
    interchanges: list[InterchangeResult] = field(default_factory=list)
    """The interchange checks of the run (:class:`~circuits.lens.InterchangeResult`), when it made them."""

    # --- reopening ---------------------------------------------------------------------------------
    def array_dict(self) -> dict[str, np.ndarray]:
        """What ``lens.npz`` holds: :data:`ARRAYS`, and per interchange check ``ix<i>_<array>`` and its label."""
        out = {k: np.asarray(getattr(self, k)) for k in ARRAYS}
        for i, r in enumerate(self.interchanges):
            out[f"ix{i}_label"] = np.asarray(r.label)
            for k in INTERCHANGE_ARRAYS:
                v = getattr(r, k)
                if v is not None:
                    out[f"ix{i}_{k}"] = np.asarray(v)
        return out

    @classmethod
    def load(cls, run_dir: str | Path) -> LensResult:
        """The early decoding stored in ``run_dir`` (``af1 lens --out``): the settings and prompts of
        ``lens.json``, the per-prompt arrays of ``lens.npz`` (written since this release; an older directory
        raises ``FileNotFoundError`` saying to rerun it) and the interchange checks."""
        import json

        from circuits.lens.interchange_check import InterchangeResult
        from circuits.store import files

        path = Path(run_dir)
        doc_path, npz_path = path / files.LENS, path / files.LENS_ARRAYS
        if not doc_path.is_file():
            raise FileNotFoundError(f"{path} holds no {files.LENS}: not an af1 lens directory")
        if not npz_path.is_file():
            raise FileNotFoundError(f"{path} holds {files.LENS} but no {files.LENS_ARRAYS} (written by an earlier "
                                    f"release, which kept summaries only): rerun af1 lens with --force to reopen it")
        doc = json.loads(doc_path.read_text())
        with np.load(npz_path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        inter = []
        i = 0
        while f"ix{i}_label" in arrays:
            def get(k: str, i: int = i) -> Any:
                return arrays.get(f"ix{i}_{k}")

            inter.append(InterchangeResult(layers=[int(x) for x in get("layers")], clean_prob=get("clean_prob"),
                                           patched_prob=get("patched_prob"), orig_top1=get("orig_top1"),
                                           counter_prob=get("counter_prob"), counter_top1=get("counter_top1"),
                                           label=str(get("label"))))
            i += 1
        return cls(layers=[int(x) for x in doc["layers"]], sublayers=tuple(doc["sublayers"]), decode=doc["decode"],
                   top_k=int(doc["top_k"]), prompts=[str(p["prompt"]) for p in doc["prompts"]],
                   tracked=list(doc["tracked"]), interchanges=inter, **{k: arrays[k] for k in ARRAYS})

    # --- tables and figures ---------------------------------------------------------------------------
    def to_pandas(self, *, per_prompt: bool = False, n_boot: int = 1000, seed: int = 0) -> DataFrame:
        """A ``pandas.DataFrame``: one row per (block, sub-layer) of :meth:`rows`; ``per_prompt=True``: one row
        per (prompt, block, sub-layer) with the raw metrics instead."""
        from circuits.store.frames import dataframe

        if not per_prompt:
            return dataframe(self.rows(n_boot=n_boot, seed=seed))
        rows = []
        for p in range(self.n_prompts):
            for li, layer in enumerate(self.layers):
                for si, sub in enumerate(self.sublayers):
                    row: JsonDict = {"index": p, "prompt": self.prompts[p], "layer": int(layer), "sublayer": sub}
                    row.update({m: getattr(self, m)[p, li, si].item() for m in METRICS})
                    rows.append(row)
        return dataframe(rows)

    def figures(self, *, n_boot: int = 1000, seed: int = 0) -> list[Figure]:
        """Every figure of the report, in its order (one line chart per metric of :data:`METRICS`, the tracked
        tokens' visibility, the rank heatmap, the interchange drops)."""
        return lens_figures.figures(self, self.interchanges, n_boot=n_boot, seed=seed)

    def plot(self, metric: str = "answer_prob", *, n_boot: int = 1000, seed: int = 0) -> Figure:
        """The report's line chart of ``metric`` (one of :data:`METRICS`) over depth."""
        if metric not in METRICS:
            raise ArgumentError(f"metric={metric!r} is not one of {', '.join(METRICS)}")
        return lens_figures.metric_figure(self, metric, n_boot=n_boot, seed=seed)

    @property
    def n_prompts(self) -> int:
        return int(self.answer_prob.shape[0])

    def labels(self) -> list[str]:
        """Depth labels in forward order: ``["L0 attn", "L0 mlp", "L1 attn", ...]``."""
        return [f"L{layer} {sub}" for layer in self.layers for sub in self.sublayers]

    def flat(self, metric: str) -> np.ndarray:
        """``[n_prompts, n_layers * n_sublayers]`` view of a metric, columns in :meth:`labels` order."""
        arr = getattr(self, metric)
        return arr.reshape(arr.shape[0], -1, *arr.shape[3:])

    def rows(self, *, n_boot: int = 1000, seed: int = 0) -> list[JsonDict]:
        """One summary row per (block, sub-layer), in forward order.

        Keys: ``layer``, ``sublayer``, ``label``, each metric of :data:`METRICS` (mean over prompts,
        NaN-skipping) with ``<metric>_std`` (population std) and ``<metric>_ci_low`` / ``_ci_high`` (95%
        percentile bootstrap over prompts, one shared resampling), ``answer_top1`` (share of prompts
        with rank 0), ``answer_rank_median``, ``visible_<name>`` (share of prompts with that tracked
        token in the top-k) and ``n``.
        """
        n = self.n_prompts
        idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n)) if n else None
        rows = []
        for li, layer in enumerate(self.layers):
            for si, sub in enumerate(self.sublayers):
                row: JsonDict = {"layer": int(layer), "sublayer": sub, "label": f"L{layer} {sub}", "n": n}
                for m in METRICS:
                    v = getattr(self, m)[:, li, si].astype(np.float64)
                    row.update(_summary(m, v, idx))
                rank = self.answer_rank[:, li, si]
                row["answer_top1"] = float(np.mean(rank == 0)) if n else float("nan")
                row["answer_rank_median"] = float(np.median(rank)) if n else float("nan")
                for ti, name in enumerate(self.tracked):
                    v = self.visible[:, li, si, ti]
                    row[f"visible_{name}"] = float(np.nanmean(v)) if np.isfinite(v).any() else None
                rows.append(row)
        return rows

    def to_dict(self, *, n_boot: int = 1000, seed: int = 0) -> JsonDict:
        """JSON-ready summary: ``prompts`` (``[{"prompt", "answer"}]``, answer = integer value or None),
        ``answer_tokens`` (answer token ids, same order), ``rows`` (:meth:`rows`) and the settings."""
        prompts = [{"prompt": p, "answer": json_number(a)} for p, a in zip(self.prompts, self.answer_values)]
        return {
            "decode": self.decode, "top_k": self.top_k, "layers": list(map(int, self.layers)),
            "sublayers": list(self.sublayers), "tracked": list(self.tracked), "n_prompts": self.n_prompts,
            "prompts": prompts, "answer_tokens": [int(t) for t in self.answers],
            "rows": json_ready(self.rows(n_boot=n_boot, seed=seed)),
        }


def _summary(name: str, v: np.ndarray, idx: np.ndarray | None) -> dict[str, float]:
    ok = np.isfinite(v)
    if idx is None or not ok.any():
        nan = float("nan")
        return {name: nan, f"{name}_std": nan, f"{name}_ci_low": nan, f"{name}_ci_high": nan}
    if ok.all():
        means = v[idx].mean(1)
    else:  # NaN-skipping bootstrap: resample prompts, average the finite ones
        vals, w = np.where(ok, v, 0.0)[idx], ok[idx]
        with np.errstate(invalid="ignore"):
            means = vals.sum(1) / w.sum(1)
        means = means[np.isfinite(means)]
    return {
        name: float(v[ok].mean()), f"{name}_std": float(v[ok].std()),
        f"{name}_ci_low": float(np.quantile(means, 0.025)), f"{name}_ci_high": float(np.quantile(means, 0.975)),
    }
