"""File names of run directories, in one place (every command writes ``run.json`` first): nothing else in the
package spells them."""

IDENTITY = "run.json"
"""The run's identity (:mod:`circuits.store.runs`); it also names that identity's hash in ``artifacts.json``."""
ARTIFACTS = "artifacts.json"
LOCK = ".lock"
PROMPTS = "prompts.jsonl"
MEANS = "means.safetensors"
PREPARED = "prepared.safetensors"
"""The run's prepared prompts and fit set (:mod:`circuits.prompts.prepared`), reloaded by a rerun."""
SUMMARY = "summary.json"
REPORT = "report.html"

SEARCH_RESULTS = "results.jsonl"
NECESSITY_RESULTS = "necessity.jsonl"
NECESSITY_SUMMARY = "necessity.json"
PRUNE_CURVE = "curve.jsonl"
LENS = "lens.json"
LENS_ARRAYS = "lens.npz"
"""The per-prompt arrays of ``af1 lens`` (what :meth:`circuits.lens.LensResult.load` reads back)."""
EDGES = "edges.json"
EDGES_ARRAYS = "edges.npz"
MIB = "mib.json"
"""``af1 edges``: its summary, one row per edge, the scores in MIB's circuit-track format."""
SWEEP_CELLS = "cells.jsonl"
"""One line per finished sweep cell (:mod:`circuits.sweep.run`)."""
CELLS_DIR = "cells"
"""The folder of a sweep's cell run directories (``cells/<model>/<task>/<ablation>-seed<seed>``)."""
RUNS_DIR = "runs"
"""The folder of ``af1 groundtruth``'s run directories (``runs/<model>/<task>/<ablation>/{search,prune}``)."""
FIGURES_DIR = "figures"
"""The folder of a report's standalone figures (``figures/*.svg``)."""
TABLE_CSV = "table.csv"
TABLE_MD = "table.md"
"""The comparison tables of ``af1 sweep`` and ``af1 groundtruth``."""
NO_RESULTS = ".no-results.jsonl"
"""Placeholder results name of analyses without resumable records (never written)."""

RESULT_FILES = frozenset({
    PROMPTS, MEANS, PREPARED, SUMMARY, REPORT, SEARCH_RESULTS, NECESSITY_RESULTS, NECESSITY_SUMMARY, PRUNE_CURVE, LENS,
    LENS_ARRAYS, EDGES, EDGES_ARRAYS, MIB,
})
"""Files only af1 writes: a directory holding any of them without ``run.json`` is refused."""
