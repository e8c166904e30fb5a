"""``af1 edges`` before loading: the edge graph and its memory estimated from ``config.json`` and the task's prompt
length agree with the graph of the loaded model, and a run whose lower bound exceeds the memory is refused in one
line (exit 2) before the weights load."""

from __future__ import annotations

import pytest

import interventions as iv
from circuits import cli, zoo
from circuits.edges import plan
from circuits.edges.analysis import layout_of
from circuits.edges.graph import Layout
from circuits.models import loading, memory
from circuits.prompts.sampling import prepare_prompts

GIB = 2**30


@pytest.mark.parametrize("name, task", [("arith-gpt2", "add"), ("arith-llama", "add_sub")])
def test_estimate_agrees_with_the_loaded_graph(name, task):
    """The graph the estimate reads from the zoo model's ``config.json`` and tokenizer is the graph the run builds
    once the model is loaded: the same layout, so the same edges and ``Layout.memory_bytes`` exactly."""
    config, tokenizer = memory.read_pretrained(str(zoo.path(name)))
    lengths = memory.prompt_lengths(task, 16, tokenizer)
    est = plan.estimate_edges(config, n_pos=max(lengths), n_pos_min=min(lengths), batch=16,
                              n_params=memory.count_parameters(config))
    model = zoo.load(name)
    prompts = prepare_prompts(model, task, 16, progress=False)
    loaded = layout_of(iv.adapt(model).info, int(prompts.tokens.shape[1]), 1, True)
    assert est.layout == loaded
    assert est.n_edges == loaded.n_edges() and est.graph_bytes == loaded.memory_bytes(16)
    weights = 4 * sum(p.numel() for p in model.parameters())
    host, device = est.floors()
    assert device == 0 and est.weights is not None and est.weights <= weights  # the bridge holds more
    assert weights + plan.FLOOR_BYTES_PER_EDGE * loaded.n_edges() <= host + 0.02 * weights


@pytest.mark.parametrize("layout", [
    Layout(n_layers=3, n_heads=4, n_kv_heads=2, d_model=8, n_pos=6, n_answer=2),
    Layout(n_layers=2, n_heads=3, n_kv_heads=3, d_model=8, n_pos=5, parallel=True),
    Layout(n_layers=2, n_heads=4, n_kv_heads=1, d_model=8, n_pos=5, positional=False),
])
def test_edge_count_is_the_valid_entries(layout):
    assert layout.n_edges() == sum(int(layout.valid(s).sum()) for s in layout.slots())


def test_layout_of_config_reads_the_families():
    llama = {"model_type": "llama", "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
             "hidden_size": 64}
    assert plan.layout_of_config(llama, 9) == Layout(4, 8, 2, 64, 9)
    assert plan.layout_of_config({"model_type": "gptj", "n_layer": 2, "n_head": 4, "n_embd": 32}, 5).parallel
    neox = {"model_type": "gpt_neox", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32}
    assert plan.layout_of_config({**neox, "use_parallel_residual": True}, 5).parallel
    assert not plan.layout_of_config(neox, 5).parallel
    falcon = {"model_type": "falcon", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32,
              "multi_query": True, "parallel_attn": True}
    assert plan.layout_of_config(falcon, 5).n_kv_heads == 1
    assert plan.layout_of_config({"text_config": llama}, 3, positional=False) == Layout(4, 8, 2, 64, 3, positional=False)


def big_estimate(**kw):
    config = {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_size": 4096, "vocab_size": 128256}
    return plan.estimate_edges(config, **{"n_pos": 60, "n_pos_min": 50, "batch": 16, "n_params": 8_030_261_248,
                                          "dtype": "bfloat16", "device": "cuda", **kw})


def test_shortfall_refuses_only_a_lower_bound_that_does_not_fit():
    est = big_estimate()
    host, device = est.floors()
    assert est.floor.n_pos == 50 and est.floor.parallel and est.layout.n_pos == 60
    assert device > est.weights  # the weights and one pass's logits
    assert plan.shortfall(est, host, device) is None  # exactly enough: it fits
    assert plan.shortfall(est, None, None) is None  # nothing known: never refused
    line = plan.shortfall(est, host, device - 1)
    assert line is not None and "\n" not in line and "free GPU memory" in line
    assert "--aggregate-positions" in line and "--batch-size" in line
    assert plan.shortfall(est, host - 1, 10**15) is not None and "host memory" in plan.shortfall(est, host - 1, None)
    flat = big_estimate(positional=False)
    assert flat.floors()[0] < host / 100  # aggregating positions is the fix
    assert "--batch-size does not help" in plan.shortfall(flat, 1, None)


def test_a_run_that_cannot_fit_is_refused_before_loading(monkeypatch, tmp_path, capsys):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(loading, "load_model", no_loading)
    monkeypatch.setattr(plan, "available_memory", lambda device: (2**20, None))
    argv = ["edges", "--model", "arith-gpt2", "--task", "add", "--n-prompts", "8", "--no-progress",
            "--out", str(tmp_path / "e")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "needs at least" in err and "--aggregate-positions" in err and "--batch-size" in err
    assert "Traceback" not in err and not (tmp_path / "e").exists()


def test_a_run_that_fits_says_its_estimate_before_loading(monkeypatch, tmp_path, capsys, caplog):
    from circuits.errors import ModelLoadError

    said = []

    def stop(*args, **kwargs):
        said.extend(r.getMessage() for r in caplog.records)
        raise ModelLoadError("stopped before loading")

    monkeypatch.setattr(loading, "load_model", stop)
    monkeypatch.setattr(plan, "available_memory", lambda device: (64 * GIB, None))
    argv = ["edges", "--model", "arith-gpt2", "--task", "add", "--n-prompts", "8", "--batch-size", "4",
            "--no-progress", "--out", str(tmp_path / "e")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "stopped before loading" in err
    assert any("11,896 edges (5 positions)" in m and "at batch 4" in m for m in said)


@pytest.mark.parametrize("positional", [True, False])
def test_pass_floor_is_held_by_a_scoring_pass(positional):
    """What a scoring pass keeps for its backward pass (autograd's saved tensors, each storage once), its logits
    and its senders' outputs are at least :meth:`EdgesEstimate.pass_floor`."""
    import torch

    from circuits.edges.engine import edge_pass

    config, tokenizer = memory.read_pretrained(str(zoo.path("arith-llama")))
    model = zoo.load("arith-llama")
    prompts = prepare_prompts(model, "add", 6, progress=False)
    ad = iv.adapt(model)
    n_pos = int(prompts.tokens.shape[1])
    est = plan.estimate_edges(config, n_pos=n_pos, batch=6, positional=positional)
    layout = layout_of(ad.info, n_pos, 1, positional)
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    for p in model.parameters():
        p.requires_grad_(False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        res = edge_pass(ad, layout, prompts.tokens, prompts.answers, leaves=True)
    copies = n_pos if positional else 1
    logits = 4 * 6 * copies * n_pos * est.d_vocab
    assert sum(storages.values()) + logits + 4 * res.outputs.numel() >= est.pass_floor(6) > 0
