"""What the model commands share: their flags (declared once, on the fields of the specs and configs they set:
:mod:`circuits.flags`), the one place the flags become specs (:func:`specs_of`: a
:class:`~circuits.models.spec.ModelSpec`, a :class:`~circuits.prompts.spec.PromptSpec`, the
:class:`~circuits.options.RunOptions` and the command's config) and the checks made on them before anything is
loaded.

A command module has ``add_arguments(parser)``, ``spec(args)`` (the one place its ``argparse.Namespace`` is read),
``check(spec)`` (before anything loads) and ``run(spec) -> int``; :mod:`circuits.cli` calls them in that order. Every
check here runs before the model loads (``--threshold 2`` costs nothing), and every failure is an
:class:`~circuits.errors.ArgumentError` naming the flag, the value and the valid range.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuits.errors import ArgumentError, did_you_mean
from circuits.flags import add_flags, flag_fields, values
from circuits.models.spec import ModelSpec
from circuits.options import RunOptions, batch_size_argument
from circuits.prompts.fitspec import FitSpec
from circuits.prompts.spec import ONE_SOURCE, PromptSpec, check_prompt_count
from circuits.tasks.formats import PromptFormat
from circuits.validation import check_int, check_positive

if TYPE_CHECKING:
    from circuits.analyses import Analysis, AnalysisConfig, C, R
    from circuits.tasks.catalogue import TaskLike

__all__ = ["MAX_PROMPTS", "CommandSpecs", "add_common_arguments", "add_model_arguments", "add_prompt_arguments",
           "batch_size_argument", "check_config", "check_specs", "command_line", "specs_of"]

MAX_PROMPTS = 100_000
"""Upper bound of ``--n-prompts`` (prompts of one layout evaluated per configuration)."""
MODEL_FIELDS = ("name", "backend", "dtype", "device", "device_map", "max_memory", "remote")
"""The :class:`~circuits.models.spec.ModelSpec` fields a model command sets (``--model``, ``--backend``, ...)."""
BACKEND_FIELDS = ("backend", "remote", "dtype", "device_map", "max_memory")
"""The fields of how a model is built and placed (the sweep takes these without ``--model``)."""
PROMPT_FIELDS = ("task", "prompts", "n_prompts", "source", "seed", "max_checked", "prepend_bos", "numbers",
                 "fit_prompts")
"""The :class:`~circuits.prompts.spec.PromptSpec` fields a model command sets."""
FIT_PREFIX = "fit-"
"""The fit set's flags are its fields with this prefix (``--fit-size``)."""


def add_model_arguments(parser: argparse.ArgumentParser, fields: Iterable[str] = MODEL_FIELDS,
                        **defaults: object) -> None:
    """The model's flags (``--model``, ``--backend``, ``--remote``, ``--dtype``, ``--device``, ``--device-map``,
    ``--max-memory``; ``defaults`` by field name) and ``--threads``."""
    fields = tuple(fields)
    add_flags(parser, ModelSpec, fields, required=("name",) if "name" in fields else (), defaults=defaults)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: $AF1_THREADS, else torch's default, one per core); "
                             "1 is fastest on a machine whose cores other processes keep busy (docs/real_models.md)")


def add_prompt_arguments(parser: argparse.ArgumentParser, fields: Iterable[str] = PROMPT_FIELDS, *,
                         fit: bool = True, **defaults: object) -> None:
    """The prompts' flags: the :class:`~circuits.prompts.spec.PromptSpec` ``fields`` (``defaults`` by field name),
    the format's (``--shots``, ``--chat``) and, with ``fit``, the fit set's (``--fit-size``, ...)."""
    add_flags(parser, PromptSpec, fields, defaults=defaults)
    add_flags(parser, PromptFormat)
    if fit:
        add_flags(parser, FitSpec, prefix=FIT_PREFIX)


def add_common_arguments(parser: argparse.ArgumentParser, *, n_prompts: int = 200, batch_size: int = 128) -> None:
    """Every flag of a model command: the model, the prompts, the fit set, the format, ``--out``, ``--batch-size``
    and ``--no-progress``."""
    add_model_arguments(parser)
    add_prompt_arguments(parser, n_prompts=n_prompts)
    add_flags(parser, RunOptions, ("out", "batch_size", "progress"), required=("out",),
              defaults={"batch_size": batch_size})


def check_prompts_or_task(prompts: PromptSpec) -> None:
    """The task or the prompt dataset of a :class:`~circuits.prompts.spec.PromptSpec`, checked (exactly one of them is
    given, :meth:`~circuits.prompts.spec.PromptSpec.validate`): a task file or prompt file is read here, one line naming
    the file, the line or field, on any problem; ``--source frozen`` only with a task; ``--n-prompts`` at most
    the task's prompts or the dataset's rows."""
    if prompts.prompts is None:
        if prompts.task is None:
            raise ArgumentError(ONE_SOURCE)
        check_task(prompts.task, prompts.n_prompts, prompts.source, prompts.format.shots)
        return
    from circuits.prompts.datasets import prompts_label, read_prompts

    if prompts.source != "build":
        raise ArgumentError("--source frozen applies to a task: drop it with --prompts")
    rows = len(read_prompts(prompts.prompts))
    if prompts.n_prompts > rows:
        raise ArgumentError(f"--n-prompts {prompts.n_prompts} exceeds the {rows} rows of --prompts "
                            f"{prompts_label(prompts.prompts)}; give at most {rows}")
    if prompts.fit_prompts is not None:
        from circuits.prompts.datasets import fit_from_task
        from circuits.tasks.catalogue import TaskSpec

        if fit_from_task(prompts.fit_prompts):
            check_task(prompts.fit_prompts)
        else:
            assert not isinstance(prompts.fit_prompts, TaskSpec)  # a TaskSpec is a task
            read_prompts(prompts.fit_prompts)


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


def task_size(task: TaskLike) -> int:
    """Number of distinct prompts (operand tuples with an answer in range) of ``task`` (a name, task file or spec)."""
    from circuits.tasks import catalogue as tasks

    return tasks.operand_space_size(task)  # estimated for a space of more than 5 M tuples


def check_task(task: TaskLike, n_prompts: int | None = None, source: str = "build", shots: int = 0) -> None:
    """``ArgumentError`` for an unknown task or a task file that does not load (one line naming the file and the
    field), a frozen source the task has no set for, or more prompts than the task (or its frozen set) has, the
    ``shots`` solved examples not counted (:func:`circuits.prompts.spec.check_prompt_count`)."""
    from circuits.tasks import catalogue as tasks

    if isinstance(task, str) and tasks.task_path(task) is None and task not in tasks.list_tasks():
        known = tasks.list_tasks()
        raise ArgumentError(f"--task {task!r} is unknown; {did_you_mean(task, known)}known tasks: {', '.join(known)}, "
                            f"or the path of a task file (.toml / .json, see docs/tasks.md)")
    spec = tasks.get_task(task)  # a task file is read and checked here
    if source == "frozen" and not tasks.frozen_path(spec).exists():
        raise ArgumentError(f"--source frozen: task {tasks.task_label(task)!r} has no frozen set at "
                            f"{tasks.frozen_path(spec)}; use --source build (or write one: "
                            f"circuits.tasks.write_frozen_sets)")
    if n_prompts is not None:
        check_prompt_count(spec, n_prompts, source, shots)  # a frozen set is read and checked there
    elif source == "frozen":
        tasks.read_frozen(tasks.frozen_path(spec), spec.n_operands)  # one line naming the file and the line


def check_backend(remote: bool, backend: str | None, models: Sequence[str], batch_size: int | str | None,
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


def check_placement(batch_size: int | str | None, device_map: str | None, max_memory: str | None) -> None:
    """``--batch-size`` (an integer >= 1 or ``auto``), ``--device-map`` and ``--max-memory`` (which needs it)."""
    from circuits.models import placement

    if batch_size is not None and batch_size != "auto":
        check_positive("--batch-size", int(batch_size))
    if device_map is not None:
        placement.check_device_map(device_map)
    placement.parse_max_memory(max_memory)
    if max_memory is not None and device_map is None:
        raise ArgumentError("--max-memory needs --device-map (auto, balanced or sequential)")


def check_specs(specs: CommandSpecs) -> None:
    """The checks of a model command's specs before anything loads: the model name, ``--remote``, the prompt
    counts and seed, the batch size and placement, the task or prompt dataset, the device and ``--out``."""
    model, prompts = specs.model, specs.prompts
    check_model([model.name], model.remote)
    check_backend(model.remote, model.backend, [model.name], specs.options.batch_size, model.device_map)
    check_positive("--n-prompts", prompts.n_prompts, maximum=MAX_PROMPTS)
    check_int("--seed", prompts.seed, 0)
    check_placement(specs.options.batch_size, model.device_map, model.max_memory)
    if prompts.max_checked is not None:
        check_positive("--max-checked", prompts.max_checked)
    check_prompts_or_task(prompts)
    check_checked(prompts)
    check_device(model.device)
    check_out(specs.out)


def check_checked(prompts: PromptSpec) -> None:
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


def check_config(config: AnalysisConfig, *args: object) -> object:
    """``config.validate(*args)``, its :class:`~circuits.errors.ArgumentError` naming the flag instead of the field
    (``--target 1.5 is out of range`` for ``target=1.5 is out of range``): the config's own ``validate`` is the one
    check of its values, on the command line as in the API."""
    try:
        return config.validate(*args)
    except ArgumentError as err:
        raise ArgumentError(flag_message(str(err), type(config))) from None


def flag_message(message: str, cls: type) -> str:
    """``message`` with each ``field=`` of ``cls``'s flagged fields written as its flag (``--field ``)."""
    import re

    from circuits.flags import flag_name

    for name, (field, spec) in flag_fields(cls).items():
        message = re.sub(rf"(?<![\w-]){name}=", f"{flag_name(field, spec)} ", message)
    return message


# --- specs: the one place the flags are read ------------------------------------------------------
@dataclass(frozen=True)
class CommandSpecs:
    """What a model command's flags name, read once (:func:`specs_of`): the model (``ModelSpec``), the prompts
    (``PromptSpec``), how to run (``RunOptions``: the output directory, the batch size (an integer or ``"auto"``),
    progress bars, the command line recorded in ``summary.json``) and the command's analysis ``config``. No
    ``Namespace`` goes further."""

    model: ModelSpec
    prompts: PromptSpec
    options: RunOptions
    config: Any = None

    @property
    def out(self) -> str:
        return str(self.options.out)

    def run(self, analysis: Analysis[C, R]) -> R:
        """:func:`circuits.runner.run` of ``analysis`` with :attr:`config` on these specs (the batch size is theirs:
        ``config.batch_size`` is replaced)."""
        from circuits.runner import run

        return run(analysis, self.config, self.model, self.prompts, self.options)


def present(cls: type, args: argparse.Namespace, names: Iterable[str], prefix: str = "") -> list[str]:
    """The fields of ``names`` whose flags this command line has (a command may offer a subset)."""
    from circuits.flags import dest_of, flag_name

    fields = flag_fields(cls)
    return [n for n in names if hasattr(args, dest_of(flag_name(*fields[n], prefix)))]


def specs_of(args: argparse.Namespace, config: Any = None) -> CommandSpecs:
    """The :class:`CommandSpecs` of a model command's flags and its analysis ``config``. Raises
    :class:`~circuits.errors.ArgumentError` for values no spec takes (an unknown ``--source``, a bad fit set or
    format)."""
    model = ModelSpec(**values(ModelSpec, args, present(ModelSpec, args, MODEL_FIELDS)))
    fit = FitSpec(**values(FitSpec, args, present(FitSpec, args, flag_fields(FitSpec), FIT_PREFIX), prefix=FIT_PREFIX))
    fmt = PromptFormat(**values(PromptFormat, args, present(PromptFormat, args, flag_fields(PromptFormat))))
    prompts = PromptSpec(**values(PromptSpec, args, present(PromptSpec, args, PROMPT_FIELDS)), fit=fit, format=fmt)
    options = RunOptions(**values(RunOptions, args, ("out", "batch_size", "progress")),
                         command=tuple(command_line(args)))
    return CommandSpecs(model=model, prompts=prompts.validate(), options=options, config=config)


GLOBAL_FLAGS = ("command", "debug", "quiet", "log_file")
"""What the command line holds beside a command's own flags (how it reports, not what it runs): never recorded."""


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as an argv list (``af1 <command> --option value ...``), rebuilt from ``args``."""
    out = ["af1", str(args.command)]
    for key, value in vars(args).items():
        if key.startswith("_") or key in GLOBAL_FLAGS or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out
