"""Speed and memory of the AF1 search at real scale: a random-weight Llama-3-8B on one GPU, in one process.

Phases, each under a time budget (``PHASE_BUDGETS``, cut to what is left of ``--time-limit``); the JSON
file (``--out``) is rewritten after every phase, so a run stopped from outside keeps what it measured:

0. ``imports``: TransformerLens and the toolkit, so that a machine without them fails in seconds.
1. ``build``: a random-weight checkpoint with Meta-Llama-3-8B's configuration (32 blocks, width 4096, 32
   query and 8 key-value heads, MLP 14336, vocabulary 128256, rope theta 500000), written in ``--dtype``
   as an ordinary Hugging Face folder: the model is created on the meta device and materialised on the
   target device, weights drawn from N(0, 0.02), norm scales 1, a word-level tokenizer with BOS id 0.
2. ``estimate``: the toolkit's memory estimate (:mod:`circuits.models.memory`) from the folder's config, before
   any weight is loaded (at the batch the commands plan with before loading).
3. ``load``: ``circuits.models.loading.load_model(folder, backend=..., dtype=..., device=...)``.
4. ``prompts``: ``--prompts`` random prompts of the layout ``BOS A + B - C =`` (:data:`LAYOUT`) answered by
   the model's own top-1 token.
5. ``batch``: ``--batch-size`` (``auto``: :func:`circuits.models.memory.auto_batch_size`) resolved as ``af1 search``
   resolves it (the runner's :func:`circuits.models.memory.run_batched`).
6. ``means``: the CAMA means (``MeanCache.fit``) at that batch.
7. ``search``: the full-grid fast search (``search_af1(grid="full", method="fast")``), the batch halved on a
   device out-of-memory error as the commands do.
8. ``interventions``: the AF1-intervened forward pass against the plain one (best of ``--repeats``).
9. ``naive``: one complete intervened forward pass per configuration on ``--naive-configs`` configurations
   spread over the grid (as ``bench_search.py --naive-configs``), scaled to the full grid; their correctness
   counts against the fast search's (equal in float32; in bfloat16 a near tie may fall either way, see
   :func:`compare_counts`).

The ``summary`` of the JSON file holds the headline figures. Units: seconds, bytes (printed as GiB =
2**30 bytes). ``peak_bytes`` is ``torch.cuda.max_memory_allocated`` since the start of the phase
(``null`` on the CPU). The exit status is 0 when every phase ran and the naive sample agrees with the fast
search, else 1.

Usage, from the repository root: ``PYTHONPATH=. python benchmarks/gpu.py --out gpu.json`` (Llama-3-8B in
bfloat16 on the GPU; ``benchmarks/gpu.sh`` wraps it), ``--small`` (a 4-block Llama of width 64 on the CPU,
in seconds; ``tests/benchmarks/test_gpu_script.py`` runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

STARTED = time.perf_counter()
# Everything the run reads is built here: a hub lookup could only wait for a network the GPU machine lacks.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                 rms_norm_eps=1e-5, tie_word_embeddings=False)
"""Meta-Llama-3-8B's ``LlamaConfig`` fields (without the tokenizer's special-token ids)."""
SMALL = dict(LLAMA3_8B, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
"""A Llama-3-shaped model small enough for the CPU (grouped-query attention kept: 4 query, 2 key-value heads)."""
INIT_STD = 0.02
"""Standard deviation of the random weights (Llama's ``initializer_range``)."""

BOS = 0
OPERANDS = range(2, 102)
"""Token ids of the operands: 100 values, as the two-digit operands of ``add_sub``."""
PLUS, MINUS, EQUALS = 102, 103, 104
LAYOUT = (BOS, None, PLUS, None, MINUS, None, EQUALS)
FIT_PROMPTS = 10_000
"""Prompts the means are fitted on (the commands' default ``--fit-size``), never the scored ones."""
"""The prompt layout ``BOS A + B - C =`` (7 tokens, as ``add_sub`` on Llama-3's tokenizer); ``None``: an operand."""

PHASE_BUDGETS = {"imports": 60, "build": 150, "estimate": 30, "load": 180, "prompts": 30, "batch": 10, "means": 30,
                 "search": 150, "interventions": 30, "naive": 90}
"""Seconds each phase may take on a GPU before it is stopped (see :func:`run_phases` for what runs after a failure)."""
CPU_SLACK = 4
"""The budgets are multiplied by this on a CPU (the ``--small`` run of the tests), whose cores other processes
may keep busy: fitting the means of 10,000 prompts took 8-31 s there against a GPU budget of 30 s."""
ROUNDING = 0.1
"""Largest |fast - naive logit| / largest |logit| taken for rounding in half precision (the CPU measures 1-1.4%
in bfloat16 on 4 and 16 random blocks; a wrong intervention moves the logits by their own scale)."""
GIB = 2**30


# --- recording -----------------------------------------------------------------------------------------------
class OutOfTime(Exception):
    """A phase ran past its time budget."""


class PhaseFailed(Exception):
    """A phase raised; what it raised is in the record."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`OutOfTime` in the main thread once ``seconds`` have passed inside the block (checked
    between Python bytecodes: a single long native call finishes first)."""
    def expire(signum: int, frame: Any) -> None:
        raise OutOfTime(f"over its budget of {seconds:.1f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def is_cuda(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device (the only kind whose memory is measured)."""
    return device.type == "cuda"


def synchronize(device: torch.device) -> None:
    """Wait for the kernels queued on ``device`` (a no-op on the CPU), so that wall times cover them."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def peak_bytes(device: torch.device) -> int | None:
    """``torch.cuda.max_memory_allocated`` of ``device`` in bytes, ``None`` on the CPU."""
    return int(torch.cuda.max_memory_allocated(device)) if is_cuda(device) else None


def allocated_bytes(device: torch.device) -> int | None:
    """``torch.cuda.memory_allocated`` of ``device`` in bytes, ``None`` on the CPU."""
    return int(torch.cuda.memory_allocated(device)) if is_cuda(device) else None


class Report:
    """The run's JSON record at ``path``: rewritten whole (through a temporary file, then renamed) after
    every change, so that the file always holds a complete JSON document."""

    def __init__(self, path: Path, device: torch.device, time_limit_s: float):
        self.path = path
        self.device = device
        self.deadline = time.perf_counter() + time_limit_s  # from now: a caller may build a Report long after import
        self.data: dict[str, Any] = {"phases": {}}
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)

    def left_s(self) -> float:
        """Seconds left of ``--time-limit``."""
        return self.deadline - time.perf_counter()

    def phase(self, name: str, fn: Callable[[float], tuple[dict[str, Any], Any]]) -> Any:
        """Run ``fn(budget_s)``, which returns ``(figures, value)``, under the phase's budget; record the
        figures, the wall time and the peak device memory under ``phases.<name>``, and return ``value``.
        Raises :class:`PhaseFailed` after recording what ``fn`` raised."""
        budget = min(PHASE_BUDGETS[name] * (1 if is_cuda(self.device) else CPU_SLACK), self.left_s())
        rec: dict[str, Any] = {"status": "running", "budget_s": round(budget, 1)}
        self.data["phases"][name] = rec
        self.write()
        print(f"[{time.perf_counter() - STARTED:6.1f} s] {name} (budget {budget:.0f} s)")
        if is_cuda(self.device):
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        try:
            if budget <= 0:
                raise OutOfTime("no time left of --time-limit")
            with time_limit(budget):
                figures, value = fn(budget)
            rec.update(figures)
            rec["status"] = "ok"
            return value
        except Exception as err:
            rec["status"] = "out of time" if isinstance(err, OutOfTime) else "failed"
            rec["error"] = f"{type(err).__name__}: {err}"
            rec["traceback"] = traceback.format_exc()
            print(f"  {name} {rec['status']}: {rec['error']}")
            raise PhaseFailed(name) from err
        finally:
            rec["seconds"] = round(time.perf_counter() - start, 3)
            rec["peak_bytes"] = peak_bytes(self.device)
            rec["allocated_bytes"] = allocated_bytes(self.device)
            self.write()
            print(f"  {name}: {rec['seconds']:.1f} s" + (f", peak {rec['peak_bytes'] / GIB:.2f} GiB"
                                                          if rec["peak_bytes"] is not None else ""))


def environment(device: torch.device) -> dict[str, Any]:
    """Versions of Python and of the packages the run uses, and the device it runs on."""
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    env: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch_cuda": torch.version.cuda, "device": str(device),
        "versions": {d: version(d) for d in ("torch", "transformers", "transformer-lens", "tokenizers",
                                              "safetensors", "accelerate", "jaxtyping", "einops", "numpy")},
    }
    if is_cuda(device):
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, device_total_bytes=int(props.total_memory),
                   device_capability=f"{props.major}.{props.minor}")
    else:
        env.update(device_name=platform.processor() or platform.machine(), device_total_bytes=None)
    return env


# --- the checkpoint --------------------------------------------------------------------------------------------
def llama_config(fields: dict[str, Any]):
    """A ``LlamaConfig`` with ``fields`` and BOS/EOS id :data:`BOS` (the word-level tokenizer's)."""
    from transformers import LlamaConfig

    return LlamaConfig(**fields, bos_token_id=BOS, eos_token_id=BOS)


@torch.no_grad()
def random_llama(config: Any, device: torch.device, dtype: torch.dtype, seed: int):
    """A ``LlamaForCausalLM`` of ``config`` on ``device`` in ``dtype``: built on the meta device (no memory, no
    initialisation), then allocated on ``device`` and filled once: matrices from N(0, :data:`INIT_STD`), norm
    scales 1. The model has no persistent buffers, so every saved tensor is one of these."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(dtype)
    model = model.to_empty(device=device)
    params = dict(model.named_parameters())
    if set(model.state_dict()) != set(params):
        raise RuntimeError("the model holds persistent buffers, which to_empty leaves uninitialised")
    torch.manual_seed(seed)
    for p in params.values():
        p.normal_(0.0, INIT_STD) if p.dim() == 2 else p.fill_(1.0)
    return model.eval()


def build_checkpoint(config: Any, folder: Path, device: torch.device, dtype: torch.dtype, seed: int) -> dict[str, Any]:
    """Write a random :func:`random_llama` and a word-level tokenizer of the whole vocabulary (BOS id 0) into
    ``folder`` (``save_pretrained``); the device copy is freed afterwards. Returns the parameter count, the
    seconds of each step and the bytes written."""
    from interventions.tokenization import make_word_tokenizer

    start = time.perf_counter()
    model = random_llama(config, device, dtype, seed)
    synchronize(device)
    built = time.perf_counter()
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    saved = time.perf_counter()
    make_word_tokenizer(config.vocab_size).save_pretrained(folder)
    del model
    gc.collect()
    if is_cuda(device):
        torch.cuda.empty_cache()
    return {"n_params": n_params, "init_s": built - start, "save_s": saved - built,
            "tokenizer_s": time.perf_counter() - saved, "folder": str(folder),
            "bytes_on_disk": sum(f.stat().st_size for f in folder.iterdir() if f.is_file())}


@contextlib.contextmanager
def checkpoint_folder(n_bytes: int) -> Iterator[Path]:
    """A temporary folder for a checkpoint of about ``n_bytes``, removed afterwards: in ``/dev/shm`` (memory,
    so that writing and reading it cost no disk) when it has room for twice that, else in the system's
    temporary folder."""
    shm = Path("/dev/shm")
    root = shm if shm.is_dir() and shutil.disk_usage(shm).free > 2 * n_bytes else None
    with tempfile.TemporaryDirectory(prefix="af1-gpu-", dir=root) as name:
        yield Path(name)


# --- the toolkit's estimate, the model, the prompts ------------------------------------------------------------
def estimate_dict(estimate: Any) -> dict[str, Any]:
    """A :class:`circuits.models.memory.MemoryEstimate` as JSON figures (bytes), with its printed line."""
    return {"n_params": estimate.n_params, "dtype": estimate.dtype, "weights": estimate.weights,
            "means": estimate.means, "per_prompt": estimate.per_prompt, "batch_size": estimate.batch_size,
            "activations": estimate.activations, "total": estimate.total, "line": estimate.describe()}


def estimate_from_folder(folder: Path, dtype: str, n_pos: int, n_prompts: int, batch_size: int,
                         n_entries: int | None = None):
    """The toolkit's :class:`~circuits.models.memory.MemoryEstimate` of a search on ``n_prompts`` prompts of ``n_pos``
    tokens at ``batch_size``, from the checkpoint's ``config.json`` alone (no weight is read)."""
    from transformers import AutoConfig

    from circuits.models import memory

    shape = memory.shape_of_hf_config(AutoConfig.from_pretrained(folder))
    return memory.estimate_memory(shape, dtype, n_pos=n_pos, n_prompts=n_prompts, batch_size=batch_size,
                                  n_entries=n_entries)


def parameter_bytes(model: Any) -> int:
    """Bytes of ``model``'s parameters as loaded."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def layout_tokens(n_prompts: int, seed: int) -> torch.Tensor:
    """``[n_prompts, len(LAYOUT)]`` token ids of :data:`LAYOUT` on the CPU (where ``prepare_prompts`` returns
    them), the operands drawn uniformly from :data:`OPERANDS`."""
    g = torch.Generator().manual_seed(seed)
    slots = [i for i, token in enumerate(LAYOUT) if token is None]
    tokens = torch.tensor([0 if token is None else token for token in LAYOUT]).repeat(n_prompts, 1)
    tokens[:, slots] = torch.randint(OPERANDS.start, OPERANDS.stop, (n_prompts, len(slots)), generator=g)
    return tokens


# --- measurements ----------------------------------------------------------------------------------------------
def fast_search(model: Any, tokens: torch.Tensor, answers: torch.Tensor, cache: Any, batch_size: int,
                device: torch.device) -> tuple[Any, dict[str, Any]]:
    """The full-grid fast search at ``batch_size``, halved on a device out-of-memory error
    (:func:`circuits.models.memory.halve_on_oom`, as the commands do). Returns the :class:`SearchResult` and its
    figures: seconds of the search loop (``SearchResult.seconds``) and of the call, configurations, model
    calls, the batch that finished it and the fast tail."""
    from circuits.models import memory
    from circuits.search import FastEvaluator, search_af1

    used: list[int] = []

    def search(batch: int) -> Any:
        used.append(batch)
        return search_af1(model, tokens, answers, cache=cache, grid="full", method="fast", batch_size=batch,
                          progress=False)

    start = time.perf_counter()
    result = memory.halve_on_oom(search, batch_size)
    synchronize(device)
    call_s = time.perf_counter() - start
    tail = FastEvaluator(model, tokens[:2], answers[:2], cache, "cama", 2).tail
    return result, {"search_s": result.seconds, "call_s": call_s, "configurations": len(result.results),
                    "passes": result.passes, "n_prompts": result.n_prompts, "base_accuracy": result.base_accuracy,
                    "batch_sizes_tried": used, "tail": tail,
                    "selected": None if result.selected is None else list(result.selected.config)}


def time_forwards(model: Any, tokens: torch.Tensor, cache: Any, batch_size: int, repeats: int, budget_s: float,
                  device: torch.device) -> dict[str, Any]:
    """Best wall time over ``repeats`` rounds (fewer if ``budget_s`` runs out; one warm-up round first) of a
    plain forward pass over ``tokens`` in batches and of the same passes under the AF1 subgraph (CAMA after
    block ``n_layers // 2 - 1``, one transfer block), taking turns; and their ratio."""
    import interventions as iv

    n_layers = iv.adapt(model).info.n_layers
    wait, transfer = n_layers // 2 - 1, 1
    subgraph = iv.af1_subgraph(n_layers, wait, transfer, cache)
    batches = [b.to(device) for b in tokens.split(batch_size)]
    fns = {"plain": lambda: [model(b) for b in batches], "af1": lambda: [iv.run(model, b, subgraph) for b in batches]}
    best = {name: float("inf") for name in fns}
    start = time.perf_counter()
    with torch.inference_mode():
        for fn in fns.values():
            fn()
        rounds = 0
        while rounds < repeats and (rounds == 0 or time.perf_counter() - start < budget_s / 2):
            for name, fn in fns.items():
                synchronize(device)
                t0 = time.perf_counter()
                fn()
                synchronize(device)
                best[name] = min(best[name], time.perf_counter() - t0)
            rounds += 1
    return {"wait": wait, "transfer": transfer, "batch_size": batch_size, "rounds": rounds,
            "plain_s": best["plain"], "af1_s": best["af1"], "ratio": best["af1"] / best["plain"]}


def naive_sample(model: Any, tokens: torch.Tensor, answers: torch.Tensor, cache: Any, batch_size: int,
                 configs: list[tuple[int, int]], budget_s: float, device: torch.device) -> dict[str, Any]:
    """One complete intervened forward pass per configuration (``NaiveEvaluator``), timed, on the prompts the
    unmodified model answers correctly (as the search keeps them), over ``configs`` (in grid order) until
    ``budget_s`` have passed (at least one). Each configuration's last-position logits are compared with a
    ``FastEvaluator``'s (not timed): per configuration ``"wait,transfer"`` both correct counts, the largest
    |logit difference|, the largest |logit| (the scale it is measured against), and how many prompts the two
    evaluators judge differently."""
    from circuits.faithfulness import base_correct
    from circuits.search import FastEvaluator, NaiveEvaluator

    keep = base_correct(model, tokens, answers, batch_size=batch_size)
    kept = (tokens[keep], answers[keep], cache, "cama", batch_size)
    naive, fast = NaiveEvaluator(model, *kept), FastEvaluator(model, *kept)
    answers = answers[keep].to(device)
    per_config: dict[str, dict[str, Any]] = {}
    seconds, begun = 0.0, time.perf_counter()
    for wait, transfer in configs:
        if per_config and time.perf_counter() - begun > budget_s:
            break
        synchronize(device)
        start = time.perf_counter()
        logits = naive.last_logits(wait, transfer)
        synchronize(device)
        seconds += time.perf_counter() - start
        other = fast.last_logits(wait, transfer)
        correct, other_correct = logits.argmax(-1) == answers, other.argmax(-1) == answers
        per_config[f"{wait},{transfer}"] = {
            "naive": int(correct.sum()), "fast": int(other_correct.sum()),
            "max_logit_diff": float((logits - other).abs().max()), "logit_scale": float(logits.abs().max()),
            "prompts_judged_differently": int((correct != other_correct).sum())}
    return {"naive_s": seconds, "passes": naive.passes, "n_prompts": int(keep.sum()), "configs": per_config}


def compare_counts(fast: Any, naive: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The naive sample against the fast search: whether every sampled configuration has the same correct count
    (the configurations that differ, with both counts), the largest logit difference relative to the logit
    scale over the sample, and the verdict ``agreement``: ``"identical"`` (same counts), ``"rounding"`` (not in
    float32, and no logit further apart than :data:`ROUNDING` of the scale: rounding moves a near tie, a wrong
    computation moves every logit) or ``"differs"``."""
    fast_counts = {f"{r.wait},{r.transfer}": r.n_faithful for r in fast.results}
    differ = [{"config": c, "fast": fast_counts[c], "naive": rec["naive"]} for c, rec in naive["configs"].items()
              if fast_counts[c] != rec["naive"]]
    relative = max(rec["max_logit_diff"] / rec["logit_scale"] for rec in naive["configs"].values())
    agreement = "identical" if not differ else "rounding" if dtype != "float32" and relative <= ROUNDING else "differs"
    return {"compared": len(naive["configs"]), "counts_identical": not differ, "differences": differ,
            "max_relative_logit_diff": relative, "agreement": agreement}


# --- the phases ------------------------------------------------------------------------------------------------
def import_toolkit() -> tuple[dict[str, Any], None]:
    """Phase ``imports``: TransformerLens's bridge and the toolkit modules the run uses, with the seconds they take."""
    start = time.perf_counter()
    import transformer_lens.model_bridge  # noqa: F401

    bridge = time.perf_counter()
    import circuits.commands.common  # noqa: F401
    import circuits.models.loading  # noqa: F401
    import circuits.search  # noqa: F401

    return {"transformer_lens_s": bridge - start, "toolkit_s": time.perf_counter() - bridge}, None


def estimate_before_loading(folder: Path, dtype: str, n_pos: int, n_prompts: int,
                            batch_size: int) -> tuple[dict, None]:
    """Phase ``estimate``: the figures of :func:`estimate_from_folder`, printed as the commands print them."""
    estimate = estimate_from_folder(folder, dtype, n_pos, n_prompts, batch_size)
    print(f"  {folder}: {estimate.describe()}")
    return {"n_pos": n_pos, "n_prompts": n_prompts, "estimate": estimate_dict(estimate)}, None


def load(folder: Path, dtype: str, device: torch.device) -> tuple[dict, Any]:
    """Phase ``load``: ``circuits.models.loading.load_model`` on the folder (a ``TransformerBridge``); the parameters'
    bytes as loaded."""
    from circuits.models.loading import load_model

    model = load_model(str(folder), device=str(device), backend="bridge", dtype=dtype)
    synchronize(device)
    return {"backend": "bridge", "model_class": type(model).__name__, "parameter_bytes": parameter_bytes(model),
            "n_params": sum(p.numel() for p in model.parameters())}, model


def self_answered(model: Any, n_prompts: int, seed: int) -> tuple[dict, tuple[torch.Tensor, torch.Tensor]]:
    """Phase ``prompts``: :func:`layout_tokens` answered by the model's own top-1 token
    (``circuits.prompts.sampling.self_answer_prompts``)."""
    from circuits.prompts.sampling import self_answer_prompts

    tokens = layout_tokens(n_prompts, seed)
    prompts = self_answer_prompts(model, tokens)
    return {"n_prompts": n_prompts, "n_pos": int(tokens.shape[1]),
            "distinct_answers": int(prompts.answers.unique().numel())}, (prompts.tokens, prompts.answers)


def resolve_batch(model: Any, tokens: torch.Tensor, batch_size: int | str, dtype: str) -> tuple[dict[str, Any], int]:
    """Phase ``batch``: ``--batch-size`` as ``af1 search`` resolves it (the runner's ``memory.run_batched``; ``auto``: the
    largest batch whose activations fit in the free device memory, :func:`circuits.models.memory.auto_batch_size`),
    with the free device memory it saw (bytes; ``None`` on the CPU)."""
    from circuits.models import memory

    devices = memory.model_devices(model)
    free = memory.free_cuda_bytes(devices) if any(is_cuda(d) for d in devices) else None
    batch = memory.run_batched(batch_size, model, tokens, dtype, lambda chosen: chosen)
    return {"requested": batch_size, "batch_size": batch, "free_bytes": free,
            "devices": [str(d) for d in devices]}, batch


def fit_means(model: Any, tokens: torch.Tensor, batch_size: int, device: torch.device, seed: int
              ) -> tuple[dict, Any]:
    """Phase ``means``: ``MeanCache.fit`` at ``batch_size`` on a fit set of :data:`FIT_PROMPTS` other prompts of
    the layout (drawn with ``seed + 1``, without the scored ``tokens``: the default fit size of the commands)."""
    import interventions as iv
    from interventions.coverage import row_digests

    fit = layout_tokens(FIT_PROMPTS, seed + 1)
    fit = fit[~torch.isin(row_digests(fit), row_digests(tokens))]
    cache = iv.MeanCache.fit(model, fit, batch_size=batch_size, progress=False)
    synchronize(device)
    return {"batch_size": batch_size, "n_fit": int(len(fit)), "n_entries": int(len(cache.entry_pos))}, cache


def search_with_estimate(model: Any, tokens: torch.Tensor, answers: torch.Tensor, cache: Any, batch_size: int,
                         device: torch.device, folder: Path, dtype: str) -> tuple[dict, Any]:
    """Phase ``search``: :func:`fast_search`, and the toolkit's estimate for the batch it ran and the means'
    true entry count (to compare with the phase's peak memory)."""
    result, figures = fast_search(model, tokens, answers, cache, batch_size, device)
    estimate = estimate_from_folder(folder, dtype, int(tokens.shape[1]), int(tokens.shape[0]),
                                    figures["batch_sizes_tried"][-1], n_entries=int(len(cache.entry_pos)))
    print(f"  {figures['configurations']} configurations in {figures['search_s']:.2f} s, {figures['passes']} "
          f"model calls, batch {figures['batch_sizes_tried'][-1]}, tail {figures['tail']!r}")
    return {**figures, "estimate": estimate_dict(estimate)}, result


def naive_figures(model: Any, tokens: torch.Tensor, answers: torch.Tensor, cache: Any, batch_size: int,
                  sample: list[tuple[int, int]], grid: list[tuple[int, int]], fast: Any, budget_s: float,
                  device: torch.device, dtype: str) -> dict[str, Any]:
    """Phase ``naive``: :func:`naive_sample` scaled to the full grid (time and model calls, by configurations)
    and compared with the fast search (:func:`compare_counts`)."""
    naive = naive_sample(model, tokens, answers, cache, batch_size, sample, budget_s, device)
    done = len(naive["configs"])
    scale = len(grid) / done
    figures = {**naive, **compare_counts(fast, naive, dtype), "requested": len(sample), "grid": len(grid),
               "scale": scale, "full_grid_estimate_s": naive["naive_s"] * scale,
               "full_grid_passes_estimate": round(naive["passes"] * scale), "batch_size": batch_size}
    print(f"  {done} of {len(grid)} configurations in {naive['naive_s']:.2f} s, full grid about "
          f"{figures['full_grid_estimate_s']:.1f} s; agreement with the fast search: {figures['agreement']}")
    return figures


# --- the run -----------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from circuits.options import batch_size_argument

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write (rewritten after every phase)")
    parser.add_argument("--small", action="store_true", help="a 4-block Llama of width 64 instead of Llama-3-8B")
    parser.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16",
                        help="weights and activations (default bfloat16)")
    parser.add_argument("--prompts", type=int, default=200, help="prompts of the search (default 200)")
    parser.add_argument("--batch-size", type=batch_size_argument, default="auto",
                        help="prompts per forward pass, or auto (default)")
    parser.add_argument("--naive-configs", type=int, default=24,
                        help="configurations spread over the grid that get a naive pass (default 24; 0: all)")
    parser.add_argument("--naive-seconds", type=float, default=45.0,
                        help="no configuration of the naive phase starts after this many seconds of it (default 45)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of the forward-pass timing (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and prompts (default 0)")
    parser.add_argument("--time-limit", type=float, default=420.0,
                        help="seconds the whole run may take; later phases get what is left (default 420)")
    return parser.parse_args(argv)


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a run's record (``None`` for those a failed phase did not measure)."""
    p = data["phases"]

    def get(phase: str, *keys: str) -> Any:
        value: Any = p.get(phase, {})
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    fast_s, naive = get("search", "search_s"), p.get("naive", {})
    full = naive.get("full_grid_estimate_s")
    peak, estimated = get("search", "peak_bytes"), get("search", "estimate", "total")
    weights, estimated_weights = get("load", "parameter_bytes"), get("estimate", "estimate", "weights")
    return {
        "build_s": get("build", "seconds"), "load_s": get("load", "seconds"),
        "load_peak_bytes": get("load", "peak_bytes"),
        "configurations": get("search", "configurations"), "batch_size": get("batch", "batch_size"),
        "fast_s": fast_s, "fast_passes": get("search", "passes"), "naive_sample_s": naive.get("naive_s"),
        "naive_configs": naive.get("compared"), "naive_full_grid_estimate_s": full,
        "naive_full_grid_passes_estimate": naive.get("full_grid_passes_estimate"),
        "naive_over_fast": full / fast_s if full and fast_s else None,
        "counts_identical": naive.get("counts_identical"), "agreement": naive.get("agreement"),
        "max_relative_logit_diff": naive.get("max_relative_logit_diff"),
        "af1_over_plain_forward": get("interventions", "ratio"),
        "search_peak_bytes": peak, "search_estimate_bytes": estimated,
        "search_peak_over_estimate": peak / estimated if peak and estimated else None,
        "weights_bytes": weights, "weights_estimate_bytes": estimated_weights,
        "weights_over_estimate": weights / estimated_weights if weights and estimated_weights else None,
    }


def resolved_device(name: str | None) -> torch.device:
    """``--device`` (default: CUDA when available, else the CPU), with the index of a CUDA device made explicit."""
    device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    if is_cuda(device) and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def run_phases(report: Report, args: argparse.Namespace, config: Any, folder: Path) -> bool:
    """Every phase in order, recorded in ``report``; ``False`` when one failed. A failure up to ``means`` ends the
    run there (the later phases need what it makes); ``interventions`` runs whether or not the search did, and
    ``naive`` needs the search."""
    from circuits.models import memory  # torch alone: the other imports wait for phase "imports"

    device, dtype = report.device, args.dtype
    before = memory.AUTO_CPU_BATCH if args.batch_size == "auto" else args.batch_size  # as first_batch_size
    try:
        report.phase("imports", lambda _: import_toolkit())
        report.phase("build", lambda _: (build_checkpoint(config, folder, device, getattr(torch, dtype), args.seed),
                                         None))
        report.phase("estimate", lambda _: estimate_before_loading(folder, dtype, len(LAYOUT), args.prompts,
                                                                   before))
        model = report.phase("load", lambda _: load(folder, dtype, device))
        tokens, answers = report.phase("prompts", lambda _: self_answered(model, args.prompts, args.seed))
        batch = report.phase("batch", lambda _: resolve_batch(model, tokens, args.batch_size, dtype))
        cache = report.phase("means", lambda _: fit_means(model, tokens, batch, device, args.seed))
    except PhaseFailed:
        return False
    failed: list[str] = []

    def attempt(name: str, fn: Callable[[float], tuple[dict[str, Any], Any]]) -> Any:
        try:
            return report.phase(name, fn)
        except PhaseFailed:
            failed.append(name)
            return None

    fast = attempt("search", lambda _: search_with_estimate(model, tokens, answers, cache, batch, device, folder,
                                                              dtype))
    attempt("interventions", lambda budget: (time_forwards(model, tokens, cache, batch, args.repeats, budget, device),
                                             None))
    if fast is not None:
        from benchmarks.bench_search import spread
        from circuits.search import configurations

        grid = configurations(fast.n_layers)
        attempt("naive", lambda budget: (naive_figures(model, tokens, answers, cache, batch,
                                                       spread(grid, args.naive_configs), grid, fast,
                                                       min(args.naive_seconds, budget / 2), device, dtype), None))
    return not failed


def main(argv: list[str] | None = None) -> int:
    """Run every phase into ``--out``; 0 when all ran and the naive sample agrees with the fast search
    (:func:`compare_counts`), else 1."""
    args = parse_args(argv)
    device = resolved_device(args.device)
    fields = SMALL if args.small else LLAMA3_8B
    report = Report(Path(args.out), device, args.time_limit)
    report.data.update(command=sys.argv, args=vars(args), config=fields, init_std=INIT_STD,
                       environment=environment(device))
    report.write()
    from circuits.models import memory

    config = llama_config(fields)
    with checkpoint_folder(memory.count_parameters(config) * getattr(torch, args.dtype).itemsize) as folder:
        ok = run_phases(report, args, config, folder)
    report.data["summary"] = summary(report.data)
    report.data["total_s"] = time.perf_counter() - STARTED
    report.write()
    print(json.dumps(report.data["summary"], indent=1))
    return 0 if ok and report.data["summary"]["agreement"] in ("identical", "rounding") else 1


if __name__ == "__main__":
    sys.exit(main())
