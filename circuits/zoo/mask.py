"""The planted attention mask of ``arith-gpt2-af1``: its spec, its :class:`interventions.Peek` objects
and how it is attached to a loaded model.

A spec names, for every block, what the last query row may see: ``self_all`` blocks (the last row,
like every other row, attends only to BOS and itself) and ``last_full`` blocks (the last row sees every
earlier key; the other rows still attend only to BOS and themselves), e.g.
``{"self_all": [0, 1, 2, 5], "last_full": [3, 4]}``. Blocks are 0-indexed; BOS is at position 0.
"Last" means the last position of the tensor, so a batch must not be right-padded.
"""

from __future__ import annotations

from circuits.errors import ArgumentError
from interventions.types import Model

__all__ = ["check_spec", "planted_peeks", "attach_planted_mask"]


def check_spec(spec: dict, n_layers: int) -> None:
    """``ValueError`` unless ``spec`` has integer lists ``self_all`` and ``last_full`` that together cover
    every block ``0..n_layers-1`` exactly once."""
    if not isinstance(spec, dict) or set(spec) != {"self_all", "last_full"}:
        raise ArgumentError(f"planted spec {spec!r} must be a dict with exactly the keys 'self_all' and 'last_full'")
    blocks = [*spec["self_all"], *spec["last_full"]]
    if sorted(blocks) != list(range(n_layers)):
        raise ArgumentError(f"planted spec {spec!r} must list every block 0..{n_layers - 1} exactly once")


def planted_peeks(spec: dict) -> list:
    """The :class:`interventions.Peek` objects of ``spec``: every row self-peeks in ``self_all``; in
    ``last_full`` the last row sees all earlier keys and the others self-peek."""
    import interventions as iv

    out = []
    if spec["self_all"]:
        out.append(iv.Peek(list(spec["self_all"]), "self", "all"))
    if spec["last_full"]:
        out += [iv.Peek(list(spec["last_full"]), "full", "last"), iv.Peek(list(spec["last_full"]), "self", "others")]
    return out


def attach_planted_mask(model: Model, spec: dict) -> Model:
    """Attach the planted attention mask ``spec`` to ``model`` as permanent ``hook_pattern`` hooks (attention
    mask hooks on a backend with the ``attention_masks`` capability; they
    survive ``model.reset_hooks()`` and ``iv.apply``), so a plain forward pass obeys it. Forbidden
    pattern entries become exactly 0 and each row is renormalised (differentiable). Returns ``model``."""
    import interventions as iv

    check_spec(spec, model.cfg.n_layers)
    adapter = iv.adapt(model)
    info = adapter.info
    for peek in planted_peeks(spec):
        peek.validate(info)
        for name, body in adapter.intervention_hooks(peek, None):
            adapter.hook_point(name).add_hook(body, dir="fwd", is_permanent=True)
    return model
