"""One point of a pruning curve (a line of ``curve.jsonl``; field names and order are part of the file format)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from interventions.types import Head, JsonDict, JsonMapping

__all__ = ["CURVE_FIELDS", "CurvePoint"]

CURVE_FIELDS = (
    "step", "removed", "heads_kept", "n_heads_kept", "faithfulness", "ci_low", "ci_high", "n",
    "mean_answer_prob", "mean_logit_diff", "passes", "attribution_passes", "seconds", "candidates",
)


@dataclass
class CurvePoint:
    """One point of the pruning curve: the state after step ``step`` (step 0: nothing removed).

    ``removed``: the head removed at this step (None at step 0); ``heads_kept``: transfer heads still
    present; metrics as in :class:`circuits.faithfulness.FaithfulnessResult`; ``passes``: confirmed
    forward passes spent on this step; ``attribution_passes``: forward+backward passes (0 or 1);
    ``candidates``: per remaining head before the removal, its attribution ``estimate`` (None without
    attribution) and, if confirmed, its ``faithfulness`` and ``mean_logit_diff`` after removal.
    """

    step: int
    removed: Head | None
    heads_kept: list[Head]
    n_heads_kept: int
    faithfulness: float
    ci_low: float
    ci_high: float
    n: int
    mean_answer_prob: float
    mean_logit_diff: float
    passes: int
    attribution_passes: int
    seconds: float
    candidates: list[JsonDict] = field(default_factory=list)

    def to_dict(self) -> JsonDict:
        out = asdict(self)
        out["removed"] = list(self.removed) if self.removed is not None else None
        out["heads_kept"] = [list(h) for h in self.heads_kept]
        return out

    @classmethod
    def from_dict(cls, row: JsonMapping) -> CurvePoint:
        data = {k: row[k] for k in CURVE_FIELDS}
        data["removed"] = tuple(row["removed"]) if row["removed"] is not None else None
        data["heads_kept"] = [tuple(h) for h in row["heads_kept"]]
        return cls(**data)
