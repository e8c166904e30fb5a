"""Loading a model by name and building the evaluation prompts of a task (shared by the commands).

* :func:`load_model`: a zoo model (``circuits.zoo``) by its name, otherwise a HuggingFace /
  TransformerLens model name through ``HookedTransformer.from_pretrained`` (3.x) or
  ``TransformerBridge.boot_transformers`` + ``enable_compatibility_mode()`` (``backend="bridge"``, the
  default on 4.x); needs the weights locally or network access, fails with a clear message otherwise.
* :func:`prepare_prompts`: task prompts -> single-token answers -> prompts the model answers correctly
  -> one layout (token length; CAMA needs aligned positions) -> at most ``n_prompts`` of them.

Conventions: BOS at position 0 of every prompt, the answer is the argmax of the logits at position -1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Int

SOURCES = ("build", "frozen")


@dataclass
class Prompts:
    """Evaluation prompts of one layout, all answered correctly by the unmodified model.

    Attributes:
        tokens: ``[batch, pos]`` token ids, BOS at position 0, one token length.
        answers: ``[batch]`` answer token ids (the expected argmax at the last position).
        prompts: prompt texts (without BOS), aligned with ``tokens``.
        answer_values: the integer answers, aligned with ``tokens``.
        base_accuracy: fraction of checked prompts (single-token answers) the model answers correctly.
        n_checked: number of prompts whose correctness was checked.
        n_correct: number of those answered correctly (all layouts).
        task: task name; ``source``: ``"build"`` (generated with ``seed``) or ``"frozen"``.
        n_layouts: number of token-length layouts among the correct prompts; only the largest is kept.
    """

    tokens: Int[torch.Tensor, "batch pos"]
    answers: Int[torch.Tensor, "batch"]
    prompts: list[str]
    answer_values: list[int]
    base_accuracy: float
    n_checked: int
    n_correct: int = 0
    task: str = ""
    source: str = "build"
    seed: int = 0
    n_layouts: int = 1
    n_dropped_multi_token: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def records(self) -> list[dict[str, Any]]:
        """One ``{"prompt", "answer", "answer_token"}`` dict per prompt (for ``prompts.jsonl``)."""
        return [
            {"prompt": p, "answer": int(a), "answer_token": int(t)}
            for p, a, t in zip(self.prompts, self.answer_values, self.answers.tolist())
        ]


def zoo_names() -> list[str]:
    """Names of the zoo models, or ``[]`` when the zoo is not installed."""
    try:
        from circuits import zoo
    except ImportError:
        return []
    return list(zoo.available())


DTYPES = ("float32", "float16", "bfloat16")


def load_model(name: str, device: str = "cpu", backend: str | None = None, dtype: str | None = None) -> Any:
    """The model called ``name`` on ``device``, in eval mode, on ``backend``, with weights in ``dtype``.

    ``backend``: ``"hooked"`` (``HookedTransformer``, TransformerLens 3.x) or ``"bridge"``
    (``TransformerBridge``); ``None`` picks ``"hooked"`` where it exists, else ``"bridge"`` (4.x).

    A zoo name (``circuits.zoo.available()``) loads the embedded zoo model. Any other name is a
    pretrained model (e.g. ``"gpt2"``, ``"meta-llama/Meta-Llama-3-8B"``): on ``"hooked"`` through
    ``HookedTransformer.from_pretrained``; on ``"bridge"`` through
    ``TransformerBridge.boot_transformers`` followed by ``enable_compatibility_mode()``, which applies
    the weight processing of 3.9's ``from_pretrained`` (folded LayerNorm, centred weights) so that
    logits and residual activations match it. Either needs the weights in the local Hugging Face cache
    or network access, and raises ``ValueError`` with the reason otherwise.

    ``dtype`` (one of :data:`DTYPES`, ``None``: the loader's default, float32) applies to pretrained
    models, e.g. ``"bfloat16"`` for Llama-3-8B on a GPU; zoo models ship in float32 only.
    """
    import torch

    import interventions as iv

    backend = iv.resolve_backend(backend)
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not valid: choose one of {', '.join(DTYPES)}")
    names = zoo_names()
    if name in names:
        from circuits import zoo

        if dtype not in (None, "float32"):
            raise ValueError(f"zoo model {name!r} ships in float32; dtype={dtype!r} applies to pretrained models")
        return zoo.load(name, device=device, backend=backend).eval()
    kwargs: dict[str, Any] = {"device": device}
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype)
    loader = ("HookedTransformer.from_pretrained" if backend == "hooked"
              else "TransformerBridge.boot_transformers")
    try:
        if backend == "hooked":
            from transformer_lens import HookedTransformer

            model = HookedTransformer.from_pretrained(name, **kwargs)
        else:
            from transformer_lens.model_bridge import TransformerBridge

            model = TransformerBridge.boot_transformers(name, **kwargs)
            model.enable_compatibility_mode()
    except ImportError as err:  # pragma: no cover - TransformerLens is a dependency
        raise ValueError(f"cannot load {name!r} on backend {backend!r}: {err}") from err
    except Exception as err:  # noqa: BLE001 - any failure becomes one clear user error
        zoo_hint = f"zoo models: {', '.join(names)}" if names else "the model zoo is not installed"
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(
            f"cannot load model {name!r}: it is not a zoo model ({zoo_hint}) and {loader} failed "
            f"({type(err).__name__}: {first}); pretrained models need their weights in the local "
            f"Hugging Face cache or network access"
        ) from err
    return model.eval()


def model_name(model: Any, default: str = "model") -> str:
    """A printable name of ``model`` (its config's ``model_name``)."""
    return str(getattr(getattr(model, "cfg", None), "model_name", None) or default)


def prepare_prompts(
    model: Any,
    task: str,
    n_prompts: int,
    seed: int = 0,
    *,
    source: str = "build",
    oversample: int = 3,
    min_prompts: int | None = None,
) -> Prompts:
    """Evaluation prompts of ``task`` that ``model`` answers correctly, in one layout.

    Pipeline: ``tasks.build_task(task, n=oversample*n_prompts, seed=seed)`` (or
    ``tasks.frozen_set(task)`` with ``source="frozen"``) -> ``filter_single_token`` ->
    ``filter_correct`` (base accuracy = correct / checked) -> ``to_layouts`` -> the layout with the most
    prompts -> its first ``n_prompts`` prompts.

    Raises ``ValueError`` if fewer than ``min_prompts`` (default: ``n_prompts``) correct prompts remain,
    saying how many there are and how to get more.
    """
    from circuits import tasks

    if not isinstance(n_prompts, int) or n_prompts < 1:
        raise ValueError(f"n_prompts={n_prompts!r} must be an integer >= 1")
    if source not in SOURCES:
        raise ValueError(f"source={source!r} is not valid: choose one of {', '.join(SOURCES)}")
    need = n_prompts if min_prompts is None else int(min_prompts)
    if source == "frozen":
        ds = tasks.frozen_set(task)
    else:
        ds = tasks.build_task(task, n=max(oversample, 1) * n_prompts, seed=seed)
    n_built = len(ds)
    ds, n_dropped = tasks.filter_single_token(ds, model)
    n_checked = len(ds)
    if n_checked == 0:
        raise ValueError(
            f"task {task!r}: none of the {n_built} prompts has a single-token answer for this model's "
            f"tokenizer; choose a task with smaller answers"
        )
    ds, base_acc = tasks.filter_correct(model, ds)
    n_correct = len(ds)
    layouts = tasks.to_layouts(model, ds) if n_correct else []
    if not layouts:
        raise ValueError(
            f"task {task!r}: the model answers none of the {n_checked} checked prompts correctly "
            f"(base accuracy 0%); choose a model trained on this task or an easier task"
        )
    best = max(layouts, key=lambda lay: int(lay.tokens.shape[0]))
    n_best = int(best.tokens.shape[0])
    if n_best < need:
        more = (
            "use --source build (more prompts)"
            if source == "frozen"
            else f"lower --n-prompts to {n_best} or less, or use a model that is more accurate on this task"
        )
        raise ValueError(
            f"too few correct prompts for task {task!r}: {n_correct} of {n_checked} checked prompts are "
            f"answered correctly (base accuracy {base_acc:.1%}), {n_best} of them in the largest layout "
            f"({best.tokens.shape[1]} tokens), but {need} are needed; {more}"
        )
    k = min(n_prompts, n_best)
    return Prompts(
        tokens=best.tokens[:k].long(),
        answers=torch.as_tensor(best.answers[:k], dtype=torch.long),
        prompts=list(best.prompts[:k]),
        answer_values=[int(v) for v in list(best.answer_values[:k])],
        base_accuracy=float(base_acc),
        n_checked=int(n_checked),
        n_correct=int(n_correct),
        task=task,
        source=source,
        seed=int(seed),
        n_layouts=len(layouts),
        n_dropped_multi_token=int(n_dropped),
    )


def self_answer_prompts(model: Any, tokens: Int[torch.Tensor, "batch pos"], task: str = "self") -> Prompts:
    """Prompts whose answers are the model's own argmax at the last position (base accuracy 1).

    For models without a task (e.g. randomly initialised ones): every prompt counts as answered
    correctly, so the AF1 search measures how much of the model's own prediction a subgraph keeps.
    """
    with torch.inference_mode():
        answers = model(tokens)[:, -1].argmax(-1).cpu()
    n = int(tokens.shape[0])
    return Prompts(
        tokens=tokens.long(),
        answers=answers,
        prompts=[" ".join(str(t) for t in row.tolist()) for row in tokens],
        answer_values=answers.tolist(),
        base_accuracy=1.0,
        n_checked=n,
        n_correct=n,
        task=task,
        source="self",
    )
