"""Where the task data is: the repository's top-level ``datasets/`` folder, shipped in the wheel as ``circuits/data/``.

:func:`data_dir` finds it through :mod:`importlib.resources` in an installed wheel (``circuits/data`` of the imported
package), through the ``circuits.data`` package an editable install maps to ``datasets/``, and, in a source checkout
run without installing, as ``datasets/`` beside the ``circuits`` folder. Paths are real :class:`~pathlib.Path`
objects: the resource itself where the package sits on the file system (every pip install), or, where it is
imported from a zip archive, a copy extracted once into a temporary folder (:func:`materialize`).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from importlib.resources.abc import Traversable

__all__ = ["data_dir", "package_path", "materialize"]


DATA = "data"
"""The data folder's name inside the installed package (``circuits/data``)."""
CHECKOUT = Path(__file__).resolve().parents[2] / "datasets"
"""The data folder of a source checkout (``<repository>/datasets``)."""


@cache
def data_dir() -> Path:
    """The task data folder (``tasks/``, ``frozen/``, ``examples/``): the installed package's ``circuits/data``, the
    ``circuits.data`` package of an editable install, or a checkout's ``datasets/``. ``FileNotFoundError`` (one line)
    when none is there."""
    ref = resources.files("circuits").joinpath(DATA)
    if ref.is_dir():
        return materialize(ref)
    try:
        mapped = resources.files("circuits.data")
    except (ModuleNotFoundError, TypeError):  # no such package: not an install that maps it
        mapped = None
    if mapped is not None and mapped.joinpath("tasks").is_dir():
        return materialize(mapped)
    if (CHECKOUT / "tasks").is_dir():
        return CHECKOUT
    raise FileNotFoundError("the task data (circuits/data, or datasets/ in a checkout) is missing from the installed "
                            "package; reinstall af1-circuits (pip install --force-reinstall) or set AF1_DATASETS_DIR "
                            "to a copy of the data folder")


@cache
def package_path(*parts: str) -> Path:
    """A file-system path to ``circuits/<parts...>`` of the imported package, e.g. ``package_path("data")``.

    ``FileNotFoundError`` (one line, naming the missing resource) if the package does not ship it."""
    ref = resources.files("circuits").joinpath(*parts)
    if not (ref.is_dir() or ref.is_file()):
        raise FileNotFoundError(
            f"circuits/{'/'.join(parts)} is missing from the installed package; reinstall af1-circuits "
            "(pip install --force-reinstall) or set AF1_DATASETS_DIR to a copy of the data folder")
    return materialize(ref)


def materialize(ref: Traversable) -> Path:
    """``ref`` as a real :class:`Path`: itself if it already is one, else a copy (file or whole folder)
    extracted into a temporary folder that is removed when the interpreter exits."""
    if isinstance(ref, Path):
        return ref
    tmp = Path(tempfile.mkdtemp(prefix="af1-data-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    dest = tmp / ref.name
    _copy(ref, dest)
    return dest


def _copy(ref: Traversable, dest: Path) -> None:
    if ref.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        for child in ref.iterdir():
            _copy(child, dest / child.name)
    else:
        dest.write_bytes(ref.read_bytes())
