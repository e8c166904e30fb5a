"""The package's architecture, held by tests: folders by concern, no import circle, nothing inside the package on a
former module path, no private name across modules, every module in ``docs/architecture.md``, modules of one
concern (a size bound), and the walks of the arguments of ``af1 search``, ``af1 lens`` and ``PromptSpec.prepare``
(``benchmarks/walk.py``) returning to a file they left at most ``MAX_RETURNS`` times.

Read from the source (the AST) where possible: imports inside functions and under ``TYPE_CHECKING`` count (a hidden
circle is still one)."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("circuits", "interventions")
MAX_LINES = 450
"""A module longer than this holds more than one concern (the guide's bound is about 400 lines)."""
CONCERNS = ("tasks", "prompts", "models", "store", "groundtruth", "commands", "search", "prune", "lens", "sweep", "zoo")
"""The folders of ``circuits/``."""
MAX_TOP_LEVEL = 19


def modules() -> dict[str, Path]:
    """Every module of the packages: dotted name -> file (a package under its own name)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = modules()


def owner(name: str) -> str | None:
    """The module of the package that holds ``name`` (a module, or a name inside one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def load_walk() -> ModuleType:
    """``benchmarks/walk.py`` (not a package): the import reader and the walks of a value's path."""
    spec = importlib.util.spec_from_file_location("walk", ROOT / "benchmarks" / "walk.py")
    assert spec is not None and spec.loader is not None
    walk = importlib.util.module_from_spec(spec)
    sys.modules["walk"] = walk  # its dataclasses look their module up
    spec.loader.exec_module(walk)
    return walk


WALK = load_walk()


def imports(module: str) -> list[tuple[str, int, tuple[str, ...]]]:
    """``(imported module, line, names)`` of every import in ``module``, at any depth of the code."""
    return WALK.module_imports(MODULES[module], module)


def graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for base, _, names in imports(module):
            targets = [owner(f"{base}.{n}") or owner(base) for n in names] if names else [owner(base)]
            edges[module].update(t for t in targets if t is not None and t != module)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circle():
    assert circles(graph()) == []


def test_the_circle_finder_finds_a_circle_hidden_in_a_function():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_circuits_shows_its_concerns_as_folders():
    top = sorted(p.name for p in (ROOT / "circuits").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"circuits/ holds {len(top)} modules at its top level: {top}"
    for folder in CONCERNS:
        init = ROOT / "circuits" / folder / "__init__.py"
        assert init.is_file(), f"circuits/{folder}/ is not a package"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"circuits/{folder}/__init__.py says in no docstring what lives there"


@pytest.mark.parametrize("folder", ["tasks", "prompts", "models", "store", "groundtruth"])
def test_each_new_folder_says_what_it_may_import(folder):
    doc = ast.get_docstring(ast.parse((ROOT / "circuits" / folder / "__init__.py").read_text())) or ""
    assert "May import" in doc


def test_nothing_in_the_packages_imports_a_former_module_path():
    from circuits.moved import MOVED

    used = [(m, line, base) for m in MODULES for base, line, names in imports(m)
            if base in MOVED or any(f"{base}.{n}" in MOVED for n in names)]
    assert used == []


def test_no_private_name_is_imported_across_modules():
    found = [(m, line, n) for m in MODULES for base, line, names in imports(m)
             if base.split(".")[0] in PACKAGES for n in names if n.startswith("_") and not n.endswith("__")]
    assert found == []


def test_modules_hold_one_concern():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_architecture_md_lists_every_module():
    """Each module's path appears in docs/architecture.md (written as `circuits/tasks/files.py`), and each folder's
    (`circuits/tasks/`)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"`((?:circuits|interventions)/[\w/]+\.py)`", text))
    expected = {p.relative_to(ROOT).as_posix() for p in MODULES.values() if p.name != "__init__.py"}
    folders = {p.parent.relative_to(ROOT).as_posix() + "/" for p in MODULES.values() if p.name == "__init__.py"}
    assert {f for f in folders if f"`{f}`" not in text} == set(), "folders missing from docs/architecture.md"
    assert expected - listed == set(), "modules missing from docs/architecture.md"
    assert listed - expected == set(), "docs/architecture.md lists modules that do not exist"


def test_former_module_paths_warn_and_are_the_modules_that_hold_the_code_now():
    import importlib

    from circuits.moved import CALLABLE, MOVED

    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=rf"^{re.escape(old)} is deprecated: import from "
                                                    rf"{re.escape(new[0])}"):
            module = importlib.import_module(old)
        if len(new) == 1 and old not in CALLABLE:
            assert module is importlib.import_module(new[0])
    specs = importlib.import_module("circuits.specs")
    from circuits.models.spec import ModelSpec
    from circuits.prompts.spec import PromptSpec

    assert specs.ModelSpec is ModelSpec and specs.PromptSpec is PromptSpec
    loading = importlib.import_module("circuits.loading")
    from circuits.models import hub
    from circuits.prompts import sampling

    assert loading.prepare_prompts is sampling.prepare_prompts and loading.cached_spelling is hub.cached_spelling
    with pytest.raises(AttributeError, match="moved to"):
        loading.no_such_name  # noqa: B018


def test_an_old_path_named_like_a_function_leaves_the_function_callable(monkeypatch):
    """``import circuits.lens.interchange`` (the module's former path) binds the module on ``circuits.lens``, where
    ``interchange`` is the function of the attention interchange check: it must stay that function."""
    import importlib

    import circuits.lens as lens
    from circuits.lens import interchange_check

    calls = []
    monkeypatch.setattr(interchange_check, "interchange", lambda *a, **k: calls.append((a, k)) or "result")
    sys.modules.pop("circuits.lens.interchange", None)
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("circuits.lens.interchange")
    assert lens.interchange is old and old.InterchangeResult is interchange_check.InterchangeResult
    assert lens.interchange("model", 3, seed=1) == "result" and calls == [(("model", 3), {"seed": 1})]


def test_the_arguments_go_down_once():
    """The walks of ``af1 search``, ``af1 lens`` and ``PromptSpec.prepare`` on the zoo model (benchmarks/walk.py)."""
    results = WALK.walks()
    assert {w.name: w.returns for w in results} == {w.name: min(w.returns, WALK.MAX_RETURNS) for w in results}, \
        "\n".join(w.line() for w in results)
