"""How a command's arguments travel through the package: the files a call walks through, and how often it comes
back to a file it left.

A *walk* follows the arguments: below a root (the command module's ``check`` and ``run``, or one function such as
``PromptSpec.prepare``), every call into a ``circuits/`` function that receives one of the values carrying the
user's arguments (the ``argparse.Namespace``, a command's specs, and the values whose fields the flags set: the
package's dataclasses with :func:`circuits.flags.flag` fields, such as ``ModelSpec``, ``PromptSpec``, ``FitSpec``,
``RunOptions`` and the analyses' configs) as a parameter other than ``self`` is a *stop* (``sys.setprofile``; a
value's own methods, and what the functions do with other values, are not followed). Consecutive stops in one file
make a *stay*; a *return* is a stay in a file the walk has already left (stays minus distinct files); a *climb* is a
stop whose caller's module is imported by the callee's (a lower layer calling back up, through a callback or an
import inside a function).

Usage: ``python benchmarks/walk.py [--show]``: the walks of ``af1 search``, ``af1 lens`` (zoo model
``arith-gpt2``, 20 prompts, a small fit set, into a temporary folder) and ``PromptSpec.prepare``; ``--show`` prints
each stay. ``tests/test_architecture.py`` holds the returns to at most :data:`MAX_RETURNS`.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "circuits"
MAX_RETURNS = 6
SKIP = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>", "<module>")
NOT_FOLLOWED = ("circuits/moved.py",)
"""The import system's finder of former module paths: called by every import, it carries no argument."""


def carries_arguments(value: object) -> bool:
    """Whether ``value`` carries the user's arguments: the parsed command line, a command's specs (``*Specs``) or a
    value whose fields the flags set (a dataclass with :func:`circuits.flags.flag` fields: the model and prompt specs,
    the fit set's and the format's, the run options, the analyses' configs)."""
    import argparse
    import dataclasses

    from circuits.flags import flag_fields

    if isinstance(value, argparse.Namespace):
        return True
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return False
    cls = type(value)
    return cls.__module__.startswith("circuits.") and (cls.__name__.endswith("Specs") or bool(flag_fields(cls)))


@dataclass
class Walk:
    """The stays of a walk (file of each run of consecutive calls) and its climbs."""

    name: str
    stays: list[str]
    climbs: list[tuple[str, str]]

    @property
    def returns(self) -> int:
        return len(self.stays) - len(set(self.stays))

    def line(self) -> str:
        return (f"{self.name}: {len(self.stays)} stays in {len(set(self.stays))} files, {self.returns} returns, "
                f"{len(self.climbs)} climbs")


def module_of(path: Path) -> str:
    rel = path.resolve().relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def module_imports(path: Path, module: str) -> list[tuple[str, int, tuple[str, ...]]]:
    """``(imported module, line, names)`` of every import in the file ``path`` of module ``module`` (dotted), at any
    depth of the code: inside functions and under TYPE_CHECKING too; relative imports resolved. Shared with
    ``tests/test_architecture.py``, which walks the whole import graph with it."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out.append((base, node.lineno, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            out.extend((a.name, node.lineno, ()) for a in node.names)
    return out


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (and every ``module.name`` it imports from one)."""
    out: set[str] = set()
    for base, _, names in module_imports(path, module_of(path)):
        out.add(base)
        out.update(f"{base}.{n}" for n in names)
    return out


def trace(root: Callable[[], object], roots: tuple[str, ...], name: str) -> Walk:
    """Run ``root()`` under a profiler and return the walk of the arguments below the functions named ``roots``
    (``file:function`` suffixes, e.g. ``commands/search.py:run``)."""
    calls: list[tuple[str, str | None]] = []  # (file, caller file) in call order
    stack: list[tuple[str | None, bool]] = []  # per frame: its circuits file (None: not ours), below a root

    def ours(code: object) -> str | None:
        filename = getattr(code, "co_filename", "")
        if not filename.startswith(str(PACKAGE)) or getattr(code, "co_name", "") in SKIP:
            return None
        file = str(Path(filename).relative_to(ROOT))
        return None if file in NOT_FOLLOWED else file

    def profile(frame: object, event: str, arg: object) -> None:
        if event == "call":
            code = frame.f_code  # type: ignore[attr-defined]
            file = ours(code)
            below = bool(stack) and stack[-1][1]
            if not below and file is not None and any(f"{file}:{code.co_name}".endswith(r) for r in roots):
                below = True
                calls.append((file, None))
            elif below and file is not None:
                names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
                args = [frame.f_locals.get(v) for v in names if v not in ("self", "cls")]  # type: ignore[attr-defined]
                if any(carries_arguments(a) for a in args):
                    caller = next((f for f, _ in reversed(stack) if f is not None), None)
                    calls.append((file, caller))
            stack.append((file, below))
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        root()
    finally:
        sys.setprofile(None)
    stays: list[str] = []
    climbs: list[tuple[str, str]] = []
    imported = {}
    for file, caller in calls:
        if not stays or stays[-1] != file:
            stays.append(file)
        if caller is not None and caller != file:
            callee_imports = imported.setdefault(file, imports_of(ROOT / file))
            if module_of(ROOT / caller) in callee_imports:
                climbs.append((caller, file))
    return Walk(name, stays, climbs)


def command_walk(command: str) -> Walk:
    """The walk of ``af1 <command>`` on the zoo model ``arith-gpt2`` (20 prompts, fit set of 300)."""
    from circuits import cli

    with tempfile.TemporaryDirectory() as tmp:
        argv = [command, "--model", "arith-gpt2", "--task", "add_sub", "--n-prompts", "20", "--out",
                str(Path(tmp) / "run"), "--no-progress"]
        if command == "search":
            argv += ["--fit-size", "300"]
        code = {}
        walk = trace(lambda: code.setdefault("rc", cli.main(argv)),
                     (f"commands/{command}.py:check", f"commands/{command}.py:run"), f"af1 {command}")
        if code.get("rc"):
            raise RuntimeError(f"af1 {' '.join(argv)} exited with {code['rc']}")
    return walk


def prepare_walk() -> Walk:
    """The walk of ``PromptSpec.prepare`` (CAMA's fit set) on ``arith-gpt2``."""
    from circuits.models.spec import ModelSpec
    from circuits.prompts.fitset import FitSpec
    from circuits.prompts.spec import PromptSpec

    model = ModelSpec("arith-gpt2").load()
    spec = PromptSpec("add_sub", n_prompts=20, fit=FitSpec(size=300))
    return trace(lambda: spec.prepare(model, means="cama", progress=False), ("prompts/spec.py:prepare",),
                 "PromptSpec.prepare")


def walks() -> list[Walk]:
    return [command_walk("search"), command_walk("lens"), prepare_walk()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true")
    args = parser.parse_args()
    for walk in walks():
        print(walk.line())
        if args.show:
            seen: set[str] = set()
            for stay in walk.stays:
                print(f"    {'return ' if stay in seen else '       '}{stay}")
                seen.add(stay)
            for caller, callee in walk.climbs:
                print(f"    climb {caller} -> {callee}")


if __name__ == "__main__":
    main()
