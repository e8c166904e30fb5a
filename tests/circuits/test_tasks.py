"""Task catalogue, frozen sets, filters and layouts."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch

from circuits.errors import ArgumentError
from circuits.tasks import catalogue as tasks
from circuits.tasks.files import expression_slots
from circuits.zoo.tokenizer import build_tokenizer
from tests.conftest import BACKENDS

ORIGINAL = ["add", "sub", "add_add", "add_sub", "sub_add", "sub_sub"]
STYLES = [f"{s}_{op}" for s in ("verbal", "question", "instruction", "word_problem", "python") for op in ("add", "sub")]
EARLY = ["add_small", "sub_small", "add_large", "sub_large", "add_add_small", "add_sub_small", "sub_add_small",
         "sub_sub_small"]
DIGITS = ["add_3d1d", "add_2d2d"]


def _expected(expr: str, ops: list[int]) -> int:
    """Independent recomputation: substitute the operands into the expression and evaluate it."""
    return eval(re.sub(r"[A-C]", lambda m: str(ops["ABC".index(m.group())]), expr))  # noqa: S307


def test_catalogue_lists_every_task():
    names = tasks.list_tasks()
    assert set(ORIGINAL + STYLES + EARLY + DIGITS) <= set(names)
    assert len(names) == len(set(names)) == 26
    assert tasks.get_task("add_sub").template == "{A}+{B}-{C}="
    assert tasks.get_task("instruction_sub").template == "If you subtract {B} from {A}, you will get "


@pytest.mark.parametrize("name", ORIGINAL + STYLES + EARLY + DIGITS)
def test_every_task_builds_with_right_answers(name):
    spec = tasks.get_task(name)
    ds = tasks.build_task(name, n=60, seed=3)
    assert len(ds) == 60
    assert set(ds.column_names) >= {"prompt", "answer", "operands", "task"}
    for row in ds:
        ops = row["operands"]
        assert len(ops) == spec.n_operands
        assert all(lo <= v <= hi for v, (lo, hi) in zip(ops, spec.operand_ranges))
        assert row["answer"] == _expected(spec.expression, ops)
        assert spec.answer_min <= row["answer"] <= spec.answer_max
        assert row["task"] == name
        # The prompt shows the operands where the template puts them.
        order = re.findall(r"\{([A-C])\}", spec.template)
        assert [int(x) for x in re.findall(r"\d+", row["prompt"])] == [ops["ABC".index(k)] for k in order]
    assert len({tuple(o) for o in ds["operands"]}) == 60  # no duplicates


def test_original_prompts_have_the_af1_format():
    row = tasks.build_task("add_sub", n=1, seed=0)[0]
    a, b, c = row["operands"]
    assert row["prompt"] == f"{a}+{b}-{c}="
    assert row["answer"] == a + b - c >= 0


def test_early_decoding_sets_respect_result_bounds():
    for name, hi in [("add_small", 99), ("sub_small", 99), ("add_large", 520), ("sub_large", 520),
                     ("sub_sub_small", 99), ("add_add_small", 99)]:
        ds = tasks.build_task(name)
        assert len(ds) == 500
        assert all(0 <= a <= hi for a in ds["answer"])
        assert all(0 <= v <= hi for ops in ds["operands"] for v in ops)
    # the large sets really use large numbers
    assert max(tasks.build_task("add_large")["answer"]) > 400


def test_build_is_deterministic_and_exhaustive_when_small():
    a = tasks.build_task("sub", n=200, seed=7)
    b = tasks.build_task("sub", n=200, seed=7)
    c = tasks.build_task("sub", n=200, seed=8)
    assert a["prompt"] == b["prompt"]
    assert a["prompt"] != c["prompt"]
    small = tasks.build_task("sub", n=1000, seed=0, operand_ranges=[(0, 3), (0, 3)])
    # exhaustive: every pair with A >= B, i.e. 4 + 3 + 2 + 1 = 10
    assert sorted(map(tuple, small["operands"])) == [(a, b) for a in range(4) for b in range(4) if a >= b]
    assert len(tasks.build_task("add", n=None)) == tasks.get_task("add").default_n == 1000


def test_unknown_task_lists_known_names():
    with pytest.raises(ValueError, match="unknown task 'mul'.*add_add.*python_sub"):
        tasks.get_task("mul")
    with pytest.raises(ValueError, match="known tasks"):
        tasks.build_task("mul")


def test_empty_operand_range_is_a_clear_error():
    with pytest.raises(ValueError, match="yield no prompt"):
        tasks.build_task("sub", operand_ranges=[(0, 5), (10, 20)])  # A - B < 0 always
    with pytest.raises(ValueError, match="yield no prompt"):
        tasks.build_task("add", operand_ranges=[(5, 4), (0, 3)])  # empty range


def test_bad_build_arguments_are_argument_errors():
    with pytest.raises(ArgumentError, match=r"^n must be >= 0, got -1$"):
        tasks.build_task("add", n=-1)
    with pytest.raises(ArgumentError, match=r"^start must be >= 0, got -2$"):
        tasks.build_task("add", n=3, start=-2)
    with pytest.raises(ArgumentError, match=r"^task 'add' has 2 operands, got 1 ranges$"):
        tasks.build_task("add", operand_ranges=[(0, 3)])
    with pytest.raises(ArgumentError, match=r"^operator 'A / B' is not allowed"):
        expression_slots("A / B")
    with pytest.raises(ArgumentError, match=r"^'A\(B\)' is not allowed"):
        expression_slots("A(B)")


def test_frozen_sets_are_fixed_and_correct():
    from circuits.tasks.files import toml_module

    cat = toml_module().loads((tasks.datasets_dir() / "tasks" / "catalogue.toml").read_text())
    for name in tasks.list_tasks():
        fz = tasks.frozen_set(name)
        assert len(fz) == cat["frozen_n"] == 300
        spec = tasks.get_task(name)
        for row in fz.select(range(20)):
            assert row["answer"] == _expected(spec.expression, row["operands"])
            assert row["prompt"] == spec.prompt(row["operands"])
        # regenerating with the catalogue seed gives the same prompts: the file is what the code makes
        if name in ("add", "python_sub", "sub_sub_small"):
            assert tasks.build_task(name, n=300, seed=cat["frozen_seed"])["prompt"] == fz["prompt"]


def test_datasets_dir_of_the_earlier_one_file_format_still_loads(tmp_path, monkeypatch):
    (tmp_path / "tasks.json").write_text(json.dumps({"version": 1, "frozen_seed": 1, "frozen_n": 2, "tasks": [
        {"name": "tiny", "template": "{A}+{B}=", "expression": "A+B", "operand_names": ["A", "B"],
         "operand_ranges": [[1, 2], [1, 2]], "answer_min": 0, "answer_max": 9, "default_n": 10,
         "group": "original", "style": "original", "card": "test"}]}))
    monkeypatch.setenv("AF1_DATASETS_DIR", str(tmp_path))
    assert tasks.list_tasks() == ["tiny"]
    assert sorted(tasks.build_task("tiny")["answer"]) == [2, 3, 3, 4]


def test_datasets_dir_of_task_files_is_overridable(tmp_path, monkeypatch):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "catalogue.toml").write_text('tasks = ["tiny"]\nfrozen_n = 2\n')
    (tmp_path / "tasks" / "tiny.toml").write_text(
        'name = "tiny"\ntemplate = "{A}*{B}="\nanswer = "A*B"\n[slots]\nA = { range = [1, 2] }\nB = { range = [2, 3] }\n')
    monkeypatch.setenv("AF1_DATASETS_DIR", str(tmp_path))
    assert tasks.list_tasks() == ["tiny"]
    assert sorted(tasks.build_task("tiny")["answer"]) == [2, 3, 4, 6]
    assert tasks.get_task("tiny").frozen_n == 2


def test_datasets_dir_is_the_repository_data_folder(monkeypatch):
    """In a checkout the data is the top-level datasets/ folder (the wheel test checks circuits/data of a wheel)."""
    monkeypatch.delenv("AF1_DATASETS_DIR", raising=False)
    import circuits

    data = tasks.datasets_dir()
    assert data.resolve() == Path(circuits.__file__).resolve().parent.parent / "datasets"
    assert (data / "tasks" / "catalogue.toml").is_file() and (data / "tasks" / "add.toml").is_file()
    assert (data / "frozen" / "add.jsonl").is_file()
    assert not (data / "__init__.py").exists()  # a data folder, not a package
    import datasets

    assert hasattr(datasets, "Dataset")  # Hugging Face datasets, not our data folder


def test_package_data_is_extracted_from_a_zip(tmp_path):
    """Where the package is imported from a zip archive, its data folder is copied to a real folder."""
    import zipfile

    from circuits.tasks.package_data import materialize

    archive = tmp_path / "pkg.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("circuits/data/tasks.json", '{"tasks": []}')
        zf.writestr("circuits/data/frozen/add.jsonl", '{"prompt": "1+1="}\n')
    out = materialize(zipfile.Path(archive, "circuits/data/"))
    assert isinstance(out, Path) and out.name == "data"
    assert (out / "tasks.json").read_text() == '{"tasks": []}'
    assert (out / "frozen" / "add.jsonl").read_text() == '{"prompt": "1+1="}\n'
    assert materialize(out) is out  # a real path is returned as is


# --------------------------------------------------------------------------------------- filters
def _splitting_tokenizer(max_number: int):
    """A WordPiece tokenizer that knows numbers 0..max_number whole and splits larger ones into digits."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<pad>": 1, "<unk>": 2, "+": 3, "-": 4, "=": 5}
    for i in range(max_number + 1):
        vocab[str(i)] = len(vocab)
    for d in range(10):
        vocab[f"##{d}"] = len(vocab)
    backend = Tokenizer(models.WordPiece(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                     pre_tokenizers.Digits(), pre_tokenizers.Punctuation()])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", pad_token="<pad>",
                                   unk_token="<unk>")


def test_filter_single_token_keeps_everything_for_the_zoo_tokenizer():
    ds = tasks.build_task("add_large", n=200)
    kept, dropped = tasks.filter_single_token(ds, build_tokenizer())
    assert dropped == 0 and len(kept) == 200


def test_filter_single_token_drops_split_numbers(caplog):
    tok = _splitting_tokenizer(60)
    assert tok.tokenize("73") == ["7", "##3"]
    ds = tasks.build_task("add", n=300, seed=1)
    with caplog.at_level(logging.INFO, logger="circuits"):  # the count goes to the log, shown by the command line
        kept, dropped = tasks.filter_single_token(ds, tok)
    expected = sum(all(v <= 60 for v in ops + [a]) for ops, a in zip(ds["operands"], ds["answer"]))
    assert len(kept) == expected and dropped == 300 - expected > 0
    assert all(max(ops + [a]) <= 60 for ops, a in zip(kept["operands"], kept["answer"]))
    assert f"dropped {dropped} of 300" in caplog.text


def test_filter_single_token_strict_names_the_number_and_pieces():
    tok = _splitting_tokenizer(60)
    ds = tasks.build_task("add", n=5, seed=0, operand_ranges=[(70, 70), (3, 3)])
    with pytest.raises(ValueError, match=r"number 70 is split into 2 tokens \['7', '##0'\]"):
        tasks.filter_single_token(ds, tok, strict=True)
    # a vocabulary that maps a number to <unk> is no single token either
    with pytest.raises(ValueError, match="number 73 is an unknown token"):
        tasks.filter_single_token(ds, build_tokenizer_small(), strict=True)


def build_tokenizer_small():
    return build_tokenizer(max_number=72)


def test_answer_token_ids_are_number_tokens():
    tok = build_tokenizer()
    ids = tasks.answer_token_ids(tok, [0, 47, 520])
    assert ids.dtype == torch.long
    assert tok.convert_ids_to_tokens(ids.tolist()) == ["0", "47", "520"]
    with pytest.raises(ValueError, match="not a single token"):
        tasks.answer_token_ids(_splitting_tokenizer(10), [47])


# --------------------------------------------------------------------------------------- layouts
@pytest.fixture(scope="module", params=BACKENDS)
def tiny_model(request):
    """A 1-block random ``HookedTransformer`` with the zoo tokenizer; on the bridge backend the zoo's
    ``arith-gpt2`` as a ``TransformerBridge`` (same tokenizer)."""
    if request.param == "bridge":
        from circuits import zoo

        return zoo.load("arith-gpt2", backend="bridge")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, n_ctx=32,
                                  d_vocab=len(tok), act_fn="gelu", default_prepend_bos=True)
    return HookedTransformer(cfg, tokenizer=tok).eval()


def _mixed():
    from datasets import concatenate_datasets

    return concatenate_datasets([tasks.build_task("add", n=7), tasks.build_task("python_sub", n=3),
                                 tasks.build_task("add_add", n=5), tasks.build_task("add", n=4, seed=9)])


def test_to_layouts_never_mixes_lengths(tiny_model):
    ds = _mixed()
    layouts = tasks.to_layouts(tiny_model, ds)
    assert [len(l) for l in layouts] == [11, 5, 3]
    assert [l.n_pos for l in layouts] == [5, 7, 18]
    assert sorted(i for l in layouts for i in l.indices) == list(range(len(ds)))
    bos = tiny_model.tokenizer.bos_token_id
    for lay in layouts:
        assert lay.tokens.dtype == torch.long and lay.tokens.ndim == 2
        assert (lay.tokens[:, 0] == bos).all()
        for r, i in enumerate(lay.indices):
            assert lay.prompts[r] == ds[i]["prompt"]
            assert lay.answer_values[r] == ds[i]["answer"]
            assert tiny_model.to_string(lay.answers[r : r + 1]) == str(ds[i]["answer"])
            assert lay.tokens[r].tolist() == tiny_model.to_tokens(ds[i]["prompt"])[0].tolist()


def test_filter_correct_matches_a_row_by_row_check(tiny_model):
    ds = _mixed()
    kept, acc = tasks.filter_correct(tiny_model, ds, batch_size=4)
    expect = []
    with torch.no_grad():
        for row in ds:
            logits = tiny_model(tiny_model.to_tokens(row["prompt"]))[0, -1]
            expect.append(int(logits.argmax()) == int(tasks.answer_token_ids(tiny_model, [row["answer"]])[0]))
    assert acc == pytest.approx(sum(expect) / len(ds))
    assert kept["prompt"] == [ds[i]["prompt"] for i in range(len(ds)) if expect[i]]
