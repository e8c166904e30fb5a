"""Base accuracy of a model per task and prompt format, on a sample of each task's prompts, per layout.

A prompt is answered when every token of its answer is the argmax (the later ones under teacher forcing), as
``af1 search --numbers multi`` counts it; the forward passes are plain transformers on the model's Hugging Face
folder (for a GGUF name, its converted folder; the logits equal the toolkit's backends', tests/checkpoints/
test_gguf.py), with BOS before every prompt except under the chat template, which brings its own.

Usage: ``python benchmarks/base_accuracy.py [--model smollm2-135m-instruct] TASK:SHOTS[:chat]:N ...``, e.g.
``add_2d2d:0:300 add_2d2d:2:600 add_2d2d:2:chat:400``. Prints, per task and format, the prompts checked and
answered and the three largest layouts with their counts. One thread (``--threads``) by default: see
docs/real_models.md ("Speed of a forward pass").
"""

from __future__ import annotations

import argparse
import time
import types

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help="TASK:SHOTS[:chat]:N")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a GGUF name or path, or a local folder")
    parser.add_argument("--seed", type=int, default=1, help="seed of the sampled prompts (default 1)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from circuits.models import gguf
    from circuits.tasks import catalogue as tasks
    from circuits.tasks.digits import filter_multi_token
    from circuits.tasks.formats import PromptFormat

    folder = gguf.resolve(args.model)
    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    like = types.SimpleNamespace(tokenizer=tok, cfg=types.SimpleNamespace(default_prepend_bos=True))
    for spec in args.specs:
        parts = spec.split(":")
        task, shots, n = parts[0], int(parts[1]), int(parts[-1])
        fmt = PromptFormat(shots=shots, chat="chat" in parts[2:-1])
        ds, _ = filter_multi_token(fmt.apply(tasks.build_task(task, n=n, seed=args.seed), task, tok), tok)
        like.cfg.default_prepend_bos = not fmt.chat
        start, counts = time.perf_counter(), {}
        for lay in tasks.to_layouts(like, ds):
            answers = lay.answers if lay.answers.ndim == 2 else lay.answers[:, None]
            k, right = answers.shape[1], 0
            with torch.inference_mode():
                for s in range(0, len(lay), 32):
                    hidden = hf.model(lay.tokens[s : s + 32]).last_hidden_state[:, -k:]  # unembed the answer positions
                    right += int((hf.lm_head(hidden).argmax(-1) == answers[s : s + 32]).all(1).sum())
            counts[lay.key] = (len(lay), right)
        total, answered = sum(v[0] for v in counts.values()), sum(v[1] for v in counts.values())
        print(f"{task}, {fmt.describe()}: {answered} of {total} answered ({answered / total:.1%}); "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        for key, (m, c) in sorted(counts.items(), key=lambda kv: -kv[1][1])[:3]:
            print(f"    layout {key}: {c} of {m}", flush=True)


if __name__ == "__main__":
    main()
