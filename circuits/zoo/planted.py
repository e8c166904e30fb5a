"""A zoo model with a known, planted AF1 structure: ``arith-gpt2-af1``.

The model has the architecture and tokenizer of ``arith-gpt2`` (6 blocks) and is fine-tuned from its
weights on the six Original tasks while its attention is restricted *by construction*, in training
and in every forward pass after loading:

* non-last query rows attend only to BOS (position 0) and themselves in every block ("self-peek");
* the last query row self-peeks in blocks ``self_all`` (0, 1, 2, 5) and sees every earlier key in
  blocks ``last_full`` (3, 4).

So before block 3 each position's residual stream depends only on its own token (and BOS): CAMA at
``blocks.2.hook_resid_post`` is exact, the answer must be read from the operands in blocks 3-4, and
the AF1 search should select ``(wait=2, transfer=2)`` with faithfulness ~1.

The restriction is the toolkit's own :class:`interventions.Peek` hooks on ``hook_pattern``, attached
as *permanent* TransformerLens hooks (:func:`attach_planted_mask`); :func:`circuits.zoo.load` attaches
them whenever the model's ``config.json`` has a ``"planted"`` entry, e.g.
``{"self_all": [0, 1, 2, 5], "last_full": [3, 4]}``. Blocks are 0-indexed; BOS is at position 0.
"Last" means the last position of the tensor, so a batch must not be right-padded (one token layout
per batch).

Re-create the model with ``python -m circuits.zoo.planted train`` (deterministic given the seed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from circuits.zoo import MODELS_DIR
from circuits.zoo import train as _train

__all__ = ["PlantedConfig", "CONFIG", "planted_peeks", "attach_planted_mask", "check_spec", "train", "main"]

NAME = "arith-gpt2-af1"


@dataclass
class PlantedConfig:
    """Fine-tuning of the planted model: ``base`` weights, the planted mask ``planted`` (blocks where the
    last row self-peeks, ``self_all``, and where it sees every earlier key, ``last_full``; every other row
    self-peeks in every block), and the optimisation (``batch_size`` prompts of ONE task per step, tasks
    in turn; linear warmup then cosine to ``min_lr_frac * lr`` at ``steps``; stop once every task's
    held-out accuracy is >= ``stop_at`` at an evaluation, or after ``max_wall_s`` seconds)."""

    name: str = NAME
    base: str = "arith-gpt2"
    planted: dict[str, list[int]] = field(default_factory=lambda: {"self_all": [0, 1, 2, 5], "last_full": [3, 4]})
    steps: int = 3000
    batch_size: int = 256
    lr: float = 3e-4
    min_lr_frac: float = 0.05
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_n: int = 200
    stop_at: float = 0.95
    max_wall_s: float = 1800.0
    threads: int = 1


CONFIG = PlantedConfig()


def check_spec(spec: dict, n_layers: int) -> None:
    """``ValueError`` unless ``spec`` has integer lists ``self_all`` and ``last_full`` that together cover
    every block ``0..n_layers-1`` exactly once."""
    if not isinstance(spec, dict) or set(spec) != {"self_all", "last_full"}:
        raise ValueError(f"planted spec {spec!r} must be a dict with exactly the keys 'self_all' and 'last_full'")
    blocks = [*spec["self_all"], *spec["last_full"]]
    if sorted(blocks) != list(range(n_layers)):
        raise ValueError(f"planted spec {spec!r} must list every block 0..{n_layers - 1} exactly once")


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


def attach_planted_mask(model: Any, spec: dict) -> Any:
    """Attach the planted attention mask ``spec`` to ``model`` as permanent ``hook_pattern`` hooks (they
    survive ``model.reset_hooks()`` and ``iv.apply``), so a plain forward pass obeys it. Forbidden
    pattern entries become exactly 0 and each row is renormalised (differentiable). Returns ``model``."""
    import interventions as iv

    check_spec(spec, model.cfg.n_layers)
    adapter = iv.adapt(model)
    info = adapter.info
    for peek in planted_peeks(spec):
        peek.validate(info)
        for name, body in peek.hooks(None, info):
            adapter.hook_point(name).add_hook(body, dir="fwd", is_permanent=True)
    return model


# ------------------------------------------------------------------------------------------- training
def train_config(cfg: PlantedConfig) -> "_train.TrainConfig":
    """The :class:`circuits.zoo.train.TrainConfig` recorded for the planted model: the base model's
    architecture and data with this fine-tuning's optimisation (one phase)."""
    return dataclasses.replace(
        _train.get_config(cfg.base), name=cfg.name, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
        min_lr_frac=cfg.min_lr_frac, warmup=cfg.warmup, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
        seed=cfg.seed, eval_every=cfg.eval_every, eval_n=cfg.eval_n, stop_at=cfg.stop_at, init_from=cfg.base,
        phases=[], task_weights=None,
        description=(f"GPT-2-like ({cfg.base} architecture and tokenizer), fine-tuned from {cfg.base} with a "
                     f"planted AF1 attention structure (attention restricted by construction: {cfg.planted})."))


def _lr(step: int, cfg: PlantedConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + np.cos(np.pi * t)))


def _task_batch(data: "_train.TaskData", step: int, cfg: PlantedConfig) -> tuple[np.ndarray, np.ndarray]:
    """``batch_size`` rows of one task (one token length, no padding), drawn deterministically."""
    rng = np.random.default_rng([cfg.seed, step])
    pick = rng.integers(0, len(data.tokens), size=cfg.batch_size)
    return data.tokens[pick], data.answers[pick]


def train(cfg: PlantedConfig = CONFIG, out_dir: str | Path | None = None, ckpt_dir: str | Path | None = None,
          resume: bool = True, progress: bool = True) -> dict:
    """Fine-tune ``cfg.base`` under the planted mask and export it to ``out_dir`` (default the package's
    ``models/<name>``). Checkpoints (safetensors) go to ``ckpt_dir`` (default ``runs/zoo/<name>``) and
    are resumed with ``resume``. Returns the card dict."""
    import torch
    from safetensors.torch import load_file, save_file
    from tqdm import tqdm

    from circuits import zoo

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _train.require_hooked("training the planted model")
    torch.set_num_threads(cfg.threads)
    tcfg = train_config(cfg)
    out_dir = Path(out_dir) if out_dir else MODELS_DIR / cfg.name
    ckpt_dir = Path(ckpt_dir) if ckpt_dir else Path("runs") / "zoo" / cfg.name
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    model = zoo.load(cfg.base)  # same architecture, weights and tokenizer as the base model
    tokenizer = model.tokenizer
    attach_planted_mask(model, cfg.planted)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and not n.startswith(("embed", "pos_embed"))]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and not n.startswith(("embed", "pos_embed")))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=tcfg.betas)
    train_data, val_data = _train.build_splits(tcfg, tokenizer)
    state: dict[str, Any] = {"step": 0, "wall_s": 0.0, "history": [], "threads": cfg.threads,
                             "batch_size": cfg.batch_size, "lr": cfg.lr, "warmup": cfg.warmup,
                             "min_lr_frac": cfg.min_lr_frac, "d_vocab": len(tokenizer)}
    if resume and (ckpt_dir / "state.json").exists():
        state = json.loads((ckpt_dir / "state.json").read_text())
        model.load_state_dict(load_file(str(ckpt_dir / "checkpoint.safetensors")), strict=False)
        _train._load_optimizer(opt, model, ckpt_dir / "optimizer.safetensors")
        print(f"resuming {cfg.name} from step {state['step']}")

    def save_ckpt() -> None:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt_dir / "checkpoint.safetensors"))
        _train._save_optimizer(opt, model, ckpt_dir / "optimizer.safetensors")
        (ckpt_dir / "state.json").write_text(json.dumps(state, indent=1))

    t0 = time.time() - state["wall_s"]
    step = state["step"]
    bar = tqdm(total=cfg.steps, initial=step, desc=cfg.name, disable=not progress, mininterval=10)
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = _lr(step, cfg)
        toks, ans = _task_batch(train_data[step % len(train_data)], step, cfg)
        toks, ans = torch.from_numpy(toks), torch.from_numpy(ans)
        loss = _train.optimizer_step(model, opt, toks, ans, cfg.grad_clip)
        step += 1
        bar.update(1)
        state["step"], state["wall_s"] = step, time.time() - t0
        if step % cfg.eval_every == 0 or step == cfg.steps:
            model.eval()
            accs = {d.name: _train.accuracy(model, d) for d in val_data}
            model.train()
            state["history"].append({"step": step, "loss": loss.item(), "val": accs, "wall_s": round(state["wall_s"], 1)})
            bar.write(f"{cfg.name} step {step} loss {loss.item():.4f} " + " ".join(f"{k}={v:.3f}" for k, v in accs.items()))
            save_ckpt()
            if min(accs.values()) >= cfg.stop_at:
                bar.write(f"{cfg.name}: every task >= {cfg.stop_at}, stopping at step {step}")
                break
        if state["wall_s"] >= cfg.max_wall_s:
            bar.write(f"{cfg.name}: wall-time budget {cfg.max_wall_s:.0f} s spent, stopping at step {step}")
            break
    bar.close()
    save_ckpt()
    model.eval()
    return export(model, cfg, tcfg, out_dir, state)


def export(model: Any, cfg: PlantedConfig, tcfg: "_train.TrainConfig", out_dir: Path, state: dict,
           search_prompts: int = 4000) -> dict:
    """Write the model with :func:`circuits.zoo.train.export` (one phase: ``state``), then record the
    planted mask in ``config.json`` and the card, and the AF1 search on the result (:func:`af1_check` on
    the correct ones of ``search_prompts`` generated prompts). Returns the card dict."""
    card = _train.export(model, tcfg, out_dir, [state])
    mcfg = json.loads((out_dir / "config.json").read_text())
    mcfg["planted"] = cfg.planted
    (out_dir / "config.json").write_text(json.dumps(mcfg, indent=1))
    card["planted"] = {**cfg.planted, "note": "attention restricted by construction: permanent hook_pattern "
                       "hooks attached by circuits.zoo.load (non-last rows: BOS + self in every block; last row: "
                       "BOS + self in self_all blocks, every earlier key in last_full blocks)"}
    card["planted_train"] = dataclasses.asdict(cfg)
    card["af1_search"] = af1_check(out_dir, n_build=search_prompts)
    (out_dir / "card.json").write_text(json.dumps(card, indent=1))
    md = (out_dir / "card.md").read_text()
    md += ("\n## Planted structure (attention restricted by construction)\n\n"
           f"- every non-last position attends only to BOS and itself in every block;\n"
           f"- the last position attends only to BOS and itself in blocks {cfg.planted['self_all']} and to "
           f"every earlier position in blocks {cfg.planted['last_full']}.\n\n"
           "`circuits.zoo.load` attaches this mask as permanent `hook_pattern` hooks (from `config.json`'s "
           "`planted`), so every plain forward pass obeys it. Expected AF1 search result: "
           "(wait=2, transfer=2), faithfulness ~1.\n")
    (out_dir / "card.md").write_text(md)
    return card


def af1_check(model_dir: Path, task: str = "add_sub", n_build: int = 4000, threshold: float = 0.9) -> dict:
    """The full-grid AF1 search (CAMA) on the model saved in ``model_dir`` (loaded as ``zoo.load`` does,
    mask attached), on every prompt of ``n_build`` generated ``task`` prompts (seed 0) it answers
    correctly, in their largest layout. Returns the card entry: task, grid, ablation, threshold,
    n_prompts, base_accuracy, per-configuration faithfulness (``"wait,transfer"`` keys), summary line."""
    from circuits import zoo
    from circuits.loading import prepare_prompts
    from circuits.search import search_af1

    model = zoo.load_dir(model_dir)
    p = prepare_prompts(model, task, n_build, seed=0, min_prompts=1)
    res = search_af1(model, p.tokens, p.answers, threshold=threshold, grid="full", progress=False)
    return {"task": task, "grid": "full", "ablation": "cama", "threshold": threshold, "n_prompts": len(p),
            "base_accuracy": round(p.base_accuracy, 4),
            "faithfulness": {f"{r.wait},{r.transfer}": round(r.faithfulness, 4) for r in res.results},
            "summary": res.summary_line()}


def main(argv: list[str] | None = None) -> int:
    """``python -m circuits.zoo.planted train [--out DIR] [--fresh]``: re-create ``arith-gpt2-af1``."""
    p = argparse.ArgumentParser(prog="python -m circuits.zoo.planted", description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["train"])
    p.add_argument("--out", default=None, help="output folder (default: the package's models/arith-gpt2-af1)")
    p.add_argument("--ckpt", default=None, help="checkpoint folder (default: runs/zoo/arith-gpt2-af1)")
    p.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    p.add_argument("--max-wall-s", type=float, default=CONFIG.max_wall_s, help="stop after this many seconds")
    p.add_argument("--steps", type=int, default=CONFIG.steps, help="optimisation steps (cosine schedule length)")
    p.add_argument("--batch-size", type=int, default=CONFIG.batch_size, help="prompts per step (one task)")
    p.add_argument("--lr", type=float, default=CONFIG.lr, help="peak learning rate")
    p.add_argument("--eval-every", type=int, default=CONFIG.eval_every, help="steps between held-out evaluations")
    args = p.parse_args(argv)
    cfg = dataclasses.replace(CONFIG, max_wall_s=args.max_wall_s, steps=args.steps, batch_size=args.batch_size,
                              lr=args.lr, eval_every=args.eval_every)
    card = train(cfg, out_dir=args.out, ckpt_dir=args.ckpt, resume=not args.fresh)
    print(json.dumps(card["frozen_accuracy"], indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
