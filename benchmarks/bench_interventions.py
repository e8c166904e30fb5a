"""Cost of the intervention primitives, measured side by side in one run.

Prints two ratios on a 6-block model (the default zoo model when available, else a random GPT-2-like
model of the same shape):

* AF1-intervened forward pass time / plain forward pass time        (target <= 1.2x)
* MeanCache.fit throughput / plain ``run_with_cache`` throughput      (target >= 0.8x)

Usage: ``python benchmarks/bench_interventions.py [--prompts 2048] [--batch 256] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import time

import torch

import interventions as iv


def build_model():
    try:
        from circuits import zoo

        return zoo.load(zoo.DEFAULT_MODEL), f"zoo:{zoo.DEFAULT_MODEL}"
    except Exception:  # zoo not installed: an untrained model of the same shape
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        cfg = HookedTransformerConfig(
            n_layers=6, d_model=256, d_head=32, n_heads=8, d_mlp=1024, n_ctx=32, d_vocab=600,
            act_fn="gelu", normalization_type="LN", seed=0,
        )
        return HookedTransformer(cfg).eval(), "random 6-block GPT-2-like"


def best_of(fns: dict, repeats: int) -> dict[str, float]:
    """Best wall time of each function; the functions take turns so background load hits all alike."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, name = build_model()
    n_layers = model.cfg.n_layers
    # Prompts shaped like "A+B-C=": BOS, operand, op, operand, op, operand, "=".
    tokens = torch.randint(1, min(100, model.cfg.d_vocab), (args.prompts, 7))
    tokens[:, 0] = 0
    batches = tokens.split(args.batch)
    cache = iv.MeanCache.fit(model, tokens, batch_size=args.batch, progress=False)
    subgraph = iv.af1_subgraph(n_layers, wait=n_layers // 2 - 1, transfer=1, cache=cache)

    with torch.inference_mode():
        t = best_of(
            {
                "plain": lambda: [model(b) for b in batches],
                "af1": lambda: [iv.run(model, b, subgraph) for b in batches],
                "rwc": lambda: [model.run_with_cache(b) for b in batches],
                "fit": lambda: iv.MeanCache.fit(model, tokens, batch_size=args.batch, progress=False),
            },
            args.repeats,
        )
    plain, af1, rwc, fit = t["plain"], t["af1"], t["rwc"], t["fit"]

    print(f"model: {name}; {args.prompts} prompts of 7 tokens, batch {args.batch}, best of {args.repeats}")
    print(f"plain forward        {plain * 1e3:8.1f} ms")
    print(f"AF1 forward          {af1 * 1e3:8.1f} ms   ratio {af1 / plain:.2f}x (target <= 1.2x)")
    print(f"run_with_cache       {rwc * 1e3:8.1f} ms   {args.prompts / rwc:8.0f} prompts/s")
    print(f"MeanCache.fit        {fit * 1e3:8.1f} ms   {args.prompts / fit:8.0f} prompts/s   "
          f"throughput ratio {rwc / fit:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
