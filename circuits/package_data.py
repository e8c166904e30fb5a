"""Files shipped inside the ``circuits`` package (task catalogue, frozen sets), found via importlib.resources.

The data lives in the package itself (``circuits/data/``), so it is found the same way in a source
checkout, an editable install and an installed wheel. :func:`package_path` returns a real
:class:`~pathlib.Path`: the resource itself where the package sits on the file system (every pip
install), or, where it is imported from a zip archive, a copy extracted once into a temporary folder.
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

__all__ = ["package_path", "materialize"]


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
