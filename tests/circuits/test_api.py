"""The public API of ``circuits``: every exported name resolves, lazily (``import circuits`` and
``af1 --help`` do not import torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import circuits

ROOT = Path(__file__).resolve().parents[2]


def test_every_exported_name_resolves():
    for name in circuits.__all__:
        assert getattr(circuits, name) is not None, name
    assert circuits.search_af1 is circuits.search.search_af1
    assert circuits.SearchConfig().validate().threshold == 0.9


def test_import_and_help_do_not_import_torch():
    code = ("import sys, circuits, circuits.cli; circuits.cli.build_parser().format_help(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
