"""One row of a sweep's table (:class:`CellResult`): what :mod:`circuits.sweep.run` records of each cell and
:mod:`circuits.sweep.table` shows. Torch-free."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from interventions.types import JsonDict

__all__ = ["CellResult"]


@dataclass
class CellResult:
    """One row of the sweep's table.

    ``status``: ``"ok"`` or ``"error"`` (then ``error`` says why). ``faithfulness``/``ci_low``/``ci_high``:
    of the selected configuration (search; ``selected`` is ``False`` when none reaches the threshold and
    the row shows the most faithful one), of the fixed configuration (fixed), the smallest per-block
    faithfulness (necessity, ``wait`` = that block) or the final answer probability (lens); ``faith_by_wait``: per
    wait, the best faithfulness evaluated (search);
    ``path``: the cell's run directory relative to the sweep's ``--out``.
    """

    model: str
    task: str
    ablation: str
    seed: int
    status: str = "ok"
    error: str | None = None
    base_accuracy: float | None = None
    n_prompts: int | None = None
    wait: int | None = None
    transfer: int | None = None
    faithfulness: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    faith_by_wait: dict[str, float] = field(default_factory=dict)
    path: str = ""
    selected: bool = False

    def to_dict(self) -> JsonDict:
        return asdict(self)
