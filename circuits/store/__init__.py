"""Store: what a run leaves on disk, and how it is kept safe.

* :mod:`.files`: every file name of a run directory; :mod:`.atomic`: atomic writes that refuse links;
* :mod:`.runs`: a run directory (identity in ``run.json``, crash-safe JSONL records, artifacts);
* :mod:`.lock`: one process per directory; :mod:`.records`: record schemas checked on resume and load;
* :mod:`.outcomes`: per-prompt outcomes of a record; :mod:`.frames`: results as ``pandas`` frames.

May import: :mod:`circuits.errors` and the standard library (plus numpy/torch for hashes); nothing else of
:mod:`circuits`: every other folder may build on it.
"""
