"""Public tensors carry jaxtyping shapes: no public function of interventions/ or circuits/ annotates a bare
``torch.Tensor`` (``Tensor``) parameter or return value, inside a union or container included.

Read from the source (the AST), not from imported modules: annotations are strings under postponed evaluation.
Public: a function or method whose name, class and module path have no leading underscore (``__init__``
counts). The functions below still wait for their shapes; the list only shrinks (an entry that has its shapes
fails the test until it is removed)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("interventions", "circuits")
JAXTYPING = {"Float", "Int", "Bool", "Shaped", "Num", "Integer", "Real", "Inexact", "UInt", "Complex"}

# Public functions that still annotate a bare Tensor, with the annotations concerned. Mostly activations of any
# hook point (their shape depends on the point), state dicts and cache files (one dict of many shapes), and the
# nnsight trace's internals (proxies of tensors of several layouts).
NOT_YET_SHAPED = {
    "interventions.adapter:ModelAdapter.activations": ["return"],
    "interventions.backends.bridge:BridgeAdapter.run_until": ["return"],
    "interventions.backends.nnsight:NNsightAdapter.activations": ["return"],
    "interventions.backends.nnsight_trace:call_hooks": ["act", "return"],
    "interventions.backends.nnsight_trace:mask_like": ["allowed", "return"],
    "interventions.backends.nnsight_trace:batch_mask": ["allowed", "causal", "hidden", "return"],
    "interventions.backends.nnsight_trace:at_point": ["value", "return"],
    "interventions.backends.nnsight_trace:first_of": ["return"],
    "interventions.backends.nnsight_trace:with_first": ["new"],
    "interventions.cache:MeanCache.tensors": ["return"],
    "interventions.cache_file:write": ["tensors"],
    "interventions.cache_file:read": ["return"],
    "interventions.cache_file:tensor_problem": ["tensors"],
    "interventions.cache_sums:Sums.means": ["return"],
    "interventions.convert:with_unembed_bias": ["b_U"],
    "interventions.convert:hooked_state_to_hf": ["state_dict"],
    "interventions.convert:bridge_from_hooked_state": ["state_dict"],
    "circuits.lens.capture:capture_last": ["return"],
    "circuits.search.evaluators:FastEvaluator.start": ["sl"],
}


def bare_tensors(node: ast.expr | None) -> Iterator[ast.expr]:
    """The bare ``Tensor`` / ``torch.Tensor`` references in an annotation, skipping jaxtyping subscripts
    (``Float[torch.Tensor, "batch pos"]``); string annotations are parsed."""
    if node is None:
        return
    if isinstance(node, ast.Subscript):
        value = node.value
        name = value.id if isinstance(value, ast.Name) else getattr(value, "attr", None)
        if name in JAXTYPING:
            return
    if (isinstance(node, ast.Attribute) and node.attr == "Tensor") or (
            isinstance(node, ast.Name) and node.id == "Tensor"):
        yield node
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            yield from bare_tensors(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            pass
        return
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.expr):
            yield from bare_tensors(child)


def unshaped(source: str, module: str) -> dict[str, list[str]]:
    """``{"module:Class.function": [parameter names, "return"]}`` of the public functions in ``source`` that
    annotate a bare tensor."""
    out: dict[str, list[str]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    not node.name.startswith("_") or node.name == "__init__"):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
                hits = [p.arg for p in params if any(bare_tensors(p.annotation))]
                if any(bare_tensors(node.returns)):
                    hits.append("return")
                if hits:
                    out[f"{module}:{prefix}{node.name}"] = hits

    visit(ast.parse(source).body, "")
    return out


def package_unshaped() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if any(part.startswith("_") and part != "__init__.py" for part in rel.parts):
                continue
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            out.update(unshaped(path.read_text(encoding="utf-8"), module))
    return out


def test_the_check_finds_bare_tensors_and_passes_shaped_ones():
    source = '''
import torch
from torch import Tensor
from jaxtyping import Float, Int

def shaped(x: Float[torch.Tensor, "batch pos"], n: int) -> Int[torch.Tensor, " batch"]: ...
def bare(x: torch.Tensor, y: "Tensor | None", z: list[Float[torch.Tensor, "a"]]) -> dict[str, torch.Tensor]: ...
def _private(x: torch.Tensor) -> torch.Tensor: ...

class Model:
    def __init__(self, w: torch.Tensor): ...
    def run(self, x: Float[torch.Tensor, "b d"]) -> tuple[Float[torch.Tensor, "b"], Tensor]: ...

class _Hidden:
    def run(self, x: torch.Tensor): ...
'''
    assert unshaped(source, "m") == {"m:bare": ["x", "y", "return"], "m:Model.__init__": ["w"],
                                     "m:Model.run": ["return"]}


def test_public_functions_annotate_tensors_with_shapes():
    found = package_unshaped()
    new = {name: [p for p in params if p not in NOT_YET_SHAPED.get(name, [])] for name, params in found.items()}
    new = {name: params for name, params in new.items() if params}
    assert not new, ("public functions annotating a bare torch.Tensor (give them jaxtyping shapes, e.g. "
                     f'Float[torch.Tensor, "batch pos d_model"]): {new}')
    stale = {name: [p for p in params if p not in found.get(name, [])] for name, params in NOT_YET_SHAPED.items()}
    stale = {name: params for name, params in stale.items() if params}
    assert not stale, f"these have their shapes now: remove them from NOT_YET_SHAPED: {stale}"
