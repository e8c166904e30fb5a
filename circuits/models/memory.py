"""Device memory of a run: what a model will need before it loads, the batch size that fits, and halving
the batch when the device runs out of memory.

* :func:`estimate_memory`: weights (parameter count x bytes per parameter), the CAMA means cache (the
  README formula) and the activations of one batch, from a model's shape (:class:`ModelShape`, read from
  a Hugging Face config or a loaded model's ``cfg``). :func:`estimate_pretrained` does it for a name in
  the local Hugging Face cache, a local model folder or a GGUF checkpoint without loading the weights.
* :func:`auto_batch_size`: ``--batch-size auto``: :data:`AUTO_CPU_BATCH` on CPU, else the largest batch
  whose activations fit in the free memory of the fullest GPU.
* :func:`halve_on_oom`: run an evaluation; on a device out-of-memory error halve the batch and run it
  again. The analyses append each finished configuration to the run's JSONL file, so the retry resumes
  where the failed attempt stopped.

Units: bytes throughout (``GiB`` = 2**30 bytes in messages).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from transformers import PretrainedConfig

from circuits.errors import ArgumentError
from interventions.types import Model

if TYPE_CHECKING:
    from jaxtyping import Int

    from circuits.prompts.fitspec import FitSpec
    from circuits.tasks.catalogue import TaskLike
    from circuits.tasks.formats import PromptFormat

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per parameter / activation of each ``--dtype`` (``None``: float32)."""
AUTO_CPU_BATCH = 64
"""``--batch-size auto`` on CPU: host memory is rarely the limit there, and larger batches are not faster."""
MAX_AUTO_BATCH = 1024
"""Largest batch ``--batch-size auto`` picks on a GPU."""
FREE_FRACTION = 0.8
"""Share of a GPU's free memory ``--batch-size auto`` plans to use (the rest absorbs fragmentation)."""
GIB = 2**30
GPU_FLOPS = 2e14
"""Sustained throughput (FLOP/s) the fit-cost estimate assumes for a bfloat16 forward pass on a GPU: about a
quarter of an H100's or H200's dense bfloat16 peak, what batched inference of 8B-class models reaches."""

T = TypeVar("T")


@dataclass(frozen=True)
class ModelShape:
    """The sizes that set a transformer's memory: blocks, residual width, query heads and their width,
    MLP width, vocabulary, and the parameter count (``None`` when unknown)."""

    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_params: int | None = None


def shape_of_hf_config(config: PretrainedConfig) -> ModelShape:
    """The :class:`ModelShape` of a Hugging Face ``PretrainedConfig`` (GPT-2, GPT-NeoX, GPT-J, Llama,
    Qwen2, Gemma naming), with the exact parameter count of the model it describes
    (:func:`count_parameters`)."""
    c = getattr(config, "text_config", None) or config

    def first(*names: str, default: Any = None) -> Any:
        for name in names:
            value = getattr(c, name, None)
            if value is not None:
                return value
        return default

    d_model = int(first("hidden_size", "n_embd", "d_model"))
    n_heads = int(first("num_attention_heads", "n_head"))
    return ModelShape(
        n_layers=int(first("num_hidden_layers", "n_layer")),
        d_model=d_model,
        n_heads=n_heads,
        d_head=int(first("head_dim", default=d_model // n_heads)),
        d_mlp=int(first("intermediate_size", "n_inner", default=4 * d_model) or 4 * d_model),
        d_vocab=int(first("vocab_size")),
        n_params=count_parameters(config),
    )


def shape_of_model(model: Model) -> ModelShape:
    """The :class:`ModelShape` of a loaded TransformerLens model (``HookedTransformer`` or
    ``TransformerBridge``), from its ``cfg`` and its parameters."""
    cfg = model.cfg
    n_params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else None
    return ModelShape(n_layers=int(cfg.n_layers), d_model=int(cfg.d_model), n_heads=int(cfg.n_heads),
                      d_head=int(cfg.d_head), d_mlp=int(getattr(cfg, "d_mlp", None) or 4 * cfg.d_model),
                      d_vocab=int(cfg.d_vocab), n_params=n_params)


def count_parameters(config: PretrainedConfig) -> int:
    """Parameters of the causal language model a Hugging Face config describes, counted on the ``meta``
    device (no memory is allocated; tied input and output embeddings count once)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def means_cache_bytes(shape: ModelShape, n_entries: int, n_pos: int) -> int:
    """Bytes of a CAMA :class:`~interventions.MeanCache` (float32): ``4 * n_layers * (n_entries * d_model +
    n_pos * d_model + n_pos * n_heads * d_head)``, ``n_entries`` = distinct ``(position, token)`` pairs
    of the fit set, ``n_pos`` = prompt length in tokens."""
    return 4 * shape.n_layers * (n_entries * shape.d_model + n_pos * shape.d_model
                                 + n_pos * shape.n_heads * shape.d_head)


def activation_bytes_per_prompt(shape: ModelShape, n_pos: int, dtype: str | None = None) -> int:
    """Bytes one prompt of ``n_pos`` tokens needs in a forward pass of the analyses, kept for every block
    (attribution patching keeps them for the backward pass): per block and position the residual stream,
    its normalised copies and the attention and MLP outputs (``6 * d_model``), the MLP hidden layer before
    and after the activation (``2 * d_mlp``) and the attention scores and pattern (``2 * n_heads * n_pos``),
    in ``dtype``; plus the logits in ``dtype`` and their float32 copy (``n_pos * d_vocab``). An upper
    estimate: a plain forward pass frees each block's activations as it goes."""
    b = DTYPE_BYTES[dtype or "float32"]
    per_block = 6 * shape.d_model + 2 * shape.d_mlp + 2 * shape.n_heads * n_pos
    return b * n_pos * shape.n_layers * per_block + (b + 4) * n_pos * shape.d_vocab


@dataclass(frozen=True)
class MemoryEstimate:
    """What a run needs, in bytes: ``weights`` (``n_params`` x bytes of ``dtype``), ``means`` (the CAMA
    cache), ``activations`` (one batch of ``batch_size`` prompts of ``n_pos`` tokens; ``per_prompt`` each)."""

    n_params: int
    dtype: str
    weights: int
    means: int
    per_prompt: int
    batch_size: int
    n_pos: int = 0

    @property
    def activations(self) -> int:
        return self.per_prompt * self.batch_size

    @property
    def total(self) -> int:
        return self.weights + self.means + self.activations

    def describe(self) -> str:
        """One line: ``memory estimate: weights 14.96 GiB (8.03B parameters, bfloat16) + ...``."""
        return (f"memory estimate: weights {self.weights / GIB:.2f} GiB ({self.n_params / 1e9:.2f}B parameters, "
                f"{self.dtype}) + CAMA means {self.means / GIB:.2f} GiB + activations {self.activations / GIB:.2f} "
                f"GiB (batch {self.batch_size}, {self.per_prompt / 2**20:.1f} MiB per prompt) = "
                f"{self.total / GIB:.2f} GiB")


def estimate_memory(shape: ModelShape, dtype: str | None, *, n_pos: int, n_prompts: int,
                    batch_size: int, n_entries: int | None = None) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of a run on ``n_prompts`` prompts of ``n_pos`` tokens. ``n_entries``
    (distinct ``(position, token)`` pairs of the means' fit set) defaults to its upper bound
    ``n_prompts * n_pos``."""
    if shape.n_params is None:
        raise ArgumentError("the model shape has no parameter count: read it with shape_of_hf_config or shape_of_model")
    dtype = dtype or "float32"
    entries = n_prompts * n_pos if n_entries is None else n_entries
    return MemoryEstimate(n_params=shape.n_params, dtype=dtype, weights=shape.n_params * DTYPE_BYTES[dtype],
                          means=means_cache_bytes(shape, entries, n_pos),
                          per_prompt=activation_bytes_per_prompt(shape, n_pos, dtype), batch_size=batch_size,
                          n_pos=n_pos)


def estimate_pretrained(name: str, dtype: str | None, task: TaskLike, n_prompts: int,
                        batch_size: int, fmt: PromptFormat | None = None) -> MemoryEstimate | None:
    """The estimate for pretrained model ``name`` on ``task``, from its config and tokenizer in the local
    Hugging Face cache (or the hub) or in a local model folder, before its weights load (:func:`read_pretrained`).
    ``n_pos`` is the longest tokenised prompt of a sample of the task in the prompt format ``fmt`` (a
    :class:`~circuits.tasks.formats.PromptFormat`; ``None``: zero-shot) plus BOS (:func:`prompt_lengths`). ``None``
    when the config or tokenizer cannot be read, or no model can be built from the config."""
    read = read_pretrained(name)
    if read is None:
        return None
    config, tokenizer = read
    try:
        shape = shape_of_hf_config(config)
    except (OSError, ValueError, KeyError, ImportError):  # an unknown model type, custom code: no estimate
        return None
    n_pos = max(prompt_lengths(task, n_prompts, tokenizer, fmt))
    return estimate_memory(shape, dtype, n_pos=n_pos, n_prompts=n_prompts, batch_size=batch_size)


def read_pretrained(name: str) -> tuple[PretrainedConfig, Any] | None:
    """``(config, tokenizer)`` of model ``name`` (a Hugging Face name in the local cache or the hub, a local
    model folder, a GGUF name or file), without its weights. A GGUF checkpoint is converted first (once,
    :func:`circuits.models.gguf.resolve`, whose :class:`~circuits.errors.ModelLoadError` propagates); a folder
    whose ``config.json`` does not fit its weights is refused (:func:`circuits.zoo.hf.check_size`). ``None`` when
    the config or the tokenizer cannot be read (not cached and offline, not a Hugging Face name, custom code)."""
    from transformers import AutoConfig, AutoTokenizer

    from circuits.models import gguf

    source = gguf.resolve(name)
    if (Path(str(source)).expanduser() / "config.json").is_file():  # a config that does not fit its weights
        from circuits.zoo.hf import check_size

        check_size(Path(str(source)).expanduser())
    try:
        return AutoConfig.from_pretrained(source), AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError, ImportError):  # loading says what is wrong
        return None


def prompt_lengths(task: TaskLike, n_prompts: int, tokenizer: Any, fmt: PromptFormat | None = None) -> list[int]:
    """Tokens of each prompt of a sample of ``task`` (at most 50 of ``n_prompts``, seed 0) in the prompt format
    ``fmt`` (``None``: zero-shot), BOS included: what a run's prompts are long (units: tokens)."""
    from circuits.tasks import catalogue as tasks

    sample = tasks.build_task(task, n=min(50, n_prompts), seed=0)
    if fmt is not None:
        sample = fmt.apply(sample, task, tokenizer)
    return [1 + len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in sample]


def host_memory_bytes() -> int | None:
    """This machine's physical memory (``os.sysconf`` pages times page size), in bytes; ``None`` where the
    system does not say."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def model_devices(model: Model) -> list[torch.device]:
    """The devices holding ``model``'s parameters (several when a device map spread it), CUDA ones first."""
    found = {p.device for p in model.parameters()}
    return sorted(found, key=lambda d: (d.type != "cuda", str(d)))


def print_estimate(name: str, dtype: str | None, task: TaskLike, n_prompts: int, batch_size: int,
                   fit: FitSpec | None = None, fmt: PromptFormat | None = None, device: str = "cuda") -> None:
    """Report ``NAME: memory estimate: ...`` (:func:`estimate_pretrained`) unless ``name`` is a zoo model
    or its config cannot be read; with ``fit`` (a :class:`~circuits.prompts.fitset.FitSpec`) also what fitting the
    means will cost (:func:`fit_cost`, on ``device``: ``"cpu"`` gives a CPU estimate); ``fmt``: the prompt format
    (few-shot prefixes lengthen every prompt).
    The lines go to the ``circuits.models.memory`` logger at INFO (the ``af1`` command line shows them on stderr)."""
    from circuits.logs import get_logger
    from circuits.models.loading import zoo_names

    log = get_logger("memory")
    estimate = None if name in zoo_names() else estimate_pretrained(name, dtype, task, n_prompts, batch_size, fmt)
    if estimate is not None:
        log.info("%s: %s", name, estimate.describe())
    from circuits.tasks import catalogue as tasks

    if fit is not None and task is not None and tasks.known_task(task):
        log.info("%s: %s", name, fit_cost(task, fit.size, batch_size, estimate, device=device))


def fit_cost(task: TaskLike, size: int, batch_size: int, estimate: MemoryEstimate | None = None, *,
             device: str = "cuda") -> str:
    """One line: the prompts the means will be fitted on (at most ``size``; the task's whole operand space
    when smaller, before top-up draws), the forward passes in batches of ``batch_size`` and, with a memory
    ``estimate`` (parameters, prompt length), the compute: ``2 * n_params`` FLOP per token, and its time on
    ``device``: at :data:`GPU_FLOPS` on a GPU, at the rate :func:`cpu_flops` measures on ``"cpu"``."""
    from circuits.tasks import catalogue as tasks

    space = tasks.operand_space_count(task)
    n_fit = min(int(size), space.n)
    passes = -(-n_fit // max(1, int(batch_size)))
    what = ("the whole operand space" if space.n <= size else
            f"a sample of {'the ' if space.exact else ''}{space.describe()} task prompts")
    line = f"means: fit set of up to {n_fit} prompts ({what}), {passes} forward passes of {batch_size}"
    if estimate is not None:
        flop = 2.0 * estimate.n_params * n_fit * estimate.n_pos
        amount = f"{flop / 1e12:.1f} TFLOP" if flop >= 1e11 else f"{flop / 1e9:.1f} GFLOP"
        if str(device).split(":")[0] == "cpu":
            rate = cpu_flops()
            where = (f"on this CPU ({rate / 1e9:.0f} GFLOP/s measured now, {torch.get_num_threads()} thread(s); "
                     f"other work on the machine slows it)")
        else:
            rate, where = GPU_FLOPS, f"on a GPU at {GPU_FLOPS / 1e12:.0f} TFLOP/s"
        line += f", {amount}: about {duration_text(flop / rate)} {where}"
    return line


def duration_text(seconds: float) -> str:
    """``seconds`` as ``under 0.1 s``, ``5.6 s``, ``4.5 min`` or ``2.1 h``."""
    if seconds < 0.1:
        return "under 0.1 s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


_CPU_RATE: list[float] = []


def cpu_flops() -> float:
    """Float32 matrix-multiply throughput of this CPU with torch's threads (FLOP/s), measured once per process
    (a few hundred milliseconds at most): what a forward pass of a model reaches at best on it."""
    if _CPU_RATE:
        return _CPU_RATE[0]
    import time

    a, b = torch.randn(256, 1024), torch.randn(1024, 1024)
    a @ b  # warm-up
    reps, start = 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - start < 0.05:
        a @ b
        reps += 1
    _CPU_RATE.append(2.0 * 256 * 1024 * 1024 * reps / (time.perf_counter() - start))
    return _CPU_RATE[0]


def free_cuda_bytes(devices: list[torch.device] | None = None) -> int:
    """Free memory of the fullest of ``devices`` (default: every visible CUDA device), in bytes: a model
    split over several GPUs is limited by the one with least room."""
    indices = [d.index or 0 for d in devices or () if d.type == "cuda"] or range(torch.cuda.device_count())
    return min(torch.cuda.mem_get_info(i)[0] for i in indices)


def auto_batch_size(per_prompt: int, devices: list[torch.device], n_prompts: int, *, reserve: int = 0,
                    free: int | None = None) -> int:
    """``--batch-size auto`` for a model on ``devices`` (:func:`model_devices`): :data:`AUTO_CPU_BATCH` unless
    it is on CUDA; there the largest batch whose activations (``per_prompt`` bytes each) fit in
    :data:`FREE_FRACTION` of the free memory (``free``, default :func:`free_cuda_bytes` of ``devices``,
    measured after the weights loaded) less ``reserve`` (the means cache), between 1 and
    :data:`MAX_AUTO_BATCH`. Never more than ``n_prompts``."""
    if not any(torch.device(d).type == "cuda" for d in devices):
        return max(1, min(AUTO_CPU_BATCH, n_prompts))
    room = FREE_FRACTION * (free_cuda_bytes([torch.device(d) for d in devices]) if free is None else free) - reserve
    return max(1, min(MAX_AUTO_BATCH, n_prompts, math.floor(room / per_prompt)))


def out_of_memory_errors() -> tuple[type[BaseException], ...]:
    """The exception classes torch raises when a device runs out of memory."""
    return tuple({getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), torch.cuda.OutOfMemoryError})


def halve_on_oom(evaluate: Callable[[int], T], batch_size: int, *, enabled: bool = True,
                 log: Callable[[str], object] = print) -> T:
    """``evaluate(batch_size)``; when ``enabled`` and it runs out of device memory, empty the CUDA cache,
    halve the batch and call it again (down to 1). ``evaluate`` must resume: the analyses skip the
    configurations already appended to the run's results file. Without ``enabled`` the error propagates
    (``af1`` then says to lower ``--batch-size``)."""
    while True:
        try:
            return evaluate(batch_size)
        except out_of_memory_errors():
            if not enabled or batch_size <= 1:
                raise
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            batch_size //= 2
            log(f"out of device memory: retrying with --batch-size {batch_size} (finished results are kept)")


def run_batched(batch_size: int | str, model: Model, tokens: Int[torch.Tensor, "batch pos"], dtype: str | None,
                evaluate: Callable[[int], T]) -> T:
    """``evaluate(batch_size)``; with ``batch_size="auto"`` the largest batch of ``tokens`` (``[n_prompts,
    n_pos]``) that fits on the devices of ``model`` with weights in ``dtype`` (:func:`auto_batch_size`, with
    the means cache reserved), halved and retried on a device out-of-memory error (:func:`halve_on_oom`; the
    analyses resume from the run's results file: nothing finished is lost)."""
    if batch_size != "auto":
        return evaluate(int(batch_size))
    n_prompts, n_pos = int(tokens.shape[0]), int(tokens.shape[1])
    shape = shape_of_model(model)
    per_prompt = activation_bytes_per_prompt(shape, n_pos, dtype)
    reserve = means_cache_bytes(shape, n_prompts * n_pos, n_pos)
    devices = model_devices(model)
    batch = auto_batch_size(per_prompt, devices, n_prompts, reserve=reserve)
    print(f"--batch-size auto: {batch} prompts per forward pass on {', '.join(map(str, devices))}")
    return halve_on_oom(evaluate, batch)

