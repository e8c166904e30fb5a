"""Cost of the full-grid AF1 search: fast method versus the straightforward approach, side by side.

The straightforward approach (as in the paper's public demo) runs one complete intervened forward pass
per configuration (``iv.run`` with ``af1_subgraph``) with batch size 20. The fast method
(``circuits.search.FastEvaluator``) skips the waiting blocks (ablation lookup), shares the transfer
prefix between transfers, runs the self-peek tail on the last position alone (BOS's constant key and
value as a cache), evaluates ``transfer = 0`` once per distinct last token and unembeds only the last
position.

Prints, on a 6-block model (the default zoo model on task prompts when available, else a random model
of the same shape whose answers are its own predictions):

* naive (batch 20) time / fast time            (target >= 5x)
* naive (same batch as fast) time / fast time  (target >= 2x)

and asserts that both methods give identical per-configuration correctness counts and last-position
logits within 1e-4. The methods take turns (best of ``--repeats``) so background load hits all alike.

Usage: ``python benchmarks/bench_search.py [--prompts 400] [--batch 128] [--repeats 3] [--arch gpt2|llama]
[--threads 1] [--backend hooked|bridge] [--random]`` (``bridge``: the same model as a
``TransformerBridge``; ``--random``: the random model even for gpt2).
"""

from __future__ import annotations

import argparse
import time

import torch

import interventions as iv
from circuits.search import FastEvaluator, NaiveEvaluator, configurations


def build(arch: str, n_prompts: int, backend: str = "hooked", random: bool = False):
    """(name, model, tokens, answers); ``backend="bridge"`` wraps the model as a ``TransformerBridge``."""
    name, model, tokens, answers = _build(arch, n_prompts, backend, random)
    if backend == "bridge" and iv.adapt(model).backend != "bridge":
        model = iv.bridge_from_hooked(model).eval()
    return name + (" (TransformerBridge)" if backend == "bridge" else ""), model, tokens, answers


def _build(arch: str, n_prompts: int, backend: str, random: bool):
    if arch == "gpt2" and not random:
        try:
            from circuits import zoo
            from circuits.loading import prepare_prompts

            model = zoo.load(zoo.DEFAULT_MODEL, backend=backend)
            p = prepare_prompts(model, "add_sub", n_prompts, seed=0, min_prompts=min(50, n_prompts))
            return f"zoo:{zoo.DEFAULT_MODEL} on add_sub", model, p.tokens, p.answers
        except Exception as err:  # zoo or tasks not installed: an untrained model of the same shape
            print(f"(zoo model unavailable: {type(err).__name__}: {err}; using a random model)")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    shape = dict(n_layers=6, d_model=256, d_head=32, n_heads=8, d_mlp=1024, n_ctx=32, d_vocab=600, seed=0)
    if arch == "llama":
        shape.update(normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=32, gated_mlp=True,
                     act_fn="silu", n_key_value_heads=4, final_rms=True)
    else:
        shape.update(normalization_type="LN", act_fn="gelu")
    model = HookedTransformer(HookedTransformerConfig(**shape)).eval()
    g = torch.Generator().manual_seed(0)
    # Prompts shaped like "A+B-C=": BOS, operand, op, operand, op, operand, "=".
    tokens = torch.randint(1, 100, (n_prompts, 7), generator=g)
    tokens[:, 0] = 0
    tokens[:, 2], tokens[:, 4], tokens[:, 6] = 101, 102, 103  # fixed "+", "-", "=" tokens
    with torch.inference_mode():
        answers = model(tokens)[:, -1].argmax(-1)
    return f"random 6-block {arch}-like", model, tokens, answers


def full_grid(evaluator) -> dict:
    return {c: evaluator.last_logits(*c) for c in configurations(evaluator.n_layers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--backend", choices=("hooked", "bridge"), default="hooked",
                        help="HookedTransformer (default) or the same weights as a TransformerBridge")
    parser.add_argument("--random", action="store_true", help="a random 6-block model even for --arch gpt2")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    name, model, tokens, answers = build(args.arch, args.prompts, args.backend, args.random)
    cache = iv.MeanCache.fit(model, tokens, batch_size=args.batch, progress=False)

    def run(method: str, batch: int):
        cls = FastEvaluator if method == "fast" else NaiveEvaluator
        return full_grid(cls(model, tokens, answers, cache, "cama", batch))

    fns = {
        "fast": lambda: run("fast", args.batch),
        "naive20": lambda: run("naive", 20),
        "naive_eq": lambda: run("naive", args.batch),
    }
    outputs = {k: fn() for k, fn in fns.items()}  # warm-up, and the values compared below
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.repeats):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    best = {k: min(v) for k, v in times.items()}

    worst = 0.0
    for ref in ("naive20", "naive_eq"):
        for c, logits in outputs["fast"].items():
            other = outputs[ref][c]
            n_fast = int((logits.argmax(-1) == answers).sum())
            n_ref = int((other.argmax(-1) == answers).sum())
            assert n_fast == n_ref, f"config {c}: fast {n_fast} vs {ref} {n_ref} correct"
            worst = max(worst, float((logits - other).abs().max()))
    assert worst <= 1e-4, f"logits differ by {worst:.2e} > 1e-4"

    n_cfg = len(configurations(model.cfg.n_layers))
    print(f"model: {name}; {len(tokens)} prompts of {tokens.shape[1]} tokens, {n_cfg} configurations "
          f"(full grid), best of {args.repeats}, {torch.get_num_threads()} threads")
    print(f"fast (batch {args.batch})         {best['fast'] * 1e3:9.1f} ms")
    print(f"naive (batch 20)           {best['naive20'] * 1e3:9.1f} ms   ratio {best['naive20'] / best['fast']:.1f}x (target >= 5x)")
    print(f"naive (batch {args.batch})          {best['naive_eq'] * 1e3:9.1f} ms   ratio {best['naive_eq'] / best['fast']:.1f}x (target >= 2x)")
    print(f"identical correctness counts in all {n_cfg} configurations; max |logit difference| {worst:.1e}")


if __name__ == "__main__":
    main()
