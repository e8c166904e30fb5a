"""What an ``af1 edges`` run will need, said before its model loads: the edges of its graph, the graph's memory
(:meth:`~circuits.edges.graph.Layout.memory_bytes`, the figure the run logs again once loaded) and a lower
bound of what must fit on this machine, from the model's ``config.json`` and the prompts' lengths in tokens (a
sample of the task's prompts, or every prompt of a ``--prompts`` file, tokenised with the model's tokenizer).

:func:`estimate_edges` is pure (a config, prompt lengths, a batch size in, an :class:`EdgesEstimate` out);
:func:`shortfall` says, as one line, whether a lower bound exceeds the memory there is (``None`` when it fits);
:func:`plan_edges` reads the config and the tokenizer (a zoo model's folder, a local folder, the Hugging Face
cache, :func:`circuits.models.memory.read_pretrained`), logs the estimate and refuses a run that cannot fit.

The lower bounds count only what the code certainly holds at one time (units: bytes):

* in host memory, once the scores are in: the mean scores (float32) and the edge table (five int32 columns,
  the float64 score and the int32 candidate flag): :data:`FLOOR_BYTES_PER_EDGE` per edge;
* on the model's device, during a scoring pass: the weights (:data:`WEIGHTS_FLOOR` of the parameters times the
  dtype's bytes) and, in the weights' dtype, the query, key and value inputs of every block (one per head, kept
  for the backward pass; measured with autograd's saved-tensor hooks on the hooked and bridge backends), the
  logits and every sender's output, for the ``batch * copies`` sequences of a pass (``copies``: one per query
  position, one aggregated); on the CPU, the running score sums (float32) beside them.

They use the shortest prompt (of the task's sample, or of the prompts file's rows), one answer token and the fewest
upstream senders (attention and MLP in parallel), so a run whose layout is that shortest prompt or longer never
needs less.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from circuits.edges.graph import Layout
from circuits.errors import ArgumentError
from circuits.logs import get_logger
from circuits.models import memory
from circuits.models.memory import DTYPE_BYTES, GIB
from circuits.prompts.datasets import dataset_prompt_lengths

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from circuits.models.spec import ModelSpec
    from circuits.prompts.spec import PromptSpec
    from interventions.types import JsonMapping, Tokenizer

__all__ = ["FLOOR_BYTES_PER_EDGE", "EdgesEstimate", "available_memory", "estimate_edges", "layout_of_config",
           "plan_edges", "sample_lengths", "shortfall", "size_text"]

FLOOR_BYTES_PER_EDGE = 36
"""Host bytes per edge certainly held together once the scores are in: the mean score (float32) and its row of
the edge table (five int32 columns, the float64 score, the int32 candidate flag)."""
WEIGHTS_FLOOR = 0.99
"""Share of the parameters a Hugging Face config counts that the bound takes as loaded: TransformerLens leaves out
a few some checkpoints have (well under 1 %)."""
PARALLEL_TYPES = ("gptj", "codegen", "phi", "cohere")
"""Hugging Face ``model_type`` values whose blocks run attention and MLP in parallel (TransformerLens'
``parallel_attn_mlp``); GPT-NeoX, StableLM and Falcon say so in their config."""


def layout_of_config(config: PretrainedConfig | JsonMapping, n_pos: int, *, n_answer: int = 1,
                     positional: bool = True) -> Layout:
    """The :class:`~circuits.edges.graph.Layout` of the model a Hugging Face config describes (a
    ``PretrainedConfig`` or the ``config.json`` mapping; GPT-2, GPT-NeoX, GPT-J, Llama, Qwen2, Gemma naming), on
    prompts of ``n_pos`` tokens whose last ``n_answer`` predict the answer: what
    :func:`circuits.edges.analysis.layout_of` gives once the model is loaded."""
    c = getattr(config, "text_config", None) or config
    if isinstance(c, dict) and isinstance(c.get("text_config"), dict):
        c = c["text_config"]

    def first(*names: str, default: Any = None) -> Any:
        for name in names:
            value = c.get(name) if isinstance(c, dict) else getattr(c, name, None)
            if value is not None:
                return value
        return default

    n_heads = int(first("num_attention_heads", "n_head", "n_heads"))
    kv = first("num_key_value_heads", "n_key_value_heads")
    if kv is None and first("multi_query", default=False) and not first("new_decoder_architecture", default=False):
        kv = 1
    model_type = str(first("model_type", default=""))
    if model_type in PARALLEL_TYPES:
        parallel = True
    elif model_type == "falcon":
        parallel = bool(first("parallel_attn", default=True)) or bool(first("new_decoder_architecture", default=False))
    else:
        parallel = bool(first("use_parallel_residual", default=False))
    return Layout(n_layers=int(first("num_hidden_layers", "n_layer", "n_layers")), n_heads=n_heads,
                  n_kv_heads=int(kv if kv is not None else n_heads),
                  d_model=int(first("hidden_size", "n_embd", "d_model")), n_pos=int(n_pos), n_answer=int(n_answer),
                  parallel=parallel, positional=positional)


@dataclass(frozen=True)
class EdgesEstimate:
    """An ``af1 edges`` run before loading. ``layout``: the graph at the longest sampled prompt; ``floor``: at
    the shortest, one answer token, attention and MLP in parallel (the fewest edges the run can have); ``batch``:
    prompts per pass (``None``: ``--batch-size auto``, counted as 1 in the bounds); ``weights``: bytes of the
    weights (``None``: unknown, counted as 0); ``dtype_bytes``: bytes per weight; ``d_vocab``: the vocabulary;
    ``device``: ``"cpu"``, ``"cuda"`` or ``"spread"`` (a device map: the device's share is not known)."""

    layout: Layout
    floor: Layout
    batch: int | None
    weights: int | None
    dtype_bytes: int
    d_vocab: int
    device: str

    @property
    def n_edges(self) -> int:
        """Edges of the graph at the longest sampled prompt."""
        return self.layout.n_edges()

    @property
    def graph_bytes(self) -> int:
        """:meth:`Layout.memory_bytes` at the run's batch (1 for ``auto``): the figure the run logs once loaded."""
        return self.layout.memory_bytes(self.batch or 1)

    def pass_floor(self, batch: int) -> int:
        """Bytes one scoring pass over ``batch`` prompts certainly holds on the model's device besides the
        weights, in the weights' dtype: the query, key and value inputs of every block and copy (one per head, kept
        for the backward pass), the logits of every copy and the senders' outputs."""
        f = self.floor
        copies = f.n_pos if f.positional else 1
        inputs = f.n_layers * copies * (f.n_heads + 2 * f.n_kv_heads) * f.d_model
        return self.dtype_bytes * batch * f.n_pos * (inputs + copies * self.d_vocab + f.n_senders * f.d_model)

    def floors(self, batch: int | None = None) -> tuple[int, int]:
        """``(host, device)``: lower bounds of the bytes the run holds at once in host memory and on its CUDA
        device (0 on the CPU), at ``batch`` prompts per pass (default: the run's)."""
        b = batch or self.batch or 1
        edges = self.floor.n_edges()
        weights = self.weights or 0
        if self.device == "cpu":
            return weights + max(FLOOR_BYTES_PER_EDGE * edges, 4 * edges + self.pass_floor(b)), 0
        if self.device == "cuda":
            return FLOOR_BYTES_PER_EDGE * edges, weights + self.pass_floor(b)
        return FLOOR_BYTES_PER_EDGE * edges, 0

    def describe(self) -> str:
        """One line: the edges, the graph's memory at the batch, and the lower bounds."""
        host, device = self.floors()
        where = f"{host / GIB:.2f} GiB in host memory" + (f" and {device / GIB:.2f} GiB on the GPU" if device else "")
        what = "positions" if self.layout.positional else "positions, aggregated"
        return (f"edge graph: {self.n_edges:,} edges ({self.layout.n_pos} {what}), about "
                f"{size_text(self.graph_bytes)} for the graph at batch {self.batch or 1}; the run needs at least "
                f"{where}")


def size_text(n_bytes: int) -> str:
    """``n_bytes`` as ``18.2 MiB`` under a GiB, else ``3.50 GiB``."""
    return f"{n_bytes / 2**20:.1f} MiB" if n_bytes < GIB else f"{n_bytes / GIB:.2f} GiB"


def estimate_edges(config: PretrainedConfig | JsonMapping, *, n_pos: int, n_pos_min: int | None = None,
                   batch: int | None, positional: bool = True, n_params: int | None = None, dtype: str | None = None,
                   device: str = "cpu") -> EdgesEstimate:
    """The :class:`EdgesEstimate` of a run of the model ``config`` describes (:func:`layout_of_config`) on
    prompts of ``n_pos`` tokens at most and ``n_pos_min`` at least (default ``n_pos``), ``batch`` prompts per
    pass (``None``: auto), ``n_params`` parameters in ``dtype`` (``None``: float32) on ``device`` (a torch
    device name, or ``"spread"`` for a device map). Pure."""
    layout = layout_of_config(config, n_pos, positional=positional)
    floor = replace(layout_of_config(config, n_pos if n_pos_min is None else n_pos_min, positional=positional),
                    parallel=True)
    c = getattr(config, "text_config", None) or config
    vocab = c.get("vocab_size") if isinstance(c, dict) else getattr(c, "vocab_size", None)
    size = DTYPE_BYTES[dtype or "float32"]
    kind = device if device == "spread" else str(device).split(":")[0]
    weights = None if n_params is None else int(WEIGHTS_FLOOR * n_params) * size
    return EdgesEstimate(layout=layout, floor=floor, batch=batch, weights=weights, dtype_bytes=size,
                         d_vocab=int(vocab or 0), device=kind if kind in ("cpu", "cuda") else "spread")


def shortfall(estimate: EdgesEstimate, host: int | None, device: int | None) -> str | None:
    """The one-line refusal when a lower bound of :meth:`EdgesEstimate.floors` exceeds the memory there is
    (``host``: this machine's bytes, ``device``: the CUDA device's free bytes; ``None``: unknown, never
    refused); ``None`` when the run can fit. It names ``--aggregate-positions`` and ``--batch-size``."""
    need_host, need_device = estimate.floors()
    over = [(need, have, where) for need, have, where in ((need_host, host, "host memory"),
                                                         (need_device, device, "free GPU memory"))
            if have is not None and need > have]
    if not over:
        return None
    need, have, where = over[0]
    f = estimate.floor
    one = estimate.floors(1)[0 if where == "host memory" else 1]
    fixes = ["add --aggregate-positions (a position-free graph)"] if f.positional else []
    if one <= have:
        fixes.append(f"lower --batch-size (batch 1 needs {one / GIB:.2f} GiB)")
    helps = " or ".join(fixes) or "use a machine with more memory"
    if one > have:
        helps += f" (--batch-size does not help: batch 1 needs {one / GIB:.2f} GiB)"
    return (f"af1 edges needs at least {need / GIB:.2f} GiB of {where} ({f.n_edges():,} edges at {f.n_pos} "
            f"positions, batch {estimate.batch or 1}) but there are {have / GIB:.2f} GiB: {helps}")


def available_memory(device: str) -> tuple[int | None, int | None]:
    """``(host, cuda)``: this machine's physical memory and the free memory of CUDA ``device`` (``None`` where
    not a CUDA device or not known), in bytes."""
    host = memory.host_memory_bytes()
    if not str(device).startswith("cuda"):
        return host, None
    import torch

    if not torch.cuda.is_available():
        return host, None
    return host, memory.free_cuda_bytes([torch.device(device)])


def sample_lengths(prompts: PromptSpec, tokenizer: Tokenizer) -> list[int]:
    """Tokens of the prompts a run of the :class:`~circuits.prompts.spec.PromptSpec` ``prompts`` draws from, read
    with ``tokenizer`` and no model: a sample of the task's (:func:`circuits.models.memory.prompt_lengths`), or
    every row of its prompt dataset (``--prompts``, :func:`circuits.prompts.datasets.dataset_prompt_lengths`).
    Units: tokens, BOS included."""
    if prompts.task is not None:
        return memory.prompt_lengths(prompts.task, prompts.n_prompts, tokenizer, prompts.format)
    return dataset_prompt_lengths(prompts.prompts, tokenizer, prompts.format, prompts.prepend_bos)


def plan_edges(model: ModelSpec, prompts: PromptSpec, positional: bool,
               batch: int | str | None) -> EdgesEstimate | None:
    """Log the :class:`EdgesEstimate` of ``af1 edges`` for a :class:`~circuits.models.spec.ModelSpec` and a
    :class:`~circuits.prompts.spec.PromptSpec` (of a task or a prompt dataset: :func:`sample_lengths`), before the
    model loads, and refuse (an :class:`~circuits.errors.ArgumentError`, one line) a run that cannot fit
    (:func:`shortfall`, with :func:`available_memory`). ``None`` (nothing said) when the model is remote or its
    config or tokenizer cannot be read here."""
    from circuits.models.loading import zoo_names

    if model.remote or (prompts.task is None and prompts.prompts is None):
        return None
    name = model.name
    if name in zoo_names():
        from circuits import zoo

        name = str(zoo.path(name))
    read = memory.read_pretrained(name)
    if read is None:
        return None
    config, tokenizer = read
    try:
        n_params: int | None = memory.count_parameters(config)
    except (OSError, ValueError, KeyError, ImportError):
        n_params = None
    lengths = sample_lengths(prompts, tokenizer)
    size = None if batch == "auto" or batch is None else min(int(batch), int(prompts.n_prompts))
    device = "spread" if model.device_map is not None else model.device
    estimate = estimate_edges(config, n_pos=max(lengths), n_pos_min=min(lengths), batch=size, positional=positional,
                              n_params=n_params, dtype=model.dtype, device=device)
    get_logger("edges").info("%s: %s", model.name, estimate.describe())
    refusal = shortfall(estimate, *available_memory(model.device if model.device_map is None else "cpu"))
    if refusal is not None:
        raise ArgumentError(refusal)
    return estimate
