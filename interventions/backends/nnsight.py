"""Backend for Hugging Face causal LMs in nnsight (registers :class:`NNsightAdapter`), locally or on NDIF.

The model is an :class:`~.nnsight_model.NNsightModel` (:func:`~.nnsight_model.wrap`,
:func:`~.nnsight_model.from_pretrained`); every forward pass is one nnsight trace, in which the hook
points the interventions use are emulated on the Hugging Face modules (:mod:`.nnsight_trace`):

* ``blocks.{l}.hook_resid_post`` / ``hook_resid_pre``: the decoder block's output / input hidden states
  (CAMA, mean and zero ablation replace the output);
* ``blocks.{l}.attn.hook_z``: the input of the attention output projection, per query head (head
  ablation; grouped-query attention included, its query heads are the heads);
* ``blocks.{l}.attn.hook_attn_mask``: the mask of allowed keys given to the block's attention, so that
  :class:`~interventions.Peek` works with SDPA kernels, which expose no pattern
  (capability ``attention_masks``; BOS and self stay allowed exactly as on the other backends).

Capabilities: ``configs_per_pass`` (several prompt batches, each with its own interventions, as the
invokes of one trace: one request on NDIF). Blocks are not skipped (``skips_blocks`` is off):
:meth:`NNsightAdapter.run_from` runs a whole pass with the residual entering block ``start`` replaced.

Importing this module does not import nnsight; building a model does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int

from ..adapter import Capabilities, HookFn, ModelAdapter
from ..edits import edit_problems
from ..hooks import PER_HEAD_MASK, HookPointLike, resid_post, resid_pre
from ..types import InterventionError, Model
from .nnsight_model import NNsightModel, from_pretrained, require_nnsight, wrap
from .nnsight_trace import Invoke

__all__ = ["NNsightAdapter", "NNsightModel", "from_pretrained", "is_nnsight_model", "require_nnsight", "wrap"]


class NNsightAdapter(ModelAdapter):
    """Access to an :class:`~.nnsight_model.NNsightModel` (see the module docstring)."""

    backend = "nnsight"
    model: NNsightModel
    capabilities = Capabilities(skips_blocks=False, positions=False, frozen_bos_kv=False, configs_per_pass=True,
                                attention_masks=True, split_inputs=True)

    def check_edits(self) -> dict[str, str]:
        """The edit probe locally; none for a remote model (it would cost requests, and nnsight writes
        every edit into the forward pass itself)."""
        return {} if self.model.remote else edit_problems(self)

    def attach(self, point: Any, fn: HookFn, level: int, on_fire: Any) -> None:
        """:meth:`ModelAdapter.attach`; ``on_fire`` runs after each trace in which the hook ran (the trace
        reports it, also from a remote run, where the hook itself runs on the server)."""
        point.add_hook(fn, dir="fwd", level=level, on_fire=on_fire)

    def intervention_hooks(self, item: Any, ctx: Any) -> list[tuple[str, HookFn]]:
        """:meth:`ModelAdapter.intervention_hooks`; attention masks are refused where attention runs in
        flash-attention kernels, which take no mask of allowed keys."""
        out = super().intervention_hooks(item, ctx)
        impl = self.model.cfg.attn_implementation
        if "flash" in impl and any(name.endswith(".attn.hook_attn_mask") for name, _ in out):
            raise InterventionError(f"{type(item).__name__} needs attention that takes a mask of allowed keys, "
                                    f"but this model runs {impl}: load it with attn_implementation='sdpa' or 'eager'")
        return out

    def token_module(self) -> torch.nn.Module:
        return self.model

    def embedding_matrix(self) -> Float[torch.Tensor, "d_vocab d_model"]:
        return self.model.W_E

    def fingerprint(self) -> str:
        """Of the embedding matrix locally; of the model name and config on a remote model (its weights
        are not here)."""
        if self.embedding_matrix().device.type != "meta":
            return super().fingerprint()
        text = f"{self.model.cfg.model_name}|{self.model.hf.config.to_json_string()}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def device(self) -> torch.device:
        """Where tensors for this model are built: the weights' device, the CPU for a remote model."""
        device = self.embedding_matrix().device
        return torch.device("cpu") if device.type == "meta" else device

    # --- running ----------------------------------------------------------------------------
    def read(self, tokens: Int[torch.Tensor, "batch pos"], names: Sequence[str],
             hooks: dict[str, list[HookFn]] | None = None, summed: Sequence[str] = ()) -> dict:
        """One pass over ``tokens`` returning ``{name: activation}`` for ``names`` and the batch sums for
        ``summed`` (no logits)."""
        inv = Invoke(tokens, hooks=dict(hooks or {}), reads=tuple(names), sums=tuple(summed), logits="none")
        return self.model.run([inv])[0]

    def run_to_resid(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        name = resid_post(self.info.n_layers - 1)
        return self.read(tokens, [name])[name]

    def embed(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        return self.read(tokens, [resid_pre(0)])[resid_pre(0)]

    def activations(self, tokens: Int[torch.Tensor, "batch pos"], names: Sequence[str],
                    summed: Sequence[str] = ()) -> dict[str, torch.Tensor]:
        """:meth:`ModelAdapter.activations`, saved by the trace (what a remote run sends back; the sums are
        taken there)."""
        out = self.read(tokens, names, summed=summed)
        return {name: out[name].detach() for name in (*names, *summed)}

    def forward_from(self, resid: Float[torch.Tensor, "batch pos d_model"], start: int, stop: int | None,
                     positions: Int[torch.Tensor, " pos"] | None) -> Float[torch.Tensor, "batch pos d_out"]:
        """:meth:`ModelAdapter.run_from` as one whole pass: placeholder token ids (the first token of the
        vocabulary) run through blocks ``0..start-1``, whose result is then replaced by ``resid``."""
        n = self.info.n_layers
        tokens = torch.zeros(resid.shape[:2], dtype=torch.long)
        entry = resid_pre(start) if start < n else resid_post(n - 1)
        def enter(act: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
            return resid.to(act.dtype)

        hooks: dict[str, list[HookFn]] = {entry: [enter]}
        if stop is None:
            return self.model.run([Invoke(tokens, hooks=hooks, logits="all")])[0]["logits"]
        exit_name = resid_pre(stop) if stop < n else resid_post(n - 1)
        return self.read(tokens, [exit_name], hooks)[exit_name]

    def run_configs(self, runs: Sequence[tuple[Int[torch.Tensor, "batch pos"], dict[str, list[HookFn]]]],
                    logits: str = "last", answers: Sequence[Int[torch.Tensor, " batch *k"]] | None = None,
                    ) -> list[Float[torch.Tensor, " batch *rest"]]:
        """:meth:`ModelAdapter.run_configs`: one invoke per run, all in one trace (the ``"answer"`` readout is
        computed there). A run with per-head attention masks (a head-level :class:`~interventions.Peek`) has a
        trace of its own: the invokes of a trace join their masks, which must then have one shape."""
        if len(runs) > 1 and any(getattr(fn, PER_HEAD_MASK, False) for _, hooks in runs for fns in hooks.values()
                                 for fn in fns):
            return [self.run_configs([run], logits, None if answers is None else [answers[i]])[0]
                    for i, run in enumerate(runs)]
        out = self.model.run([Invoke(tokens, hooks=dict(hooks), logits=logits,
                                     answers=None if answers is None else answers[i])
                              for i, (tokens, hooks) in enumerate(runs)])
        return [res["logits"] for res in out]


def is_nnsight_model(model: Model) -> bool:
    """Whether ``model`` is an :class:`~.nnsight_model.NNsightModel`."""
    return isinstance(model, NNsightModel)


