"""Cost of the full-grid AF1 search: fast method versus the straightforward approach, side by side.

The straightforward approach (as in the paper's public demo) runs one complete intervened forward pass
per configuration (``iv.run`` with ``af1_subgraph``) with batch size 20. The fast method
(``circuits.search.FastEvaluator``) skips the waiting blocks (ablation lookup), shares the transfer
prefix between transfers, runs the self-peek tail on the last position alone (BOS's constant key and
value as a cache, where the adapter offers that capability) or on ``[BOS, last]`` with the last token
at its true position (a ``TransformerBridge``), evaluates ``transfer = 0`` once per distinct last token
and unembeds only the last position.

Prints, on the default zoo model on task prompts (when available), or on a random model of
``--layers`` blocks and width ``--d-model`` whose answers are its own predictions:

* naive (batch 20) time / fast time
* naive (same batch as fast) time / fast time  (unless ``--no-naive-eq``)

and asserts that both methods give identical per-configuration correctness counts and argmax tokens, and
answer-position readouts (answer logit, best other logit, log-sum-exp) within 1e-4. It then prints the compute
limit: the fast full grid's FLOP (``circuits.search.cost.fast_flops``) at this machine's matmul rate, measured in
the same run on the model's own shapes and thread count, and the ratio of the measured fast time to it. The
methods take turns (best of ``--repeats``) so background load hits all alike.
``--naive-configs K`` times the per-configuration passes on ``K`` configurations spread evenly over
the grid and scales their time to the full grid (said in the output), for deep models whose naive
full grid takes many minutes. The output names the TransformerLens version and the fast tail.

Usage: ``python benchmarks/bench_search.py [--prompts 400] [--batch 128] [--repeats 3] [--arch gpt2|llama]
[--threads 1] [--backend hooked|bridge] [--random] [--layers 6] [--d-model 256] [--naive-configs 0]
[--no-naive-eq] [--no-warmup] [--model NAME --task TASK --numbers multi --shots K --fit-size N]``.
Measured figures: ``docs/backends.md`` (Search benchmarks). ``--model smollm2-135m-instruct --task add_2d2d
--numbers multi --shots 2`` runs it on the real pretrained model (answers of several tokens read under teacher forcing).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import interventions as iv
from circuits.search import FastEvaluator, NaiveEvaluator, configurations
from circuits.search.cost import Dims, fast_flops, naive_flops
from interventions.readout import answer_readout, readout_metrics


def build(arch: str, n_prompts: int, backend: str = "hooked", random: bool = False, n_layers: int = 6,
          d_model: int = 256):
    """(name, model, tokens, answers). The zoo model for ``arch="gpt2"`` unless ``random``; otherwise a
    random ``n_layers``-block model of width ``d_model`` (same weights on both backends, built without
    ``HookedTransformer`` on TransformerLens 4.x) whose answers are its own predictions."""
    if arch == "gpt2" and not random:
        try:
            from circuits import zoo
            from circuits.prompts.sampling import prepare_prompts

            model = zoo.load(zoo.DEFAULT_MODEL, backend=backend)
            p = prepare_prompts(model, "add_sub", n_prompts, seed=0, min_prompts=min(50, n_prompts))
            suffix = " (TransformerBridge)" if backend == "bridge" else ""
            return f"zoo:{zoo.DEFAULT_MODEL} on add_sub{suffix}", model, p.tokens, p.answers
        except Exception as err:  # zoo or tasks not installed: an untrained model of the same shape
            print(f"(zoo model unavailable: {type(err).__name__}: {err}; using a random model)")
    cfg = random_config(arch, n_layers, d_model)
    state = random_state(cfg)
    if backend == "bridge":
        model = iv.bridge_from_hooked_state(cfg, state).eval()
    else:
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        model = HookedTransformer(HookedTransformerConfig(**cfg)).eval()
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and all(k.endswith(("mask", "IGNORE", "rotary_sin", "rotary_cos")) for k in missing)
    g = torch.Generator().manual_seed(0)
    # Prompts shaped like "A+B-C=": BOS, operand, op, operand, op, operand, "=".
    tokens = torch.randint(1, 100, (n_prompts, 7), generator=g)
    tokens[:, 0] = 0
    tokens[:, 2], tokens[:, 4], tokens[:, 6] = 101, 102, 103  # fixed "+", "-", "=" tokens
    with torch.inference_mode():
        answers = model(tokens)[:, -1].argmax(-1)
    kind = "TransformerBridge" if backend == "bridge" else "HookedTransformer"
    return f"random {n_layers}-block {arch}-like, d_model {d_model} ({kind})", model, tokens, answers


def named(args: argparse.Namespace):
    """(name, model, tokens, answers, fit tokens) of ``--model`` on ``--task``: prompts it answers correctly
    (``--numbers``, ``--shots``) and the fit set of their means, as ``af1 search`` prepares them."""
    from circuits.models.loading import load_model
    from circuits.prompts.fitset import FitSpec
    from circuits.prompts.spec import PromptSpec
    from circuits.tasks.formats import PromptFormat

    model = load_model(args.model, backend=args.backend if args.backend != "hooked" else None)
    spec = PromptSpec(args.task, n_prompts=args.prompts, numbers=args.numbers, format=PromptFormat(shots=args.shots),
                      fit=FitSpec(size=args.fit_size))
    p = spec.prepare(model, means="cama", progress=False, batch_size=args.batch)
    what = f"{args.model} on {args.task} ({spec.format.describe()}, numbers {args.numbers})"
    return what, model, p.tokens, p.answers, p.fit.tokens


def random_config(arch: str, n_layers: int, d_model: int) -> dict:
    """``HookedTransformerConfig`` fields of a random ``arch``-shaped model (heads of 32 dims, or 16
    below d_model 128; Llama: grouped-query attention with half as many key/value heads)."""
    d_head = 32 if d_model >= 128 else 16
    cfg = dict(n_layers=n_layers, d_model=d_model, d_head=d_head, n_heads=d_model // d_head, d_mlp=4 * d_model,
               n_ctx=32, d_vocab=600, seed=0, default_prepend_bos=True, initializer_range=0.8 / d_model ** 0.5)
    if arch == "llama":
        cfg.update(normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=d_head, gated_mlp=True,
                   act_fn="silu", n_key_value_heads=d_model // d_head // 2, final_rms=True)
    else:
        cfg.update(normalization_type="LN", positional_embedding_type="standard", act_fn="gelu")
    return cfg


def random_state(cfg: dict) -> dict[str, torch.Tensor]:
    """A ``HookedTransformer`` state dict for ``cfg``: weights N(0, initializer_range) from a fixed seed,
    biases 0, norm scales 1 (no TransformerLens needed)."""
    d, n, h, m, v = cfg["d_model"], cfg["n_heads"], cfg["d_head"], cfg["d_mlp"], cfg["d_vocab"]
    kv = cfg.get("n_key_value_heads") or n
    gqa = "_" if kv != n else ""
    ln = ("w",) if cfg["normalization_type"] == "RMS" else ("w", "b")
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed.W_E", (v, d))]
    if cfg["positional_embedding_type"] == "standard":
        shapes.append(("pos_embed.W_pos", (cfg["n_ctx"], d)))
    for layer in range(cfg["n_layers"]):
        p = f"blocks.{layer}."
        shapes += [(f"{p}ln{i}.{x}", (d,)) for i in (1, 2) for x in ln]
        shapes += [(p + "attn.W_Q", (n, d, h)), (p + "attn.W_O", (n, h, d)), (p + "attn.b_Q", (n, h)),
                   (p + "attn.b_O", (d,)), (f"{p}attn.{gqa}W_K", (kv, d, h)), (f"{p}attn.{gqa}W_V", (kv, d, h)),
                   (f"{p}attn.{gqa}b_K", (kv, h)), (f"{p}attn.{gqa}b_V", (kv, h)),
                   (p + "mlp.W_in", (d, m)), (p + "mlp.b_in", (m,)), (p + "mlp.W_out", (m, d)), (p + "mlp.b_out", (d,))]
        if cfg.get("gated_mlp"):
            shapes.append((p + "mlp.W_gate", (d, m)))
    shapes += [(f"ln_final.{x}", (d,)) for x in ln] + [("unembed.W_U", (d, v)), ("unembed.b_U", (v,))]
    g = torch.Generator().manual_seed(cfg["seed"])
    state = {}
    for name, shape in shapes:
        if "W_" in name:
            state[name] = torch.randn(shape, generator=g) * cfg["initializer_range"]
        else:
            state[name] = torch.ones(shape) if name.rsplit(".", 1)[-1] == "w" else torch.zeros(shape)
    return state


def full_grid(evaluator, answers: torch.Tensor, keep: set) -> dict:
    """Every configuration's correctness count (``"counts"``), and the readout (answer logit, best other logit,
    log-sum-exp, argmax per prompt and answer token: :func:`interventions.readout.answer_readout`) of the
    configurations in ``keep``, evaluated as the search does (``evaluator.evaluate`` order, readouts only)."""
    counts, readouts = {}, {}
    for c in configurations(evaluator.n_layers):
        out = evaluator.readout(*c)
        counts[c] = int(readout_metrics(out, answers)[0].sum())
        if c in keep:
            readouts[c] = out
    return {"counts": counts, "readouts": readouts}


def matmul_rate(dims: Dims, rows: int, repeats: int = 5) -> float:
    """FLOP per second of this machine (this thread count) on one block's matrices of ``dims`` (q, k, v, o,
    MLP) applied to ``rows`` rows, best of ``repeats``."""
    g = torch.Generator().manual_seed(0)
    d, hd, kvd = dims.d_model, dims.n_heads * dims.d_head, dims.n_kv_heads * dims.d_head
    shapes = [(hd, d), (kvd, d), (kvd, d), (d, hd)] + [(dims.d_mlp, d)] * (2 if dims.gated else 1) + [(d, dims.d_mlp)]
    weights = [torch.randn(o, i, generator=g) for o, i in shapes]
    inputs = {i: torch.randn(rows, i, generator=g) for _, i in shapes}
    flops = sum(2 * rows * o * i for o, i in shapes)
    return flops / best_time(lambda: [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights], repeats)


def unembed_rate(dims: Dims, rows: int, repeats: int = 5) -> float:
    """FLOP per second of unembedding ``rows`` rows (``[rows, d_model] x [d_model, d_vocab]``), best of ``repeats``."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(dims.d_vocab, dims.d_model, generator=g), torch.randn(rows, dims.d_model, generator=g)
    return dims.unembed_flops(rows) / best_time(lambda: torch.nn.functional.linear(x, w), repeats)


def best_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def compute_limit(model, tokens: torch.Tensor, answers: torch.Tensor, batch: int) -> dict:
    """The fast full grid's FLOP by phase (:func:`circuits.search.cost.fast_flops`), this machine's matmul rate on
    each phase's shapes (prefix: a batch of prompts at full width; tails and unembedding: the answer rows of half
    a wait's configurations, at most a batch's positions), the time at those rates (the limit) and the
    per-configuration passes' FLOP."""
    dims = Dims.of(model.cfg)
    n, pos = int(tokens.shape[0]), int(tokens.shape[1])
    k = 1 if answers.ndim == 1 else int(answers.shape[1])
    distinct = len(torch.unique(tokens[:, -k:], dim=0))
    flops = fast_flops(dims, n, pos, k, n_distinct=distinct)
    # the rows of one call as the fast search makes it: a batch of prompts at full width; the answer rows of
    # half a wait's configurations in a tail block; a wait's answer rows unembedded together (up to a batch's)
    rows = {"prefix": min(n, batch) * pos, "tails": min(n * k * max(1, dims.n_layers // 2), batch * pos),
            "unembed": min(n * k * max(1, dims.n_layers // 2), batch * pos)}
    rates = {"prefix": matmul_rate(dims, rows["prefix"]), "tails": matmul_rate(dims, rows["tails"]),
             "unembed": unembed_rate(dims, rows["unembed"])}
    seconds = {p: flops[p] / rates[p] for p in flops}
    return {"flops": flops, "rates": rates, "seconds": seconds, "limit": sum(seconds.values()),
            "naive_flops": naive_flops(dims, n, pos), "rows": rows}


def spread(items: list, k: int) -> list:
    """``k`` items evenly spread over ``items`` (first and last included); all of them for ``k <= 0``."""
    if k <= 0 or k >= len(items):
        return list(items)
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)] if k > 1 else [items[0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--backend", choices=("hooked", "bridge"), default="hooked",
                        help="HookedTransformer (default) or the same weights as a TransformerBridge")
    parser.add_argument("--random", action="store_true", help="a random model even for --arch gpt2")
    parser.add_argument("--layers", type=int, default=6, help="blocks of the random model (default 6)")
    parser.add_argument("--d-model", type=int, default=256, help="width of the random model (default 256)")
    parser.add_argument("--naive-configs", type=int, default=0,
                        help="time the per-configuration passes on this many configurations spread over the "
                             "grid and extrapolate to the full grid (default 0: every configuration)")
    parser.add_argument("--no-naive-eq", action="store_true", help="skip the per-configuration passes at --batch")
    parser.add_argument("--model", default=None,
                        help="a model by name (e.g. smollm2-135m-instruct) on --task prompts it answers, instead of "
                             "the default zoo model or a random one")
    parser.add_argument("--task", default="add_sub", help="task of --model (default add_sub)")
    parser.add_argument("--numbers", choices=("single", "multi"), default="single", help="as af1 --numbers")
    parser.add_argument("--shots", type=int, default=0, help="as af1 --shots")
    parser.add_argument("--fit-size", type=int, default=10_000,
                        help="as af1 --fit-size: prompts the means of --model are fitted on (the speed of the search "
                             "does not depend on it; default 10000)")
    parser.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                        help="run every method once before timing it (default); --no-warmup times the first runs "
                             "(with --repeats 1: each method runs once)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model is not None:
        name, model, tokens, answers, fit = named(args)
    else:
        name, model, tokens, answers = build(args.arch, args.prompts, args.backend, args.random, args.layers,
                                             args.d_model)
        fit = tokens  # random prompts: the speed of the search does not depend on which prompts the means saw
    cache = iv.MeanCache.fit(model, fit, batch_size=args.batch, progress=False)
    grid = configurations(iv.adapt(model).info.n_layers)
    sample = spread(grid, args.naive_configs)

    def naive(batch: int) -> dict:
        evaluator = NaiveEvaluator(model, tokens, answers, cache, "cama", batch)
        return {c: answer_readout(evaluator.last_logits(*c), answers) for c in sample}

    fns = {"fast": lambda: full_grid(FastEvaluator(model, tokens, answers, cache, "cama", args.batch), answers,
                                     set(sample)),
           "naive20": lambda: naive(20)}
    if not args.no_naive_eq:
        fns["naive_eq"] = lambda: naive(args.batch)
    times: dict[str, list[float]] = {k: [] for k in fns}
    outputs = {}
    for k, fn in fns.items():  # warm-up (timed only with --no-warmup), and the values compared below
        start = time.perf_counter()
        outputs[k] = fn()
        if not args.warmup:
            times[k].append(time.perf_counter() - start)
    for _ in range(args.repeats - (0 if args.warmup else 1)):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    scale = len(grid) / len(sample)  # naive passes are timed on `sample` only
    best = {k: min(v) * (1.0 if k == "fast" else scale) for k, v in times.items()}

    worst, worst_rel = 0.0, 0.0
    for ref in fns.keys() - {"fast"}:
        for c, other in outputs[ref].items():
            mine = outputs["fast"]["readouts"][c]
            n_fast = outputs["fast"]["counts"][c]
            n_ref = int(readout_metrics(other, answers)[0].sum())
            assert n_fast == n_ref, f"config {c}: fast {n_fast} vs {ref} {n_ref} correct"
            assert torch.equal(mine[..., 3], other[..., 3]), f"config {c}: fast and {ref} argmax tokens differ"
            # the answer's logit, the best other logit and the log-sum-exp of every logit
            diff = float((mine[..., :3] - other[..., :3]).abs().max())
            worst, worst_rel = max(worst, diff), max(worst_rel, diff / max(float(other[..., :2].abs().max()), 1e-30))
    # float32 rounding grows with depth and logit size: 30 blocks of SmolLM2 differ by 1.5e-4 at logits near 30
    assert worst <= 1e-4 or worst_rel <= 1e-5, f"logits differ by {worst:.2e} ({worst_rel:.1e} of the largest)"
    limit = compute_limit(model, tokens, answers, args.batch)

    import importlib.metadata

    tl = importlib.metadata.version("transformer-lens")
    tail = FastEvaluator(model, tokens[:2], answers[:2], cache, "cama", 2).tail
    print(f"model: {name}; {len(tokens)} prompts of {tokens.shape[1]} tokens, {len(grid)} configurations "
          f"(full grid), best of {args.repeats}{'' if args.warmup else ' (no warm-up)'}, {torch.get_num_threads()} "
          f"threads, TransformerLens {tl}, fast tail {tail!r}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    if len(sample) < len(grid):
        print(f"per-configuration passes timed on {len(sample)} of {len(grid)} configurations (evenly spread) "
              f"and scaled by {scale:.2f} to the full grid")
    print(f"fast (batch {args.batch})         {best['fast']:9.2f} s")
    print(f"naive (batch 20)           {best['naive20']:9.2f} s   ratio {best['naive20'] / best['fast']:.1f}x")
    if "naive_eq" in best:
        print(f"naive (batch {args.batch})          {best['naive_eq']:9.2f} s   "
              f"ratio {best['naive_eq'] / best['fast']:.1f}x")
    print(f"identical correctness counts and argmax tokens in all {len(sample)} compared configurations; max "
          f"|logit difference| {worst:.1e} ({worst_rel:.1e} of the largest logit; answer, best other, log-sum-exp)")
    f = limit["flops"]
    print(f"compute limit: fast full grid {sum(f.values()):.3g} FLOP (prefix {f['prefix']:.3g}, "
          f"tails {f['tails']:.3g}, unembedding {f['unembed']:.3g}); matmul rate of this machine on the model's "
          f"shapes, "
          f"{torch.get_num_threads()} thread(s): " + ", ".join(
              f"{p} {limit['rates'][p] / 1e9:.1f} GFLOP/s ({limit['rows'][p]} rows)" for p in f))
    print(f"time at that rate {limit['limit']:.2f} s; fast measured / limit = {best['fast'] / limit['limit']:.2f}x; "
          f"per-configuration passes {limit['naive_flops']:.3g} FLOP = {limit['naive_flops'] / sum(f.values()):.1f}x "
          f"the fast FLOP")
    counts = outputs["fast"]["counts"]
    top = max(counts, key=lambda c: (counts[c], c[0], -c[1]))
    print(f"fast full grid: most correct prompts at (wait, transfer) = {top}: {counts[top]} of {len(tokens)}")


if __name__ == "__main__":
    main()
