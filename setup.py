"""The packages of the distribution: ``interventions`` and ``circuits`` with their subpackages, and ``circuits.data``,
which ``pyproject.toml`` maps to the top-level ``datasets/`` folder (the task data: tasks, frozen sets, examples), so
that the wheel ships it inside the package where :mod:`circuits.tasks.package_data` finds it through
:mod:`importlib.resources`, and ``circuits.notebooks``, the top-level ``notebooks/`` folder (``af1 notebooks DIR``
copies them out). Everything else is declared in ``pyproject.toml``."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["interventions*", "circuits*"]), "circuits.data", "circuits.notebooks"])
