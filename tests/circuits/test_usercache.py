"""The user's results cache (:mod:`circuits.store.usercache`): a second command on the same model and task fits no
means, the cached means are bit-identical to a fresh fit, a corrupted entry is detected and refitted, ``af1 cache
clear`` empties it, its size stays bounded and nothing is written beside ``--out``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from circuits import cli
from circuits.store import files, usercache

SEARCH = ["search", "--model", "arith-gpt2", "--task", "add_sub", "--n-prompts", "30", "--grid", "full",
          "--no-progress", "--out"]
PRUNE = ["prune", "--model", "arith-gpt2", "--task", "add_sub", "--n-prompts", "30", "--wait", "0", "--transfer", "1",
         "--no-progress", "--out"]


def entry_files(root: Path, kind: str = "means") -> list[Path]:
    return sorted((root / "results" / kind).glob("*" + usercache.DATA))


def test_a_second_command_fits_no_means_and_reuses_them_bit_identically(tmp_path, results_cache, counted, capsys):
    import interventions as iv
    from circuits.models.loading import load_model

    runs = tmp_path / "runs"
    runs.mkdir()
    assert cli.main([*SEARCH, str(runs / "a")]) == 0
    assert counted["MeanCache.fit"] == 1 and counted["filter_correct"] and counted["base_correct"] == 1
    first = capsys.readouterr().out.strip().splitlines()[-1]
    assert first.startswith("time: load ") and ", fit " in first and "whole command" in first, first
    [entry] = entry_files(results_cache)
    assert len(entry_files(results_cache, "prompts")) == 1
    for k in counted:
        counted[k] = 0
    assert cli.main([*PRUNE, str(runs / "b")]) == 0  # another command, same model, task and fit set
    out = capsys.readouterr().out
    # neither the means nor the prompt check are computed again
    assert counted == {"filter_correct": 0, "base_correct": 0, "draw_fit_set": 0, "MeanCache.fit": 0}
    assert "means: reused from the cache" in out and "checked by an earlier command" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("time: load ") and ", fit cached " in last, last
    # each run directory still records and binds the means it used: the same bytes as the cache's
    a, b = (iv.MeanCache.load(runs / d / files.MEANS) for d in ("a", "b"))
    assert a.sha256 == b.sha256
    for d in ("a", "b"):
        recorded = json.loads((runs / d / files.ARTIFACTS).read_text())[files.MEANS]
        assert recorded == hashlib.sha256((runs / d / files.MEANS).read_bytes()).hexdigest()
    # bit-identical to a fresh fit on the fit set the run recorded
    from safetensors.torch import load_file

    from circuits.means import fitted_on

    fit_tokens = load_file(runs / "b" / files.PREPARED)["fit_tokens"]
    assert fitted_on(b, fit_tokens)
    fresh = iv.MeanCache.fit(load_model("arith-gpt2"), fit_tokens, batch_size=128, progress=False)
    assert fresh.sha256 == b.sha256
    for name, t in fresh.tensors().items():
        assert t.dtype == b.tensors()[name].dtype and t.equal(b.tensors()[name]), name
    # nothing written beside the run directories, nothing outside the cache's results folder
    assert sorted(p.name for p in runs.iterdir()) == ["a", "b"]
    assert [p.name for p in results_cache.iterdir()] == ["results"]
    assert entry.exists()
    assert json.loads((runs / "a" / files.SUMMARY).read_text())["base_accuracy"] == \
        json.loads((runs / "b" / files.SUMMARY).read_text())["base_accuracy"]


def test_a_corrupted_entry_is_detected_refitted_and_replaced(tmp_path, results_cache, counted, capfd):
    assert cli.main([*SEARCH, str(tmp_path / "a")]) == 0
    [entry] = entry_files(results_cache)
    data = bytearray(entry.read_bytes())
    data[-5] ^= 0xFF  # one flipped bit in a mean
    entry.write_bytes(bytes(data))
    counted["MeanCache.fit"] = 0
    capfd.readouterr()
    assert cli.main([*SEARCH, str(tmp_path / "b")]) == 0
    err = capfd.readouterr().err
    assert "does not match its recorded hash" in err
    assert counted["MeanCache.fit"] == 1  # refitted
    import interventions as iv

    fresh, first = (iv.MeanCache.load(tmp_path / d / files.MEANS) for d in ("b", "a"))
    assert fresh.sha256 == first.sha256
    assert entry.read_bytes() != bytes(data)  # replaced by the fresh fit
    counted["MeanCache.fit"] = 0
    assert cli.main([*SEARCH, str(tmp_path / "c")]) == 0
    assert counted["MeanCache.fit"] == 0


def test_cache_list_and_clear(tmp_path, results_cache, capsys):
    assert cli.main(["cache", "list"]) == 0
    assert "empty" in capsys.readouterr().out
    assert cli.main([*SEARCH, str(tmp_path / "a")]) == 0
    capsys.readouterr()
    assert cli.main(["cache", "list"]) == 0
    listed = capsys.readouterr().out
    assert "means of arith-gpt2 on add_sub (10000 fit prompts), conditional" in listed and str(results_cache) in listed
    assert "prompts of arith-gpt2 on add_sub (30 of 90 checked, base accuracy 98.9%)" in listed
    assert cli.main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    assert not entry_files(results_cache) and not usercache.entries()


def test_the_cache_stays_under_its_bound_oldest_first(results_cache, monkeypatch):
    import os

    monkeypatch.setenv(usercache.LIMIT_ENV, str(2.5 / 1024))  # 2.5 KiB
    for i in range(4):
        assert usercache.put("means", {"i": i}, bytes([i]) * 1000, f"entry {i}") is not None
        path = usercache.entries()[-1].path.with_suffix(usercache.DESCRIPTION)
        os.utime(path, (1000 + i, 1000 + i))
    kept = usercache.entries()
    assert sum(e.size for e in kept) <= 2.5 * 1024 and len(kept) == 2
    assert usercache.get("means", {"i": 3}) == bytes([3]) * 1000 and usercache.get("means", {"i": 0}) is None
    monkeypatch.setenv(usercache.LIMIT_ENV, "0")  # off: nothing read or written
    assert usercache.get("means", {"i": 3}) is None and usercache.put("means", {"i": 9}, b"x", "x") is None
    monkeypatch.setenv(usercache.LIMIT_ENV, "lots")
    with pytest.raises(Exception, match="AF1_CACHE_LIMIT_MB='lots' is not a number"):
        usercache.limit_bytes()


def test_the_api_reuses_means_across_calls_and_logs_where_the_time_went(model, results_cache, counted, caplog):
    """Two ``search_af1`` calls of the Python API on the same model and fit set, without a directory: the second fits
    nothing and gets the same faithfulness; each call logs its time line (``fit`` then ``fit cached``)."""
    import logging

    import torch

    from circuits.search import search_af1
    from tests.conftest import disjoint_fit_tokens, random_tokens

    tokens = random_tokens(24, 6, seed=3, values=5)
    with torch.inference_mode():
        answers = model(tokens)[:, -1].argmax(-1)
    fit = disjoint_fit_tokens(tokens)
    with caplog.at_level(logging.INFO, logger="circuits"):
        first = search_af1(model, tokens, answers, fit_tokens=fit, grid="full", progress=False, n_boot=50)
        assert counted["MeanCache.fit"] == 1
        second = search_af1(model, tokens, answers, fit_tokens=fit, grid="full", progress=False, n_boot=50)
    assert counted["MeanCache.fit"] == 1  # the second call fitted nothing
    assert [r.faithfulness for r in first.results] == [r.faithfulness for r in second.results]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("time: ")]
    assert len(lines) == 2 and ", fit " in lines[0] and ", fit cached " in lines[1], lines
    assert "whole run" in lines[1]


def test_prompts_prepared_from_python_after_a_command_are_reloaded(tmp_path, results_cache, counted):
    """``PromptSpec(...).prepare(model)`` after ``af1 search`` on the same model and spec checks no prompt and draws
    no fit set: the same prompts and fit set, from the cache."""
    from safetensors.torch import load_file

    from circuits.models.loading import load_model
    from circuits.prompts.spec import PromptSpec

    assert cli.main([*SEARCH, str(tmp_path / "a")]) == 0
    for k in counted:
        counted[k] = 0
    p = PromptSpec("add_sub", n_prompts=30).prepare(load_model("arith-gpt2"), means="cama")
    assert counted["filter_correct"] == 0 and counted["draw_fit_set"] == 0
    kept = load_file(tmp_path / "a" / files.PREPARED)
    assert p.tokens.equal(kept["tokens"]) and p.fit.tokens.equal(kept["fit_tokens"])
    assert PromptSpec("add_sub", n_prompts=29).prepare(load_model("arith-gpt2"), means="cama") is not None
    assert counted["filter_correct"] > 0  # another spec: prepared anew


def test_a_warm_demo_checks_no_prompt_and_fits_no_means(tmp_path, results_cache, counted, capsys):
    """``af1 demo`` twice (another --out): the second reloads the prompts, their check and the means of both of its
    searches from the cache and finds the same faithfulness."""
    argv = ["demo", "--n-prompts", "20", "--no-progress", "--out"]
    assert cli.main([*argv, str(tmp_path / "cold")]) == 0
    cold = capsys.readouterr().out.strip().splitlines()[-1]
    assert counted["MeanCache.fit"] >= 1 and counted["filter_correct"] >= 1 and ", fit " in cold
    for k in counted:
        counted[k] = 0
    assert cli.main([*argv, str(tmp_path / "warm")]) == 0
    warm = capsys.readouterr().out.strip().splitlines()[-1]
    assert counted["MeanCache.fit"] == counted["filter_correct"] == counted["draw_fit_set"] == 0
    assert warm.startswith("time (3 runs): ") and ", fit cached " in warm, warm

    def faithfulness(d: str) -> list[float]:
        lines = (tmp_path / d / files.SEARCH_RESULTS).read_text().splitlines()
        return sorted(json.loads(x)["faithfulness"] for x in lines)

    assert faithfulness("cold") == faithfulness("warm")
