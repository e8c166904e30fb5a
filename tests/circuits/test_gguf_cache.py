"""The GGUF conversion cache without a real checkpoint (the conversion itself, transformers dequantising
SmolLM2, is tested in ``tests/checkpoints/test_gguf.py``): a converted folder edited since it was written is
never used, and a GGUF file truncated inside its header or declaring absurd counts is one line
(docs/reliability.md, "Models, run directories and signals")."""

from __future__ import annotations

import logging
import shutil
import struct
import time
from pathlib import Path

import pytest

from circuits import cli
from circuits.errors import ModelLoadError
from circuits.models import gguf
from circuits.models.gguf_header import MAX_COUNT, check_header
from tests.circuits.test_reliability2 import one_line_error


def kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v


def kv_tokens(key: str, tokens: list[str]) -> bytes:
    k = key.encode()
    body = b"".join(struct.pack("<Q", len(t.encode())) + t.encode() for t in tokens)
    return struct.pack("<Q", len(k)) + k + struct.pack("<IIQ", 9, 8, len(tokens)) + body


def tensor_info(name: str, dims: tuple[int, ...], offset: int) -> bytes:
    n = name.encode()
    return (struct.pack("<Q", len(n)) + n + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", 0, offset))


def gguf_bytes(n_tensors: int | None = None, n_metadata: int | None = None, version: int = 3) -> bytes:
    """A small well-formed GGUF file (two metadata entries, one float32 tensor of 4 x 2), or one whose header
    declares other counts."""
    kvs = [kv_string("general.architecture", "llama"), kv_tokens("tokenizer.ggml.tokens", ["a", "bc", "<s>"])]
    infos = [tensor_info("token_embd.weight", (4, 2), 0)]
    head = struct.pack("<4sIQQ", b"GGUF", version, len(infos) if n_tensors is None else n_tensors,
                       len(kvs) if n_metadata is None else n_metadata)
    header = head + b"".join(kvs) + b"".join(infos)
    header += b"\0" * (-len(header) % 32)
    return header + struct.pack("<8f", *range(8))


def header_end() -> int:
    """Where the tensor infos of :func:`gguf_bytes` end (before the padding to 32 bytes)."""
    kvs = len(kv_string("general.architecture", "llama")) + len(kv_tokens("tokenizer.ggml.tokens", ["a", "bc", "<s>"]))
    return 24 + kvs + len(tensor_info("token_embd.weight", (4, 2), 0))



def count_hashes(monkeypatch) -> list[str]:
    """From now on, the names of the files ``gguf.file_sha256`` hashes, in order."""
    hashed: list[str] = []
    real_sha256 = gguf.file_sha256

    def counted(p):
        hashed.append(Path(p).name)
        return real_sha256(p)

    monkeypatch.setattr(gguf, "file_sha256", counted)
    return hashed

def test_the_header_walker_reads_a_well_formed_file(tmp_path):
    path = tmp_path / "ok.gguf"
    path.write_bytes(gguf_bytes())
    header = check_header(path)
    assert (header.version, header.n_tensors, header.n_metadata) == (3, 1, 2)
    assert header.header_bytes == header_end()


BAD = {
    "truncated inside the metadata": (lambda b: b[:60], "ok.gguf is truncated inside its header (60 bytes)"),
    "truncated inside a tensor info": (lambda b: b[:header_end() - 5], "is truncated inside its header"),
    "absurd tensor count": (lambda b: gguf_bytes(n_tensors=2**60), f"declares {2**60} tensors, more than its"),
    "tensor count beyond the bound": (lambda b: gguf_bytes(n_tensors=MAX_COUNT + 1), "tensors, more than its"),
    "absurd metadata count": (lambda b: gguf_bytes(n_metadata=2**40), "declares 1099511627776 metadata entries"),
    "metadata count one too many": (lambda b: gguf_bytes(n_metadata=3), "is truncated inside its header"),
    "not GGUF": (lambda b: b"PK\x03\x04" + b[4:], "is not a GGUF file: it starts with b'PK\\x03\\x04'"),
    "version 99": (lambda b: gguf_bytes(version=99), "GGUF version 99 is not one transformers reads"),
    "shorter than a header": (lambda b: b[:10], "is not a GGUF file: 10 bytes"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_gguf_file_with_a_broken_header_is_one_line(case, tmp_path, monkeypatch, capsys):
    """Before this check, transformers' reader failed with an internal error (a truncated header) or sized an
    allocation by the forged count."""
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    change, said = BAD[case]
    path = tmp_path / "ok.gguf"
    path.write_bytes(change(gguf_bytes()))

    def never(*_args: object) -> None:
        raise AssertionError("the reader was called")

    monkeypatch.setattr(gguf, "write_folder", never)
    with pytest.raises(ModelLoadError) as caught:
        gguf.hf_folder(path)
    assert said in str(caught.value) and "\n" not in str(caught.value)
    out = tmp_path / "run"
    code = cli.main(["search", "--model", str(path), "--task", "add", "--n-prompts", "4", "--out", str(out),
                     "--no-progress"])
    one_line_error(capsys, code, said)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def fake_writer(weights: bytes):
    """A stand-in for :func:`circuits.models.gguf.write_folder`: a config and ``weights``; ``calls`` counts uses."""
    def write(_gguf_path: Path, folder: Path) -> None:
        write.calls += 1  # type: ignore[attr-defined]
        (Path(folder) / "config.json").write_text('{"model_type": "llama"}')
        (Path(folder) / "model.safetensors").write_bytes(weights)
    write.calls = 0  # type: ignore[attr-defined]
    return write


def test_a_converted_folder_edited_since_is_converted_again_with_one_warning(tmp_path, monkeypatch, caplog):
    """A same-size edit of the cached weights was used as they were (base accuracy 68.3% -> 31.2%, exit 0)."""
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "require_gguf", lambda _path: None)
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes())
    weights = bytes(range(256)) * 64
    writer = fake_writer(weights)
    monkeypatch.setattr(gguf, "write_folder", writer)
    folder = gguf.hf_folder(path)
    hashed = count_hashes(monkeypatch)
    assert writer.calls == 1 and gguf.hf_folder(path) == folder and writer.calls == 1  # a hit ...
    assert hashed == ["m.gguf"]  # ... reads the GGUF file's hash only: the folder's files are as recorded
    time.sleep(0.05)  # past the file system's timestamp granularity: the edit below moves the change time
    tampered = bytearray(weights)
    tampered[1000:1004] = b"\x7f\x7f\x7f\x7f"  # same size, other content
    (folder / "model.safetensors").write_bytes(bytes(tampered))
    assert gguf.folder_problem(folder, gguf.file_sha256(path)) == (
        "model.safetensors was changed since it was written (its SHA-256 differs from the recorded one)")
    with caplog.at_level(logging.WARNING, logger="circuits"):
        assert gguf.hf_folder(path) == folder
    assert writer.calls == 2 and (folder / "model.safetensors").read_bytes() == weights
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "model.safetensors was changed since it was written" in warned[0] \
        and "converting m.gguf again" in warned[0] and "\n" not in warned[0]
    (folder / "config.json").unlink()  # a listed file removed: converted again as well
    assert gguf.hf_folder(path) == folder and writer.calls == 3


def test_a_folder_of_the_format_without_hashes_is_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "require_gguf", lambda _path: None)
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes())
    writer = fake_writer(b"w" * 100)
    monkeypatch.setattr(gguf, "write_folder", writer)
    folder = gguf.hf_folder(path)
    import json

    marker = json.loads((folder / gguf.MARKER).read_text())
    old = {k: v for k, v in marker.items() if k != "sha256s"} | {"format": 1}
    (folder / gguf.MARKER).write_text(json.dumps(old))
    assert "another release" in str(gguf.folder_problem(folder, marker["sha256"]))
    gguf.hf_folder(path)
    assert writer.calls == 2 and json.loads((folder / gguf.MARKER).read_text())["format"] == gguf.FORMAT


def test_a_copied_cache_is_hashed_once_then_hit_cheaply(tmp_path, monkeypatch):
    """A cache copied elsewhere (new inodes and change times) is hashed in full once, its new stamps recorded;
    the next hit reads no file again."""
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gguf, "require_gguf", lambda _path: None)
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes())
    monkeypatch.setattr(gguf, "write_folder", fake_writer(b"w" * 4096))
    gguf.hf_folder(path)
    shutil.copytree(tmp_path / "cache", tmp_path / "copy")
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "copy"))
    hashed = count_hashes(monkeypatch)
    gguf.hf_folder(path)
    assert sorted(hashed) == ["config.json", "m.gguf", "model.safetensors"]
    hashed.clear()
    gguf.hf_folder(path)
    assert hashed == ["m.gguf"]
