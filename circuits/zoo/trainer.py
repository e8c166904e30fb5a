"""The zoo's training loop: one optimiser step, the learning-rate schedule, checkpoints and resume.

Objective: cross-entropy of the answer token at the last prompt position only (BOS at position 0, the
prompt right-padded inside a batch; causal attention makes the padding invisible to earlier positions).
Optimiser: AdamW, weight decay on every matrix except the embeddings, gradient norm clipped; the LR
follows a linear warmup then a cosine decay (:func:`lr_at`). The batch of each step comes from a
function of the step alone (see :mod:`circuits.zoo.data`) and the initial weights from the recipe's
seed, so a run is a deterministic function of its seed whether or not it was interrupted.

Checkpoints (``<ckpt_dir>/checkpoint.safetensors`` + ``optimizer.safetensors`` + ``state.json``) hold the
weights, the full AdamW state (``exp_avg``/``exp_avg_sq``/``step`` per parameter, as safetensors, no
pickle) and the step; :func:`start` resumes from them with the same LR schedule and data.

Works on a ``HookedTransformer`` (TransformerLens 3.x) and on a Hugging Face causal LM (plain PyTorch,
any TransformerLens; see :func:`circuits.zoo.build.new_model`).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from circuits.zoo.build import load_weights
from circuits.zoo.hf import is_hf
from circuits.zoo.recipes import TrainConfig

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float

__all__ = ["check_out_folder", "lr_at", "make_optimizer", "save_optimizer", "load_optimizer", "save_checkpoint",
           "checkpoint_step", "held", "phase_done", "start", "last_logits", "optimizer_step", "loop"]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup for ``cfg.warmup`` steps, then cosine decay to ``min_lr_frac * lr`` at ``cfg.steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with ``cfg.lr``/``cfg.betas``; ``cfg.weight_decay`` on every matrix except the token and
    position embeddings (``embed``/``pos_embed`` of a HookedTransformer, ``nn.Embedding`` modules of a
    Hugging Face model), no decay on vectors."""
    import torch

    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}

    def decayed(n: str, p) -> bool:
        return p.ndim >= 2 and not n.startswith(("embed", "pos_embed")) and id(p) not in embeddings

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if decayed(n, p)], "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in named if not decayed(n, p)], "weight_decay": 0.0}]
    beta1, beta2 = cfg.betas
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(beta1, beta2))


def save_optimizer(opt, model, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write the AdamW state of every parameter as safetensors (``<param name>::<state key>``), atomically
    (:func:`circuits.store.atomic.write_with`)."""
    import torch
    from safetensors.torch import save_file

    from circuits.store.atomic import write_with

    names = {id(p): n for n, p in model.named_parameters()}
    flat = {}
    for group in opt.param_groups:
        for p in group["params"]:
            for k, v in opt.state.get(p, {}).items():
                flat[f"{names[id(p)]}::{k}"] = torch.as_tensor(v).detach().clone().contiguous()
    write_with(path, lambda tmp: save_file(flat, str(tmp), metadata=metadata))


def load_optimizer(opt, model, path: Path) -> None:
    """Restore the AdamW state written by :func:`save_optimizer` into ``opt`` (same parameter names)."""
    from safetensors.torch import load_file

    params = dict(model.named_parameters())
    for key, v in load_file(str(path)).items():
        pname, k = key.split("::")
        opt.state[params[pname]][k] = v


def save_checkpoint(model, opt, state: dict, ckpt_dir: Path) -> None:
    """Weights, optimiser state and ``state`` (step, wall time, history) into ``ckpt_dir``, each file through
    the atomic writer (:mod:`circuits.store.atomic`), ``state.json`` last; both weight files record the step, so a
    command killed between the files is caught on resume (:func:`start`)."""
    from safetensors.torch import save_file

    from circuits.store.atomic import write_text, write_with

    tag = {"step": str(state["step"])}
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    write_with(ckpt_dir / "checkpoint.safetensors", lambda tmp: save_file(weights, str(tmp), metadata=tag))
    save_optimizer(opt, model, ckpt_dir / "optimizer.safetensors", metadata=tag)
    write_text(ckpt_dir / "state.json", json.dumps(state, indent=1))


def checkpoint_step(path: Path) -> int | None:
    """The step :func:`save_checkpoint` recorded in a weight file (``None`` for a file of an earlier version)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        step = (f.metadata() or {}).get("step")
    return int(step) if step is not None and step.isdigit() else None


def check_out_folder(out_dir: Path, name: str, continue_from: Path | None = None) -> None:
    """:class:`~circuits.errors.ArgumentError`, before anything is written or loaded, when training ``name`` into
    ``out_dir`` would replace a model it should not: the folder continued from (``--continue-from``: the
    continued model would overwrite the weights it started from) or a folder whose ``card.json`` names another
    model (e.g. ``--out`` pointing at another zoo model's folder)."""
    from circuits.errors import ArgumentError

    out_dir = Path(out_dir)
    if continue_from is not None and out_dir.exists() and out_dir.resolve() == Path(continue_from).resolve():
        raise ArgumentError(f"--out {out_dir} is the folder --continue-from reads: the continued model would replace "
                            f"the one it starts from; give another --out")
    card = out_dir / "card.json"
    if card.is_file():
        try:
            other = json.loads(card.read_text()).get("name")
        except (OSError, ValueError, AttributeError):
            other = None
        if other != name:
            held_model = f"the model {other!r}" if isinstance(other, str) else "a model card af1 cannot read"
            raise ArgumentError(f"--out {out_dir} holds {held_model} ({card.name}): training {name} there would "
                                f"replace it; give a new or empty --out (or that model's own folder)")


@contextlib.contextmanager
def held(*folders: Path) -> Iterator[None]:
    """Hold ``folders`` (each once) as every command holds its directory (:class:`circuits.runner.Run`: created
    if needed, locked, refused when it holds links or another command's results, leftovers of a killed write
    removed)."""
    from circuits.runner import Run

    with contextlib.ExitStack() as stack:
        seen: set[Path] = set()
        for folder in folders:
            key = Path(folder).resolve()
            if key not in seen:
                seen.add(key)
                stack.enter_context(Run(folder, "zoo train"))
        yield


def phase_done(state: dict, cfg: TrainConfig) -> bool:
    """Whether a run in ``state`` has finished: all ``cfg.steps`` steps, or stopped early on accuracy."""
    return state["step"] >= cfg.steps or bool(state.get("stopped_early"))


def start(model, opt, cfg: TrainConfig, ckpt_dir: Path, resume: bool, d_vocab: int,
          init: Callable[[], None] | None = None) -> dict:
    """The state a run starts from. With ``resume`` and a checkpoint in ``ckpt_dir``: its weights into
    ``model``, its optimiser state into ``opt`` (unless the run is finished, :func:`phase_done`) and its
    state dict. Otherwise ``init()`` (e.g. load a base model's weights) and a fresh state at step 0."""
    from safetensors.torch import load_file

    from circuits.errors import CorruptRunError
    from circuits.store.atomic import clean_temporaries

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    clean_temporaries(ckpt_dir)
    if resume and (ckpt_dir / "state.json").exists():
        state = json.loads((ckpt_dir / "state.json").read_text())
        for name in ("checkpoint.safetensors", "optimizer.safetensors"):
            step = checkpoint_step(ckpt_dir / name) if (ckpt_dir / name).exists() else None
            if step is not None and step != state.get("step"):
                raise CorruptRunError(f"{ckpt_dir / name} holds step {step} but {ckpt_dir / 'state.json'} step "
                                      f"{state.get('step')}: the checkpoint was killed half-way through; rerun with "
                                      f"--no-resume, or remove {ckpt_dir} to start this phase over")
        load_weights(model, load_file(str(ckpt_dir / "checkpoint.safetensors")), f"{ckpt_dir} checkpoint")
        if not phase_done(state, cfg):
            load_optimizer(opt, model, ckpt_dir / "optimizer.safetensors")
        return state
    if init is not None:
        init()
    return {"step": 0, "wall_s": 0.0, "history": [], "good_evals": 0, "d_vocab": d_vocab}


def last_logits(model, tokens, last=None) -> Float[torch.Tensor, "batch d_vocab"]:
    """Logits ``[batch, vocab]`` at index ``last`` of each row (``None``: the final position). On a
    ``HookedTransformer`` only that position is normed and unembedded, on a Hugging Face causal LM only
    that position goes through ``lm_head``."""
    import torch

    rows = torch.arange(len(tokens))
    if is_hf(model):  # the backbone ends with the final norm; the head runs on the answer positions only
        hidden = model.base_model(input_ids=tokens).last_hidden_state
        hidden = hidden[:, -1] if last is None else hidden[rows, last]
        return model.get_output_embeddings()(hidden)
    resid = model(tokens, stop_at_layer=model.cfg.n_layers)
    resid = resid[:, -1] if last is None else resid[rows, last]
    return model.unembed(model.ln_final(resid[:, None]))[:, 0]


def optimizer_step(model, opt, tokens, answers, grad_clip: float, last=None) -> Float[torch.Tensor, ""]:
    """One optimiser step on the cross-entropy of ``answers`` predicted at index ``last`` of each row
    (``None``: the final position), gradient norm clipped to ``grad_clip``. Returns the loss."""
    import torch
    import torch.nn.functional as F

    loss = F.cross_entropy(last_logits(model, tokens, last), answers)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss


def loop(model, opt, cfg: TrainConfig, state: dict, batch: Callable[[int], tuple], evaluate: Callable[[], dict],
         ckpt_dir: Path, label: str, progress: bool = True) -> dict:
    """Train ``model`` in place from ``state["step"]`` to ``cfg.steps`` and return the final state.

    ``batch(step)`` gives ``(tokens, last index or None, answers)`` as numpy arrays; ``evaluate()`` gives
    held-out accuracy per task (called in eval mode every ``cfg.eval_every`` steps and at the end). Stops
    early once every task reaches ``cfg.stop_at`` at ``cfg.stop_after`` evaluations in a row, or once
    ``cfg.max_wall_s`` seconds are spent. Checkpoints every ``cfg.ckpt_every`` steps and at the end."""
    import torch
    from tqdm import tqdm

    state.update(threads=torch.get_num_threads(), batch_size=cfg.batch_size, lr=cfg.lr, warmup=cfg.warmup,
                 min_lr_frac=cfg.min_lr_frac)
    state.setdefault("good_evals", 0)
    model.train()
    t0 = time.time() - state["wall_s"]
    step = state["step"]
    bar = tqdm(total=cfg.steps, initial=step, desc=label, disable=not progress, mininterval=5)
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        toks, last, ans = batch(step)
        loss = optimizer_step(model, opt, torch.from_numpy(toks), torch.from_numpy(ans), cfg.grad_clip,
                              last=None if last is None else torch.from_numpy(last))
        step += 1
        bar.update(1)
        state["step"], state["wall_s"] = step, time.time() - t0
        if step % cfg.eval_every == 0 or step == cfg.steps:
            model.eval()
            accs = evaluate()
            model.train()
            state["history"].append({"step": step, "loss": loss.item(), "val": accs,
                                     "wall_s": round(state["wall_s"], 1)})
            worst = min(accs.values())
            bar.write(f"{label} step {step} loss {loss.item():.4f} min-val {worst:.3f} "
                      + " ".join(f"{k}={v:.3f}" for k, v in accs.items()))
            state["good_evals"] = state["good_evals"] + 1 if worst >= cfg.stop_at else 0
            if state["good_evals"] >= cfg.stop_after:
                bar.write(f"{label}: every task >= {cfg.stop_at} at {cfg.stop_after} evaluation(s), stopping")
                state["stopped_early"] = True
                break
        if step % cfg.ckpt_every == 0:
            save_checkpoint(model, opt, state, ckpt_dir)
        if cfg.max_wall_s is not None and state["wall_s"] >= cfg.max_wall_s:
            bar.write(f"{label}: wall-time budget {cfg.max_wall_s:.0f} s spent, stopping at step {step}")
            break
    bar.close()
    state["wall_s"] = time.time() - t0
    save_checkpoint(model, opt, state, ckpt_dir)
    model.eval()
    return state
