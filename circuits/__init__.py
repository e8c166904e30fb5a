"""Circuit discovery on top of :mod:`interventions`: tasks, model zoo, faithfulness, AF1 search,
head pruning, early decoding and the ``af1`` command line."""

__version__ = "0.1.0"
