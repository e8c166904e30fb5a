"""File names of run directories, in one place (every command writes ``run.json`` first)."""

IDENTITY = "run.json"
ARTIFACTS = "artifacts.json"
LOCK = ".lock"
PROMPTS = "prompts.jsonl"
MEANS = "means.safetensors"
PREPARED = "prepared.safetensors"
"""The run's prepared prompts and fit set (:mod:`circuits.prepared`), reloaded by a rerun."""
SUMMARY = "summary.json"
REPORT = "report.html"

SEARCH_RESULTS = "results.jsonl"
NECESSITY_RESULTS = "necessity.jsonl"
NECESSITY_SUMMARY = "necessity.json"
PRUNE_CURVE = "curve.jsonl"
LENS = "lens.json"
LENS_ARRAYS = "lens.npz"
"""The per-prompt arrays of ``af1 lens`` (what :meth:`circuits.lens.LensResult.load` reads back)."""
NO_RESULTS = ".no-results.jsonl"
"""Placeholder results name of analyses without resumable records (never written)."""

RESULT_FILES = frozenset({
    PROMPTS, MEANS, PREPARED, SUMMARY, REPORT, SEARCH_RESULTS, NECESSITY_RESULTS, NECESSITY_SUMMARY, PRUNE_CURVE, LENS, LENS_ARRAYS,
})
"""Files only af1 writes: a directory holding any of them without ``run.json`` is refused."""
