"""The second reliability round (docs/reliability.md): nothing written outside ``--out``, nothing resumed
that this run did not write, and crafted inputs answered in one line with exit code 2."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import interventions as iv
from circuits import cli
from circuits.errors import ArgumentError, CorruptRunError, RunDirError, RunMismatchError
from circuits.prompts.fitset import FitSet
from circuits.prompts.sampling import self_answer_prompts
from circuits.search import search_af1
from circuits.store import atomic, files
from tests.conftest import build_default, disjoint_fit_tokens, random_tokens

ZOO = ["--model", "arith-gpt2", "--task", "add_sub", "--no-progress"]


def snapshot(path: Path) -> dict[str, bytes] | None:
    if not path.exists():
        return None
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def one_line_error(capsys, code: int, *expected: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, err
    for e in expected:
        assert e in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def tiny():
    model = build_default("gpt2")
    tokens = random_tokens(40, 6, seed=4, values=5)
    prompts = self_answer_prompts(model, tokens, task="random")
    return model, replace(prompts, fit=FitSet.given(disjoint_fit_tokens(tokens)))


def search(tiny, out: Path, n: int | None = None, model=None):
    m, p = tiny
    return search_af1(model or m, p.tokens[:n], p.answers[:n], fit=p.fit, out_dir=out, grid="full", progress=False,
                      n_boot=50)


@pytest.fixture
def finished(tiny, tmp_path):
    out = tmp_path / "run"
    search(tiny, out)
    return out


# --- 1. nothing written outside the run directory ------------------------------------------------------
def test_a_results_file_that_is_a_link_is_refused(finished, tiny, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"line one\nno trailing newline")
    (finished / files.SEARCH_RESULTS).unlink()
    (finished / files.SEARCH_RESULTS).symlink_to(victim)
    with pytest.raises(RunDirError, match=rf"{files.SEARCH_RESULTS} is a symbolic link"):
        search(tiny, finished)
    assert victim.read_bytes() == b"line one\nno trailing newline"


def test_the_record_functions_never_follow_a_link(tmp_path):
    from circuits.store.runs import append_line, read_jsonl

    victim = tmp_path / "victim.jsonl"
    victim.write_bytes(b'{"a": 1}\n{"torn"')
    link = tmp_path / "results.jsonl"
    link.symlink_to(victim)
    with pytest.raises(RunDirError, match="is a symbolic link"):
        read_jsonl(link, repair=True)
    with pytest.raises(RunDirError, match="is a symbolic link"):
        append_line(link, {"b": 2})
    assert victim.read_bytes() == b'{"a": 1}\n{"torn"'


@pytest.mark.parametrize("planted", [".report.html.tmp", ".summary.json.tmp12345", "figures"])
def test_a_run_directory_holding_links_is_refused(finished, tiny, tmp_path, planted):
    """The fixed temporary names of earlier versions, planted as links to a file elsewhere: refused, the file
    elsewhere untouched."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (finished / planted).symlink_to(victim)
    before = snapshot(finished)
    with pytest.raises(RunDirError, match=rf"{planted} is a symbolic link"):
        search(tiny, finished)
    assert victim.read_text() == "precious" and snapshot(finished) == before


def test_atomic_writes_use_exclusive_unpredictable_names_and_refuse_links(tmp_path, monkeypatch):
    from circuits.report import write_text
    from circuits.store.runs import write_json

    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".report.html.tmp").symlink_to(victim)  # the old fixed name: no longer used
    names = []
    real = atomic.tempfile.mkstemp

    def spy(*a, **k):
        fd, name = real(*a, **k)
        names.append(Path(name))
        return fd, name

    monkeypatch.setattr(atomic.tempfile, "mkstemp", spy)
    write_text(out / "report.html", "<html></html>")
    write_text(out / "report.html", "<html>2</html>")
    write_json(out / "summary.json", {"a": 1})
    assert victim.read_text() == "precious"
    assert (out / "report.html").read_text() == "<html>2</html>" and not (out / "report.html").is_symlink()
    assert len({n.name for n in names}) == 3 and all(n.parent == out and n.name.endswith(atomic.TMP_SUFFIX)
                                                     for n in names)
    assert not any(n.exists() for n in names)
    (out / "table.md").symlink_to(victim)
    with pytest.raises(RunDirError, match="table.md is a symbolic link"):
        write_text(out / "table.md", "x")
    assert victim.read_text() == "precious"


def test_leftover_temporary_files_are_cleaned_on_the_next_run(finished, tiny):
    left = [finished / f".summary.json.tmp{12345}", finished / ".report.html.tmp",
            finished / f".report.html.abc123{atomic.TMP_SUFFIX}"]
    for p in left:
        p.write_text("half")
    search(tiny, finished)
    assert not any(p.exists() for p in left)


def test_data_names_that_would_leave_out_are_refused(tmp_path):
    from circuits.sweep import SweepConfig, run_sweep
    from circuits.sweep.config import Cell
    from circuits.sweep.run import cell_folder

    for cell in (Cell("arith-gpt2", "../../escape", "zero", 0), Cell("..", "add", "zero", 0),
                 Cell("arith-gpt2", "add", "../zero", 0)):
        with pytest.raises(ArgumentError, match="cannot name a folder"):
            cell_folder(tmp_path, cell)
    config = SweepConfig(models=("arith-gpt2",), tasks=("../../escape",), ablations=("zero",))  # not validated
    with pytest.raises(ArgumentError, match="task '../../escape' cannot name a folder"):
        run_sweep(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape").exists()


def test_an_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    from circuits.runner import Run

    monkeypatch.chdir(tmp_path)
    for argv in (["search", *ZOO, "--out", ""], ["sweep", "--models", "arith-gpt2", "--tasks", "add", "--out", ""],
                 ["groundtruth", "--out", ""], ["lens", "--model", "arith-gpt2", "--task", "add", "--out", ""]):
        one_line_error(capsys, cli.main(argv), "--out must be a non-empty path")
    with pytest.raises(ArgumentError, match="--out must be a non-empty path"):
        Run("", "search")
    assert list(tmp_path.iterdir()) == []


# --- 2. groundtruth takes the lock and writes the run identity --------------------------------------------
def test_groundtruth_into_another_commands_directory_is_refused(tmp_path, capsys):
    out = tmp_path / "search"
    out.mkdir()
    (out / files.IDENTITY).write_text(json.dumps({"model": "arith-gpt2", "threshold": 0.9}))
    (out / files.SUMMARY).write_text('{"theirs": true}')
    (out / files.REPORT).write_text("<html>theirs</html>")
    before = snapshot(out)
    one_line_error(capsys, cli.main(["groundtruth", "--models", "arith-gpt2-gt-w2t2", "--n-prompts", "10",
                                     "--no-progress", "--out", str(out)]), "different command (`af1 search`")
    assert snapshot(out) == before


def test_groundtruth_holds_the_lock_and_writes_its_identity(tmp_path, capsys, monkeypatch):
    from circuits.groundtruth import recovery as groundtruth
    from circuits.store.lock import DirLock

    out = tmp_path / "gt"
    out.mkdir()
    with DirLock(out):
        one_line_error(capsys, cli.main(["groundtruth", "--models", "arith-gpt2-gt-w2t2", "--no-progress",
                                         "--out", str(out)]), "in use by another af1 command")
    monkeypatch.setattr(groundtruth, "_run_all", lambda **kw: [])
    groundtruth.run_recovery(models=["arith-gpt2-gt-w2t2"], out_dir=out)
    ident = json.loads((out / files.IDENTITY).read_text())
    assert ident["analysis"] == "groundtruth" and ident["models"] == ["arith-gpt2-gt-w2t2"]
    with pytest.raises(RunMismatchError, match="n_prompts: 200 -> 50"):
        groundtruth.run_recovery(models=["arith-gpt2-gt-w2t2"], out_dir=out, n_prompts=50)


# --- 3. resume only what this run wrote ------------------------------------------------------------------
def test_foreign_means_of_a_superset_run_with_its_artifacts_are_refused(tiny, tmp_path):
    """Another run on a superset of the prompts with the same fit set: its means are those of the same fit
    prompts, but artifacts.json binds them to that run's identity."""
    small, big = tmp_path / "small", tmp_path / "big"
    search(tiny, small, n=20)
    search(tiny, big)
    lines = (small / files.SEARCH_RESULTS).read_text().splitlines(keepends=True)
    (small / files.SEARCH_RESULTS).write_text("".join(lines[:5]))
    for name in (files.MEANS, files.ARTIFACTS):
        shutil.copy(big / name, small / name)
    with pytest.raises(CorruptRunError, match="written by another run"):
        search(tiny, small, n=20)


def rewrite(out: Path, index: int, **change) -> None:
    path = out / files.SEARCH_RESULTS
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[index].update(change)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("change,expected", [
    ({"faithfulness": 0.95, "n_faithful": 1, "ci_low": 0.0, "ci_high": 0.075},
     r"line 3: field 'faithfulness' = 0\.95 is not n_faithful / n = 1/"),
    ("consistent count, far interval", r"line 3: field 'ci_low' .* further from faithfulness"),
    ("outside its interval", r"line 3: field 'faithfulness' .* lies outside its interval"),
])
def test_a_forged_record_is_refused_naming_file_and_line(finished, tiny, change, expected):
    n = json.loads((finished / files.SEARCH_RESULTS).read_text().splitlines()[2])["n"]
    if change == "consistent count, far interval":
        k = round(0.95 * n)
        change = {"faithfulness": k / n, "n_faithful": k, "ci_low": 0.0, "ci_high": 1.0}
    elif change == "outside its interval":
        k = n // 2
        change = {"faithfulness": k / n, "n_faithful": k, "ci_low": 0.6, "ci_high": 0.7}
    rewrite(finished, 2, **change)
    with pytest.raises(CorruptRunError, match=rf"{files.SEARCH_RESULTS}, {expected}"):
        search(tiny, finished)


def test_an_edited_model_does_not_resume_the_unedited_models_results(tmp_path, tiny):
    model = build_default("gpt2")
    _, p = tiny
    out = tmp_path / "run"
    search((model, p), out)
    with torch.no_grad():
        model.blocks[1].mlp.W_out[3, 5] += 0.25  # the embedding (the old fingerprint) is unchanged
    with pytest.raises(RunMismatchError, match=r"model_signature\.weights_sha256"):
        search((model, p), out)


def test_the_weights_hash_covers_every_tensor_and_is_cached():
    model = build_default("gpt2")
    ad = iv.adapt(model)
    first = ad.weights_sha256()
    assert ad.weights_sha256() == first and len(first) == 64
    with torch.no_grad():
        model.blocks[0].ln1.w[0] += 1e-3
    assert ad.weights_sha256() != first


# --- 4. crafted inputs: one line, exit code 2 -----------------------------------------------------------
def crafted(source: Path, target: Path, *, drop: str | None = None, meta: dict | None = None,
            change: dict | None = None) -> Path:
    from safetensors import safe_open

    with safe_open(str(source), framework="pt") as f:
        metadata = dict(f.metadata())
    tensors = load_file(str(source))
    if drop in tensors:
        del tensors[drop]
    if drop in metadata:
        del metadata[drop]
    metadata.pop("sha256", None)
    metadata.update(meta or {})
    tensors.update(change or {})
    save_file(tensors, str(target), metadata=metadata)
    return target


@pytest.mark.parametrize("how,expected", [
    (dict(drop="n_prompts"), "metadata n_prompts = None is not an integer"),
    (dict(drop="z_mean"), "tensor(s) z_mean missing"),
    (dict(change={"pos_mean": torch.zeros(2, 3)}), "tensor pos_mean has shape [2, 3]"),
    (dict(change={"cond_mean": torch.zeros(1, 1, 1)}), "tensor cond_mean has shape [1, 1, 1]"),
    (dict(change={"entry_tok": "huge"}), "entry_tok holds token ids outside"),
    (dict(meta={"model_signature": "{not json"}), "model_signature is missing or not JSON"),
])
def test_crafted_means_files_are_one_line(finished, tmp_path, how, expected):
    if how.get("change", {}).get("entry_tok") == "huge":
        tok = load_file(str(finished / files.MEANS))["entry_tok"].clone()
        tok[0] = 2**40
        how = dict(change={"entry_tok": tok})
    path = crafted(finished / files.MEANS, tmp_path / "crafted.safetensors", **how)
    with pytest.raises(ValueError) as err:
        iv.MeanCache.load(path)
    message, code = cli.describe(err.value)
    assert code == 2 and str(path) in message and expected in message, message


def test_a_tasks_file_without_tasks_or_malformed_is_named(tmp_path, capsys, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("AF1_DATASETS_DIR", str(data))
    for text, expected in (('{"other": []}', "missing field 'tasks'"), ("{not json", "malformed"),
                           ('{"tasks": [{"name": "x"}]}', "missing field 'template'")):
        (data / "tasks.json").write_text(text)
        from circuits.tasks import catalogue as tasks

        tasks._load_specs.cache_clear()
        one_line_error(capsys, cli.main(["search", *ZOO, "--out", str(tmp_path / "o")]),
                       str(data / "tasks.json"), expected)
    tasks._load_specs.cache_clear()


def absurd_model_folder(tmp_path: Path) -> Path:
    """A copy of a zoo model folder whose config.json asks for 4096 blocks of width 65536."""
    from circuits import zoo

    folder = tmp_path / "huge"
    shutil.copytree(zoo.model_dir("arith-gpt2"), folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(n_layer=4096, n_embd=65536)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_model_config_asking_for_absurd_sizes_is_refused_before_allocating(tmp_path):
    from circuits import zoo

    folder = absurd_model_folder(tmp_path)
    with pytest.raises(ValueError, match=r"config\.json asks for at least .* GB of float32 weights") as err:
        zoo.load_dir(folder)
    assert cli.describe(err.value)[1] == 2


def test_nnsight_missing_is_one_line(monkeypatch, capsys, tmp_path):
    from interventions.backends.nnsight import require_nnsight

    monkeypatch.setitem(sys.modules, "nnsight", None)
    with pytest.raises(ImportError, match="needs the nnsight package") as err:
        require_nnsight()
    assert isinstance(err.value, ValueError) and cli.describe(err.value)[1] == 2
    one_line_error(capsys, cli.main(["search", *ZOO, "--backend", "nnsight", "--n-prompts", "10", "--out",
                                     str(tmp_path / "o")]), "nnsight")


def test_a_huge_integer_in_a_result_line_names_file_and_line(finished, tiny):
    path = finished / files.SEARCH_RESULTS
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(1, '{"wait": ' + "9" * 5000 + "}\n")
    path.write_text("".join(lines))
    with pytest.raises(CorruptRunError, match=rf"{files.SEARCH_RESULTS}, line 2: .*digits"):
        search(tiny, finished)


def test_a_non_utf8_sweep_config_is_named(tmp_path, capsys):
    config = tmp_path / "sweep.toml"
    config.write_bytes(b'[sweep]\nmodels = ["arith-gpt2"]\ntasks = ["add\xff"]\n')
    one_line_error(capsys, cli.main(["sweep", "--config", str(config), "--out", str(tmp_path / "o")]),
                   f"--config {config} is not UTF-8")


@pytest.mark.parametrize("line,expected", [
    ('n_prompts = "20"', "sweep key n_prompts = '20' must be an integer"),
    ("n_prompts = true", "sweep key n_prompts = True must be an integer"),
    ('ablations = ["zero", "zero"]', "sweep key ablations repeats 'zero'"),
    ('tasks = ["add", "add"]', "sweep key tasks repeats 'add'"),
    ('dtype = "float8"', "sweep key dtype = 'float8' is not valid"),
    ("seeds = [1.5]", "sweep key seeds must hold integers, found 1.5"),
    ("seeds = [-1]", "seeds are integers >= 0"),
    ('threshold = "0.9"', "sweep key threshold = '0.9' must be a number"),
    ('lens = "yes"', "sweep key lens = 'yes' must be true or false"),
    ("batch_size = 12.5", "sweep key batch_size = 12.5 must be an integer"),
    ("sweep = 3", "sweep must be a [sweep] table"),
])
def test_sweep_values_are_type_checked_before_anything_runs(tmp_path, capsys, line, expected):
    config = tmp_path / "sweep.toml"
    keys = {"models": '["arith-gpt2"]', "tasks": '["add"]', "ablations": '["zero"]'}
    key, value = (part.strip() for part in line.split("=", 1))
    if key == "sweep":
        config.write_text(line + "\n")
    else:
        keys[key] = value
        config.write_text("[sweep]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()))
    out = tmp_path / "o"
    one_line_error(capsys, cli.main(["sweep", "--config", str(config), "--no-progress", "--out", str(out)]), expected)
    assert not out.exists()  # no run.json left to refuse the corrected config


@pytest.mark.parametrize("argv,expected", [
    (["search", *ZOO, "--n-prompts", "30000"], "--n-prompts 30000 exceeds --max-checked 20000"),
    (["search", *ZOO, "--n-prompts", "50", "--max-checked", "40"], "--n-prompts 50 exceeds --max-checked 40"),
    (["search", *ZOO, "--seed", "-1"], "--seed -1 is out of range"),
    (["zoo", "eval", "arith-gpt2", "-n", "-290"], "-n -290 is out of range"),
])
def test_flags_refused_before_loading(argv, expected, tmp_path, capsys):
    if argv[0] != "zoo":
        argv = [*argv, "--out", str(tmp_path / "o")]
    one_line_error(capsys, cli.main(argv), expected)
    assert not (tmp_path / "o").exists()


def test_a_full_disk_while_saving_means_is_reported_as_such(finished, monkeypatch):
    from circuits.means import keep_means
    from circuits.store.runs import RunDir

    cache = iv.MeanCache.load(finished / files.MEANS)
    (finished / files.MEANS).unlink()

    def full(self, path):
        raise RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: \"No space "
                           "left on device\" })")

    monkeypatch.setattr(iv.MeanCache, "save", full)
    run_dir = RunDir(finished, json.loads((finished / files.IDENTITY).read_text()), results_name=files.SEARCH_RESULTS)
    with pytest.raises(OSError) as err:
        keep_means(run_dir, cache)
    message, code = cli.describe(err.value)
    assert code == 2 and str(finished / files.MEANS) in message and "No space left on device" in message
    assert "corrupt" not in message
    assert not list(finished.glob(f"*{atomic.TMP_SUFFIX}")) and not (finished / files.MEANS).exists()


def test_a_read_only_file_system_does_not_mask_the_error_as_a_lock_failure(tmp_path, monkeypatch):
    from circuits.store.lock import DirLock

    lock = DirLock(tmp_path).acquire()

    def read_only(self, missing_ok=False):
        raise OSError(30, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    lock.release()  # no error: the flock is released with the descriptor
    monkeypatch.undo()
    DirLock(tmp_path).acquire().release()


def test_lens_killed_between_its_outputs_resumes(tmp_path, capsys):
    out = tmp_path / "lens"
    argv = ["lens", "--model", "arith-gpt2", "--task", "add", "--n-prompts", "8", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    (out / files.REPORT).unlink()  # killed after lens.json
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert (out / files.REPORT).exists()
    capsys.readouterr()
    one_line_error(capsys, cli.main(argv), "lens.json exists")  # a finished run still needs --force


def test_an_intervention_spec_with_an_unknown_field_or_an_unchecked_cache_is_refused(finished):
    from interventions.types import InterventionError

    spec = {"type": "Peek", "layers": [0], "bogus": 1}
    with pytest.raises(InterventionError, match="unknown field.*bogus"):
        iv.Intervention.from_dict(spec)
    assert iv.CAMA  # registered on import
    cama = {"type": "CAMA", "layer": 0, "cache": {"path": str(finished / files.MEANS)}}
    with pytest.raises(InterventionError, match="without its sha256"):
        iv.Intervention.from_dict(cama)
