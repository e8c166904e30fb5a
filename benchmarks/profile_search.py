"""Where the fast AF1 search spends its time: seconds per phase, and each matmul phase against its compute limit.

Runs the fast full grid (``circuits.search.FastEvaluator``, as ``af1 search --grid full`` evaluates it) and
reports, per phase:

* ``lookup``: the ablated residual after ``wait`` (a table lookup of the cached means) or the embedding;
* ``prefix``: the transfer blocks, every position of every prompt, one block per call;
* ``tails``: the self-peek blocks after the transfers, every configuration of a wait together, one call per block;
* ``unembed``: final norm, unembedding of the answer rows and the four-number readout;
* ``bootstrap+records``: the confidence intervals (``n_boot`` resamples), per-prompt outcomes and one fsynced
  JSONL record per configuration, as the search writes them;
* ``other``: everything else (Python between the phases, metrics from the readout).

For the matmul phases it prints the FLOP (``circuits.search.cost.fast_flops``), the time they take at this
machine's matmul rate on the model's shapes (measured in the same run, same thread count) and the rest:
Python, hook and memory overhead.

Usage (from the repository root, ``PYTHONPATH=.``): ``python benchmarks/profile_search.py [--prompts 200]
[--backend hooked|bridge] [--threads 1] [--batch 128] [--model NAME --task TASK --numbers multi --shots K
--fit-size N]``; without ``--model`` the default zoo model on ``add_sub``. Figures: ``docs/backends.md``
(Profile of the fast search).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_search  # noqa: E402  (the benchmark beside this file: models, prompts and the compute limit)

import interventions as iv  # noqa: E402
from circuits.faithfulness import summarize  # noqa: E402
from circuits.search import FastEvaluator, configurations  # noqa: E402
from circuits.search.results import ConfigResult  # noqa: E402
from circuits.store.outcomes import PromptOutcomes  # noqa: E402
from circuits.store.runs import append_line  # noqa: E402


def profile(model: object, tokens: torch.Tensor, answers: torch.Tensor, cache: iv.MeanCache, batch: int,
            n_boot: int) -> dict[str, float]:
    """Seconds per phase of one fast full grid (see the module docstring); ``"total"`` is the wall time."""
    records = Path(tempfile.mkdtemp()) / "results.jsonl"
    start = time.perf_counter()
    ev = FastEvaluator(model, tokens, answers, cache, "cama", batch)
    book = 0.0
    for w, t in configurations(ev.n_layers):
        per = ev.evaluate(w, t)
        t0 = time.perf_counter()
        res = summarize(*per, n_boot=n_boot, seed=0)
        r = ConfigResult.from_faithfulness(w, t, res, "cama", outcomes=PromptOutcomes.from_metrics(*per))
        append_line(records, r.to_dict())
        book += time.perf_counter() - t0
    total = time.perf_counter() - start
    out = dict(ev.seconds)
    out["bootstrap+records"] = book
    out["other"] = total - sum(out.values())
    out["total"] = total
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", choices=("hooked", "bridge"), default="hooked")
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples per interval (as af1 search)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--task", default="add_sub")
    parser.add_argument("--numbers", choices=("single", "multi"), default="single")
    parser.add_argument("--shots", type=int, default=0)
    parser.add_argument("--fit-size", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model is not None:
        name, model, tokens, answers, fit = bench_search.named(args)
    else:
        name, model, tokens, answers = bench_search.build("gpt2", args.prompts, args.backend)
        fit = tokens
    cache = iv.MeanCache.fit(model, fit, batch_size=args.batch, progress=False)
    profile(model, tokens[: min(8, len(tokens))], answers[: min(8, len(tokens))], cache, args.batch, 10)  # warm-up
    sec = profile(model, tokens, answers, cache, args.batch, args.n_boot)
    limit = bench_search.compute_limit(model, tokens, answers, args.batch)
    print(f"model: {name}; {len(tokens)} prompts of {tokens.shape[1]} tokens, "
          f"{len(configurations(iv.adapt(model).info.n_layers))} configurations, {torch.get_num_threads()} thread(s), "
          f"backend {iv.adapt(model).backend}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'phase':<18} {'seconds':>8} {'share':>6} {'GFLOP':>9} {'at rate':>8} {'overhead':>9}")
    for phase in ("lookup", "prefix", "tails", "unembed", "bootstrap+records", "other"):
        s = sec[phase]
        if phase in limit["flops"]:
            at = limit["seconds"][phase]
            extra = f"{limit['flops'][phase] / 1e9:9.1f} {at:8.2f} {s - at:9.2f}"
        else:
            extra = f"{'':>9} {'':>8} {s:9.2f}"
        print(f"{phase:<18} {s:8.2f} {s / sec['total']:6.1%} {extra}")
    print(f"{'total':<18} {sec['total']:8.2f} {1:6.1%} {sum(limit['flops'].values()) / 1e9:9.1f} "
          f"{limit['limit']:8.2f} {sec['total'] - limit['limit']:9.2f}")
    print("matmul rates: " + ", ".join(f"{p} {limit['rates'][p] / 1e9:.1f} GFLOP/s ({limit['rows'][p]} rows)"
                                       for p in limit["rates"]))


if __name__ == "__main__":
    main()
