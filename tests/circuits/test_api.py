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


def fresh_import(name: str):
    """``name`` imported anew (its module-level code runs again)."""
    import importlib

    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_deprecated_paths_warn_and_keep_working():
    """The former import paths the docs named keep working for a deprecation period, each with a warning naming
    the new place; nothing else in the package warns (pyproject turns the project's own deprecations into errors
    outside ``pytest.warns``)."""
    import pytest

    with pytest.warns(DeprecationWarning, match=r"^circuits\.lens_report is deprecated: import from circuits\.lens"):
        old = fresh_import("circuits.lens_report")
    from circuits.lens import report

    assert old.write_lens_outputs is report.write_lens_outputs and old.lens_json is report.lens_json
    with pytest.warns(DeprecationWarning, match=r"^interventions\.bridge is deprecated: import from "
                                                r"interventions\.backends\.bridge"):
        bridge = fresh_import("interventions.bridge")
    from interventions import convert, tokenization
    from interventions.backends import bridge as backend

    assert bridge.boot is backend.boot and bridge.hooked_state_to_hf is convert.hooked_state_to_hf
    assert bridge.prepare_tokenizer is tokenization.prepare_tokenizer
    from circuits.commands import zoo

    with pytest.warns(DeprecationWarning, match=r"af1_check is deprecated: use circuits\.groundtruth\.af1_check"):
        with pytest.raises(circuits.ModelLoadError):  # the call goes through (to a folder that is not there)
            zoo.af1_check(Path("/nonexistent/af1-model"))
