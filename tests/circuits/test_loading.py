"""prepare_prompts: task -> single-token -> correct -> largest layout -> n_prompts, with clear errors."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from circuits.models import loading
from circuits.prompts import sampling


class FakeLayout:
    def __init__(self, n, n_pos, offset):
        self.tokens = torch.arange(n * n_pos).reshape(n, n_pos) + offset
        self.answers = torch.arange(n) + 100
        self.prompts = [f"p{offset}-{i}" for i in range(n)]
        self.answer_values = list(range(n))
        self.indices = list(range(n))


@pytest.fixture
def fake_tasks(monkeypatch):
    """A stand-in for the task catalogue (circuits.tasks.catalogue) that records the pipeline's calls."""
    calls = []
    mod = types.ModuleType("circuits.tasks.catalogue")

    def build_task(name, n=None, seed=0, start=0):
        calls.append(("build", name, n, seed))
        return list(range(start, start + n))

    def operand_space_size(name):
        return 60  # one round of 3 x 20 prompts draws the whole space

    def frozen_set(name):
        calls.append(("frozen", name))
        return list(range(300))

    def filter_single_token(ds, model, **kw):
        calls.append(("single", len(ds)))
        return ds[:-10], 10  # ten multi-token answers dropped

    def filter_correct(model, ds, **kw):
        calls.append(("correct", len(ds)))
        keep = ds[: len(ds) // 2]
        return keep, len(keep) / len(ds)

    def to_layouts(model, ds, **kw):
        calls.append(("layouts", len(ds)))
        n = len(ds)
        return [FakeLayout(n - n // 3, 7, 0), FakeLayout(n // 3, 9, 1000)]

    def get_task(name):
        return types.SimpleNamespace(name=name, slot_values=(), numeric=True, path=None, prefix="", operand_names=(), operand_ranges=())

    def task_label(name):
        return str(name)

    for fn in (build_task, operand_space_size, frozen_set, filter_single_token, filter_correct, to_layouts, get_task,
               task_label):
        setattr(mod, fn.__name__, fn)
    monkeypatch.setitem(sys.modules, "circuits.tasks.catalogue", mod)
    import circuits.tasks

    monkeypatch.setattr(circuits.tasks, "catalogue", mod)
    return calls


def test_prepare_prompts_pipeline(fake_tasks):
    p = sampling.prepare_prompts(object(), "add", 20, seed=3, min_prompts=1)
    # built 3 x 20 = 60, 50 single-token, 25 correct -> layouts of 17 and 8: all 17 of the larger one
    assert len(p) == 17 and p.tokens.shape == (17, 7)
    assert fake_tasks[0] == ("build", "add", 60, 3)
    assert [c[0] for c in fake_tasks] == ["build", "single", "correct", "layouts"]
    assert p.n_checked == 50 and p.n_correct == 25 and p.base_accuracy == 0.5


def test_prepare_prompts_truncates_and_reports(fake_tasks):
    p = sampling.prepare_prompts(object(), "add", 10, seed=0, oversample=10)
    # built 100, 90 single-token, 45 correct, layouts 30 and 15: first 10 of the 30-prompt layout
    assert p.tokens.shape == (10, 7) and p.answers.tolist() == list(range(100, 110))
    assert p.prompts[0] == "p0-0" and p.answer_values == list(range(10))
    assert p.n_layouts == 2 and p.n_dropped_multi_token == 10 and p.base_accuracy == 0.5
    assert p.records()[0] == {"prompt": "p0-0", "answer": 0, "answer_token": 100}


def test_prepare_prompts_too_few(fake_tasks):
    with pytest.raises(ValueError, match=r"too few correct prompts for task 'add': 25 of 50 .* 17 of them in the "
                                         r"largest layout .* 20 are needed; lower --n-prompts to 17"):
        sampling.prepare_prompts(object(), "add", 20)
    p = sampling.prepare_prompts(object(), "add", 20, min_prompts=5)
    assert len(p) == 17


def test_prepare_prompts_frozen_and_bad_args(fake_tasks):
    p = sampling.prepare_prompts(object(), "add", 50, source="frozen")
    assert fake_tasks[0] == ("frozen", "add") and len(p) == 50
    with pytest.raises(ValueError, match="n_prompts=0"):
        sampling.prepare_prompts(object(), "add", 0)
    with pytest.raises(ValueError, match="source='x'"):
        sampling.prepare_prompts(object(), "add", 5, source="x")


def test_prepare_prompts_on_zoo_model():
    zoo = pytest.importorskip("circuits.zoo")
    tasks = pytest.importorskip("circuits.tasks")
    if not hasattr(tasks, "to_layouts") or zoo.DEFAULT_MODEL not in zoo.available():
        pytest.skip("zoo models or task layouts not available")
    model = loading.load_model(zoo.DEFAULT_MODEL)
    p = sampling.prepare_prompts(model, "add", 30, seed=0)
    assert p.tokens.shape[0] == 30 and 0 < p.base_accuracy <= 1
    with torch.inference_mode():
        assert torch.equal(model(p.tokens)[:, -1].argmax(-1), p.answers)


def test_load_model_dtype_reaches_the_pretrained_loader(monkeypatch):
    """``dtype`` is handed to the loader of the backend as a torch dtype; zoo models refuse other dtypes."""
    import interventions as iv

    seen = {}

    class Loaded:
        def eval(self):
            return self

        def enable_compatibility_mode(self):
            seen["compat"] = True

    def fake(name, **kwargs):
        seen.update(name=name, **kwargs)
        return Loaded()

    if iv.resolve_backend(None) == "hooked":
        import transformer_lens

        monkeypatch.setattr(transformer_lens.HookedTransformer, "from_pretrained", staticmethod(fake))
    else:
        from transformer_lens.model_bridge import TransformerBridge

        monkeypatch.setattr(TransformerBridge, "boot_transformers", staticmethod(fake))
    from circuits.models import names as model_names

    # the test's own loader stands for the hub: the name counts as cached (an uncached name is refused offline)
    monkeypatch.setattr(model_names, "in_hf_cache", lambda name: True)
    loading.load_model("some/pretrained-model", dtype="bfloat16")
    assert seen["name"] == "some/pretrained-model" and seen["dtype"] is torch.bfloat16
    assert seen.get("compat", False) == (iv.resolve_backend(None) == "bridge")
    with pytest.raises(ValueError, match="dtype='int8' is not valid: choose one of 'float32', 'float16', 'bfloat16'"):
        loading.load_model("some/pretrained-model", dtype="int8")
    with pytest.raises(ValueError, match="ships in float32; dtype='float16' applies to pretrained models"):
        loading.load_model("arith-gpt2", dtype="float16")
