"""Cost of edge attribution against exact edge patching, measured side by side in one run.

On a zoo model (default ``arith-llama``, grouped-query attention) and ``--prompts`` prompts of task ``add``:

* EAP and EAP-IG (``--steps``) over every edge of the position-aware graph: wall time (one call scores all);
* exact edge patching: one patched pass per edge over the same prompts, timed on ``--sample`` edges and
  scaled to every edge;
* the ratio exact / EAP-IG (how many times faster attribution is than patching every edge), the same against
  a floor for any exact patching (one plain forward pass per edge), and the cost of one graph pass (a copy of
  each prompt per query position) relative to a plain forward pass.

Usage: ``python benchmarks/bench_edges.py [--model arith-llama] [--prompts 32] [--steps 5] [--sample 40]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import interventions as iv
from circuits import zoo
from circuits.edges import scores as sc
from circuits.edges.analysis import layout_of
from circuits.edges.circuit import circuit_metrics, removal_of
from circuits.prompts.sampling import prepare_prompts


def timed(fn, repeats: int = 3) -> float:
    """Best wall time of ``fn()`` over ``repeats`` calls (seconds)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="arith-llama")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--sample", type=int, default=40)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = zoo.load(args.model)
    ad = iv.adapt(model)
    p = prepare_prompts(model, "add", args.prompts, progress=False)
    tokens, answers = p.tokens, p.answers
    layout = layout_of(ad.info, int(tokens.shape[1]), 1, True)
    counter = sc.counterfactual("corrupted", ad, layout, tokens)
    n = len(tokens)
    t_eap = timed(lambda: sc.attribute(ad, layout, tokens, answers, counter, method="eap", batch_size=n))
    t_ig = timed(lambda: sc.attribute(ad, layout, tokens, answers, counter, method="eap-ig", steps=args.steps,
                                      batch_size=n))
    rows = np.random.default_rng(0).choice(layout.n_edges(), args.sample, replace=False)
    all_rows = np.arange(layout.n_edges())

    def patch_sample() -> None:
        for r in rows:
            circuit_metrics(ad, layout, tokens, answers, counter, removal_of(layout, np.setdiff1d(all_rows, [r])),
                            batch_size=n)

    t_patch = timed(patch_sample, repeats=1) / args.sample * layout.n_edges()
    with torch.no_grad():
        t_plain = timed(lambda: model(tokens), repeats=5)
        t_pass = timed(lambda: circuit_metrics(ad, layout, tokens, answers, counter, 0.0, batch_size=n), repeats=5)
    print(f"model {args.model}: {n} prompts x {layout.n_pos} positions, {layout.n_edges()} edges")
    print(f"EAP               {t_eap:8.2f} s")
    print(f"EAP-IG ({args.steps} steps)  {t_ig:8.2f} s")
    print(f"exact patching    {t_patch:8.2f} s  (every edge; {args.sample} timed)")
    floor = t_plain * layout.n_edges()
    print(f"one plain forward per edge (a floor for any exact patching): {floor:8.2f} s")
    print(f"ratio exact / EAP-IG: {t_patch / t_ig:.0f}x;  exact / EAP: {t_patch / t_eap:.0f}x;  "
          f"floor / EAP-IG: {floor / t_ig:.0f}x")
    print(f"graph pass / plain forward: {t_pass / t_plain:.1f}x (a copy of each prompt per query position)")


if __name__ == "__main__":
    main()
