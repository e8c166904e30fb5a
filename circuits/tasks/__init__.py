"""Tasks: what a prompt of a task is, before any model is involved.

* :mod:`.catalogue`: the shipped catalogue and tasks of one's own (``TaskSpec``, ``build_task``, frozen sets,
  layouts); its public names are importable from here (``circuits.tasks.build_task``);
* :mod:`.files`: task files (TOML/JSON) read and checked; :mod:`.operand_space`: a task's operand tuples in seeded
  order; :mod:`.package_data`: where the data folder is (``datasets/`` of a checkout, ``circuits/data`` of a wheel);
* :mod:`.tokens`, :mod:`.checks`, :mod:`.digits`: numbers and answers as tokens of a tokenizer; :mod:`.formats`:
  few-shot and chat formats.

May import: :mod:`circuits.errors`, :mod:`circuits.vocab`, :mod:`circuits.validation`, :mod:`circuits.logs` and
(for token checks) :mod:`interventions`; nothing of models, prompts, store or the analyses.
"""

from circuits.tasks.catalogue import *  # noqa: F403  (the catalogue's public names, as before the move)
from circuits.tasks.catalogue import __all__  # noqa: F401
