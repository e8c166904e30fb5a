"""``af1 sweep``: the paper's comparison tables (models x tasks x ablations x seeds) in one resumable
command. Every cell is an ordinary run directory (the files of ``af1 search``), so a cell can be reopened
alone; see :mod:`circuits.sweep.config` for the TOML format."""

from circuits.sweep.config import Cell, SweepConfig
from circuits.sweep.run import CellResult, SweepResult, run_sweep

__all__ = ["Cell", "CellResult", "SweepConfig", "SweepResult", "run_sweep"]
