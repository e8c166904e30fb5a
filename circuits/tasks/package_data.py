"""Where the task data is: the repository's top-level ``datasets/`` folder, shipped in the wheel as ``circuits/data/``.

:func:`data_dir` finds it through :mod:`importlib.resources` in an installed wheel (``circuits/data`` of the imported
package), through the ``circuits.data`` package an editable install maps to ``datasets/``, and, in a source checkout
run without installing, as ``datasets/`` beside the ``circuits`` folder. Paths are real :class:`~pathlib.Path`
objects: the resource itself where the package sits on the file system (every pip install), or, where it is
imported from a zip archive, a copy extracted once into a temporary folder (:func:`materialize`).

:func:`find_file` is the one rule by which every file option (``--task FILE``, ``--prompts FILE``, ``--config FILE``)
finds a file: as given from the working directory, else the same relative path in the data folder
(``examples/mul.toml``), else in the installed package (``circuits/sweep/examples/styles.toml``), so the README's
commands run alike in a checkout and from a wheel installed anywhere.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from importlib.resources.abc import Traversable

__all__ = ["data_dir", "datasets_dir", "find_file", "notebooks_dir", "package_path", "materialize"]


DATA = "data"
"""The data folder's name inside the installed package (``circuits/data``)."""
CHECKOUT = Path(__file__).resolve().parents[2] / "datasets"
"""The data folder of a source checkout (``<repository>/datasets``)."""
NOTEBOOKS = "notebooks"
"""The notebooks' folder: ``circuits/notebooks`` of a wheel, ``notebooks/`` of a checkout."""
DATASETS_ENV = "AF1_DATASETS_DIR"
"""Environment variable naming another data folder of the same layout."""
PACKAGE = "circuits"
"""The installed package's name: a relative path starting with it names a file shipped inside the package."""


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
def notebooks_dir() -> Path:
    """The folder of the example notebooks (``*.ipynb``): ``circuits/notebooks`` of an installed wheel, else a
    checkout's ``notebooks/``. ``FileNotFoundError`` (one line) when neither is there."""
    ref = resources.files(PACKAGE).joinpath(NOTEBOOKS)
    if ref.is_dir():
        return materialize(ref)
    checkout = CHECKOUT.parent / NOTEBOOKS
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("the notebooks (circuits/notebooks, or notebooks/ in a checkout) are missing from the "
                            "installed package; reinstall af1-circuits (pip install --force-reinstall)")


def datasets_dir() -> Path:
    """The data folder: ``$AF1_DATASETS_DIR`` if set, else :func:`data_dir` (``datasets/`` of a checkout,
    ``circuits/data`` of an installed wheel)."""
    env = os.environ.get(DATASETS_ENV)
    return Path(env) if env else data_dir()


def find_file(path: str | Path) -> Path:
    """The file a file option names, by one rule: ``path`` itself if it exists from the working directory (or is
    absolute), else the same relative path below the data folder (:func:`datasets_dir`: ``examples/mul.toml``),
    else, for a path starting with ``circuits/``, the file the installed package ships there
    (``circuits/sweep/examples/styles.toml``), else ``path`` as given (the caller's error then names it)."""
    p = Path(path).expanduser()
    if p.exists() or p.is_absolute():
        return p
    shipped = datasets_dir() / p
    if shipped.exists():
        return shipped
    if len(p.parts) > 1 and p.parts[0] == PACKAGE:
        ref = resources.files(PACKAGE).joinpath(*p.parts[1:])
        if ref.is_file() or ref.is_dir():
            return materialize(ref)
    return p


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
