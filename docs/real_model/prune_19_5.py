"""How docs/real_model/prune/ was measured: prune the transfer heads of SmolLM2's most faithful CAMA configuration
on the prompts it answers.

The scored prompts and the CAMA means are those of the sweep's CAMA cell (its prompts.jsonl, rebuilt to tokens and
checked against its run.json hash, and its means.safetensors); the prompts are the first N of those the
configuration answers (its per-prompt outcomes), so the curve starts at 1 and the target is relative to the
configuration's own faithfulness. Resumable (run it again with the same arguments).

Usage: python docs/real_model/prune_19_5.py CELL WAIT TRANSFER N OUT, e.g. with the sweep of
circuits/sweep/examples/smollm2.toml in runs/sweep-smollm2:
    python docs/real_model/prune_19_5.py runs/sweep-smollm2/cells/smollm2-135m-instruct/add_2d2d/cama-seed0 \
        19 5 40 runs/prune-19-5
"""
import json, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import interventions as iv
from circuits.models.loading import load_model
from circuits.prune import prune_heads
from circuits.store.runs import tokens_sha256
from circuits.search import SearchResult
from circuits.tasks.tokens import encode_texts

cell = Path(sys.argv[1]); wait, transfer, n_max, out = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
model = load_model("smollm2-135m-instruct", backend="bridge")
records = [json.loads(l) for l in (cell / "prompts.jsonl").read_text().splitlines()]
ids = encode_texts(model.tokenizer, [r["prompt"] for r in records])["input_ids"]
bos = model.tokenizer.bos_token_id
tokens = torch.tensor([[bos, *x, *r["answer_token"][:-1]] for x, r in zip(ids, records)])
answers = torch.tensor([r["answer_token"] for r in records])
ident = json.loads((cell / "run.json").read_text())
assert tokens_sha256(tokens, answers) == ident["prompts_sha256"], "rebuilt prompts differ from the search's"
cache = iv.MeanCache.load(cell / "means.safetensors")
outcomes = SearchResult.load(cell).prompt_outcomes(wait, transfer)
keep = torch.as_tensor(outcomes.faithful).nonzero().flatten()[:n_max]
print(f"({wait}, {transfer}): {int(outcomes.faithful.sum())} of {len(records)} prompts kept; pruning on {len(keep)}", flush=True)
meta = {"model": "smollm2-135m-instruct", "task": "add_2d2d", "source": "build", "numbers": "multi",
        "format": ident.get("format"), "prompts": f"the first {len(keep)} prompts ({wait}, {transfer}) answers among the "
        f"200 of the CAMA search"}
t0 = time.time()
result = prune_heads(model, tokens[keep], answers[keep], wait=wait, transfer=transfer, cache=cache, target=0.9,
                     confirm_top=1, out_dir=out, batch_size=64, meta=meta,
                     prompts=[{"prompt": records[i]["prompt"], "answer": records[i]["answer"]} for i in keep.tolist()])
print(f"{time.time() - t0:.0f} s; smallest head set {result.smallest_head_set} "
      f"({result.smallest_faithfulness}); unpruned {result.curve[0].faithfulness}", flush=True)
