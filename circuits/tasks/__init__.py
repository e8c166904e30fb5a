"""Tasks: what a prompt of a task is, before any model is involved.

* :mod:`.catalogue`: the shipped catalogue and tasks of one's own (``TaskSpec``, ``build_task``, frozen sets,
  layouts); its public names are importable from here (``circuits.tasks.build_task``, imported on first use);
* :mod:`.files`: task files (TOML/JSON) read and checked; :mod:`.expressions`: answer expressions, bounded and
  evaluated exactly; :mod:`.operand_space`: a task's operand tuples in seeded
  order; :mod:`.package_data`: where the data folder is (``datasets/`` of a checkout, ``circuits/data`` of a wheel);
* :mod:`.tokens`, :mod:`.checks`, :mod:`.digits`: numbers and answers as tokens of a tokenizer; :mod:`.formats`:
  few-shot and chat formats.

May import: :mod:`circuits.errors`, :mod:`circuits.tasks.inputs`, :mod:`circuits.vocab`, :mod:`circuits.validation`,
:mod:`circuits.logs` and (for token checks) :mod:`interventions`; nothing of models, prompts, store or the analyses.
"""

import importlib


def __getattr__(name: str) -> object:
    """A name of :mod:`.catalogue` (the former ``circuits.tasks`` module), imported on first use (numpy and the
    catalogue only then: the command line's flags import this package's formats)."""
    catalogue = importlib.import_module("circuits.tasks.catalogue")
    if not name.startswith("__") and hasattr(catalogue, name):
        return getattr(catalogue, name)
    try:
        return importlib.import_module(f"circuits.tasks.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module 'circuits.tasks' has no attribute {name!r}") from None
