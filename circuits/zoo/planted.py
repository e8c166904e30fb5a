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
as *permanent* TransformerLens hooks (:func:`~circuits.zoo.mask.attach_planted_mask`);
:func:`circuits.zoo.load` attaches them whenever the model's recorded spec has a ``"planted"`` entry.

This module holds what is specific to the planted model: training under the mask (one task per
batch, so the last position is the last token of every row) with the shared trainer
(:mod:`circuits.zoo.trainer`), and the planted entries of its card. Re-create the model with
``planted.train(planted.CONFIG)`` (deterministic given the seed); ``af1 zoo train arith-gpt2-af1`` trains
its replacement, the ground truth ``arith-gpt2-gt-w2t2`` (:mod:`circuits.zoo.groundtruth`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from circuits.logs import get_logger
from circuits.zoo import MODELS_DIR, trainer
from circuits.zoo import export as _export
from circuits.zoo.build import require_hooked
from circuits.zoo.data import accuracy, build_splits, task_batch
from circuits.zoo.mask import attach_planted_mask, check_spec, planted_peeks
from circuits.zoo.recipes import PLANTED, PlantedConfig, planted_train_config
from interventions.types import Model

__all__ = ["NAME", "PlantedConfig", "CONFIG", "planted_peeks", "attach_planted_mask", "check_spec",
           "train_config", "train", "export"]

NAME = PLANTED.name
CONFIG = PLANTED
"""The recipe of the shipped model (:data:`circuits.zoo.recipes.PLANTED`)."""
train_config = planted_train_config


def train(cfg: PlantedConfig = CONFIG, out_dir: str | Path | None = None, ckpt_dir: str | Path | None = None,
          resume: bool = True, progress: bool = True, check: Callable[[Path], dict] | None = None) -> dict:
    """Fine-tune ``cfg.base`` under the planted mask and export it to ``out_dir`` (default the package's
    ``models/<name>``). Checkpoints (safetensors) go to ``ckpt_dir`` (default ``runs/zoo/<name>``) and
    are resumed with ``resume``. ``check`` (see :func:`export`) records the AF1 search on the card.
    Returns the card dict."""
    import torch

    from circuits import zoo

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require_hooked("training the planted model")
    torch.set_num_threads(cfg.threads)
    tcfg = train_config(cfg)
    out_dir = Path(out_dir) if out_dir else MODELS_DIR / cfg.name
    ckpt_dir = Path(ckpt_dir) if ckpt_dir else Path("runs") / "zoo" / cfg.name
    model = zoo.load(cfg.base)  # same architecture, weights and tokenizer as the base model
    attach_planted_mask(model, cfg.planted)
    opt = trainer.make_optimizer(model, tcfg)
    assert model.tokenizer is not None  # zoo models ship their tokenizer
    state = trainer.start(model, opt, tcfg, ckpt_dir, resume, len(model.tokenizer))
    if state["step"]:
        get_logger("zoo").info("resuming %s from step %s", cfg.name, state["step"])
    if not trainer.phase_done(state, tcfg):
        train_data, val_data = build_splits(tcfg, model.tokenizer)
        state = trainer.loop(model, opt, tcfg, state, batch=lambda step: task_batch(train_data, step, tcfg),
                             evaluate=lambda: {d.name: accuracy(model, d) for d in val_data},
                             ckpt_dir=ckpt_dir, label=cfg.name, progress=progress)
    model.eval()
    return export(model, cfg, tcfg, out_dir, state, check=check)


def export(model: Model, cfg: PlantedConfig, tcfg, out_dir: Path, state: dict,
           check: Callable[[Path], dict] | None = None) -> dict:
    """Write the model with :func:`circuits.zoo.export.export` (one phase: ``state``), then record the
    planted mask in its ``zoo.json`` and card. ``check(out_dir)``, if given, is run on the written model and
    its result stored on the card as ``af1_search`` (``af1 zoo train`` passes the AF1 search,
    :func:`circuits.groundtruth.af1_check`). Returns the card dict."""
    out_dir = Path(out_dir)
    card = _export.export(model, tcfg, out_dir, [state], meta={"planted": cfg.planted})
    card["planted"] = {**cfg.planted, "note": "attention restricted by construction: permanent hook_pattern "
                       "hooks attached by circuits.zoo.load (non-last rows: BOS + self in every block; last row: "
                       "BOS + self in self_all blocks, every earlier key in last_full blocks)"}
    card["planted_train"] = dataclasses.asdict(cfg)
    if check is not None:
        card["af1_search"] = check(out_dir)
    (out_dir / "card.json").write_text(json.dumps(card, indent=1))
    md = (out_dir / "card.md").read_text()
    md += ("\n## Planted structure (attention restricted by construction)\n\n"
           f"- every non-last position attends only to BOS and itself in every block;\n"
           f"- the last position attends only to BOS and itself in blocks {cfg.planted['self_all']} and to "
           f"every earlier position in blocks {cfg.planted['last_full']}.\n\n"
           "`circuits.zoo.load` attaches this mask as permanent `hook_pattern` hooks (from the recorded "
           "`planted` spec), so every plain forward pass obeys it. Expected AF1 search result: "
           "(wait=2, transfer=2), faithfulness ~1.\n")
    (out_dir / "card.md").write_text(md)
    return card


if __name__ == "__main__":  # pragma: no cover
    print("DEPRECATED: `python -m circuits.zoo.planted train` trains the former mask-based arith-gpt2-af1; "
          "`af1 zoo train arith-gpt2-gt-w2t2` trains the ground truth that replaces it (docs/groundtruth.md). "
          "Running the former recipe (planted.train(planted.CONFIG)); options are ignored", file=sys.stderr)
    from circuits.groundtruth.recovery import af1_check  # the script's own check (the library takes check=)

    train(CONFIG, resume="--fresh" not in sys.argv, check=af1_check)
