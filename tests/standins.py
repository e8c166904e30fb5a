"""Stand-in checkpoints: tiny random-weight Hugging Face models of real architectures, offline.

Each stand-in is saved under its real repository name in a Hugging Face cache layout
(``<cache>/models--org--name/snapshots/<rev>/`` with ``refs/main``), so that loaders that take the
official name (``HookedTransformer.from_pretrained``, ``TransformerBridge.boot_transformers``) read
its config, weights and tokenizer from the cache with ``HF_HUB_OFFLINE=1``. Sizes are tiny
(``d_model`` 64, 2 blocks); the tokenizers are small byte-level BPEs trained here with the
``tokenizers`` library, in the formats of the real ones:

* ``gpt2`` (GPT-2, GPT-J, GPT-NeoX/Pythia): GPT-2 pre-tokenisation (``' ?\\p{N}+'``: a number keeps
  its leading space, ``'Ġ112'``), merges learnt from a corpus where numbers are Zipf-distributed, so
  small numbers are single tokens and many 3-digit numbers split irregularly (``'Ġ4' '37'``).
* ``llama3`` (Llama-3): digits split in groups of up to three (``'\\p{N}{1,3}'``), no leading space
  on numbers (``' '`` then ``'112'``), ``<|begin_of_text|>`` added by the tokenizer.
* ``qwen2`` (Qwen2): one digit per token, no BOS token.
* ``gemma`` (Gemma): SentencePiece-style (``'▁'`` for spaces, byte fallback), one digit per token,
  ``<bos>`` added by the tokenizer.

Random models answer nothing: :func:`self_answered` (tests only) makes a model's own top-1 token
at the last position the answer of each prompt, so the analyses can run on stand-ins.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REVISION = "0123456789abcdef0123456789abcdef01234567"
D_MODEL = 64
N_LAYERS = 2

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


@dataclass(frozen=True)
class StandIn:
    """One stand-in: ``key`` (short name), ``repo`` (the real repository name it is saved under),
    ``family`` (Hugging Face architecture), ``tokenizer`` style and whether TransformerLens 3.9's
    ``HookedTransformer.from_pretrained`` reads its config from the checkpoint (``hooked``; it uses
    built-in configs for Llama and Gemma names)."""

    key: str
    repo: str
    family: str
    tokenizer: str
    hooked: bool = True
    aliases: tuple[str, ...] = ()


STANDINS = {
    s.key: s
    for s in (
        StandIn("gpt2", "gpt2", "gpt2", "gpt2"),
        StandIn("pythia", "EleutherAI/pythia-70m", "neox", "gpt2"),
        # TransformerLens 3.9 spells the name "EleutherAI/gpt-j-6B" and looks it up under that spelling.
        StandIn("gptj", "EleutherAI/gpt-j-6b", "gptj", "gpt2", aliases=("EleutherAI/gpt-j-6B",)),
        StandIn("qwen2", "Qwen/Qwen2.5-0.5B", "qwen2", "qwen2"),
        StandIn("llama3", "meta-llama/Meta-Llama-3-8B", "llama", "llama3", hooked=False),
        # A Llama-architecture checkpoint whose name TransformerLens 3.9 reads the config of (names with
        # "llama" get built-in configs): Llama-3 rope settings incl. rope_scaling of type llama3.
        StandIn("yi", "01-ai/Yi-6B", "llama", "llama3"),
        StandIn("gemma", "google/gemma-2b", "gemma", "gemma", hooked=False),
    )
}


# ------------------------------------------------------------------------------------------ tokenizers
def _corpus(seed: int = 0) -> list[str]:
    """Arithmetic-flavoured text: task templates, numbers with and without a leading space, Zipf-like
    number frequencies (small numbers common, 3-digit numbers rare), plus a few words."""
    rng = random.Random(seed)
    words = ("The sum of and is difference What the Answer If you add to subtract from will get John has "
             "cookies Jane He gave Together they have now print should a b").split()
    lines = []
    for _ in range(6000):
        a, b = int(rng.paretovariate(0.7)) % 1000, int(rng.paretovariate(0.9)) % 1000
        lines.append(rng.choice([f"{a}+{b}={a + b}", f"{a}-{b}={a - b}", f"The sum of {a} and {b} is {a + b}",
                                 f"{rng.choice(words)} {a} {rng.choice(words)} {b}"]))
    for n in range(1000):  # every number appears, with and without a leading space
        lines.append(f"{n}={n} x {n}")
    return lines


def build_tokenizer(style: str):
    """A ``PreTrainedTokenizerFast`` in the format of ``style`` (``"gpt2"``, ``"llama3"``, ``"qwen2"``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if style == "gemma":
        return build_gemma_tokenizer()
    split = {"gpt2": GPT2_SPLIT, "llama3": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT}[style]
    special = {"gpt2": ["<|endoftext|>"], "llama3": ["<|begin_of_text|>", "<|end_of_text|>"],
               "qwen2": ["<|endoftext|>"]}[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    vocab_size = {"gpt2": 700, "llama3": 1700, "qwen2": 500}[style]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    kwargs: dict[str, Any]
    if style == "llama3":
        bos = special[0]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
        kwargs = dict(bos_token=bos, eos_token=special[1])
    elif style == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        kwargs = dict(bos_token=special[0], eos_token=special[0], unk_token=special[0])
    else:
        kwargs = dict(eos_token=special[0], pad_token=special[0])
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def build_gemma_tokenizer():
    """A Gemma-format tokenizer: SentencePiece-style BPE (spaces as ``'▁'``, byte fallback), one digit
    per token, ``<bos>`` added by the tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d|▁*[^▁\d]+|▁+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=special, show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                                   pad_token="<pad>")


# ------------------------------------------------------------------------------------------ models
def hf_config(standin: StandIn, vocab_size: int, bos: int | None, eos: int | None):
    """The Hugging Face config of a tiny ``standin`` (2 blocks, d_model 64, 4 heads of 16)."""
    import transformers as tf

    d, n, h = D_MODEL, N_LAYERS, 4
    common = dict(vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos)
    fam = standin.family
    if fam == "gpt2":
        return tf.GPT2Config(n_positions=128, n_ctx=128, n_embd=d, n_layer=n, n_head=h, **common)
    if fam == "neox":
        return tf.GPTNeoXConfig(max_position_embeddings=128, hidden_size=d, num_hidden_layers=n,
                                num_attention_heads=h, intermediate_size=4 * d, rotary_pct=0.25,
                                use_parallel_residual=True, hidden_act="gelu", tie_word_embeddings=False,
                                **common)
    if fam == "gptj":
        return tf.GPTJConfig(n_positions=128, n_embd=d, n_layer=n, n_head=h, rotary_dim=8,
                             tie_word_embeddings=False, **common)
    if fam == "qwen2":
        return tf.Qwen2Config(hidden_size=d, num_hidden_layers=n, num_attention_heads=h, num_key_value_heads=2,
                              intermediate_size=2 * d, max_position_embeddings=128, rope_theta=1000000.0,
                              tie_word_embeddings=True, **common)
    if fam == "gemma":
        return tf.GemmaConfig(hidden_size=d, num_hidden_layers=n, num_attention_heads=h, num_key_value_heads=1,
                              head_dim=d // h, intermediate_size=2 * d, max_position_embeddings=128,
                              hidden_activation="gelu_pytorch_tanh", pad_token_id=0, **common)
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    return tf.LlamaConfig(hidden_size=d, num_hidden_layers=n, num_attention_heads=h, num_key_value_heads=2,
                          intermediate_size=2 * d, max_position_embeddings=128, rope_theta=500000.0,
                          rope_scaling=rope, tie_word_embeddings=False, head_dim=d // h, **common)


def _model_class(family: str):
    import transformers as tf

    return {"gpt2": tf.GPT2LMHeadModel, "neox": tf.GPTNeoXForCausalLM, "gptj": tf.GPTJForCausalLM,
            "qwen2": tf.Qwen2ForCausalLM, "llama": tf.LlamaForCausalLM, "gemma": tf.GemmaForCausalLM}[family]


def save_standin(standin: StandIn, hub_cache: Path, seed: int = 0) -> Path:
    """Write ``standin`` (random weights drawn with ``seed``, its tokenizer) into ``hub_cache`` under
    its repository name; returns the snapshot folder."""
    tok = build_tokenizer(standin.tokenizer)
    cfg = hf_config(standin, len(tok), tok.bos_token_id, tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(standin.family)(cfg)
        with torch.no_grad():  # larger weights than the default init, so prompts differ in their top-1
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.2)
    first = None
    for name in (standin.repo, *standin.aliases):
        repo = hub_cache / ("models--" + name.replace("/", "--"))
        snap = repo / "snapshots" / REVISION
        model.save_pretrained(snap)
        tok.save_pretrained(snap)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(REVISION)
        first = first or snap
    return first


def build_cache(hub_cache: Path, keys: Any = None) -> Path:
    """Every stand-in (or those in ``keys``) saved into ``hub_cache``; returns ``hub_cache``."""
    hub_cache.mkdir(parents=True, exist_ok=True)
    for key in keys or STANDINS:
        save_standin(STANDINS[key], hub_cache)
    return hub_cache


@contextlib.contextmanager
def offline_cache(hub_cache: Path) -> Iterator[Path]:
    """Point the Hugging Face hub at ``hub_cache``, offline, for the duration of the block."""
    import huggingface_hub.constants as hc

    old = (hc.HF_HUB_CACHE, hc.HF_HUB_OFFLINE)
    hc.HF_HUB_CACHE, hc.HF_HUB_OFFLINE = str(hub_cache), True
    try:
        yield hub_cache
    finally:
        hc.HF_HUB_CACHE, hc.HF_HUB_OFFLINE = old


def snapshot_config(hub_cache: Path, key: str) -> dict:
    """The saved ``config.json`` of stand-in ``key``."""
    repo = hub_cache / ("models--" + STANDINS[key].repo.replace("/", "--"))
    return json.loads((repo / "snapshots" / REVISION / "config.json").read_text())


# ------------------------------------------------------------------------------------------ answers
def split_covered(tokens: Any, n: int) -> tuple[list[int], list[int]]:
    """TEST ONLY: ``(scored, rest)`` row indices of ``tokens``: the first ``n`` rows whose every
    ``(position, token)`` is still held by a row left in ``rest`` (the fit set), and the others."""
    left = Counter((t, tok) for row in tokens.tolist() for t, tok in enumerate(row))
    scored = []
    for i, row in enumerate(tokens.tolist()):
        entries = list(enumerate(row))
        if len(scored) < n and all(left[e] >= 2 for e in entries):
            scored.append(i)
            left.subtract(entries)
    chosen = set(scored)
    return scored, [i for i in range(len(tokens)) if i not in chosen]


def self_answered(model: Any, task: str, n: int, seed: int = 0, prepend_bos: bool | None = None):
    """TEST ONLY: ``n`` prompts of ``task`` in one layout whose "answers" are the model's own top-1
    tokens at the last position (``circuits.prompts.sampling.self_answer_prompts``), so that a random model
    answers every prompt. Prompts have single-token numbers and BOS per ``prepend_bos``; ``fit`` holds the
    other prompts of that layout (the means' fit set, disjoint from the scored ones, minimum count 1)."""
    from circuits.prompts.fitset import FitSet
    from circuits.prompts.sampling import self_answer_prompts
    from circuits.tasks import catalogue as tasks

    spec = tasks.get_task(task)
    lo, hi = tasks.single_token_ranges(model, 0, 99)[0]  # e.g. 0..9 for Qwen2's one-digit tokens
    ranges = [(max(a, lo), min(b, hi)) for a, b in spec.operand_ranges]
    ds = tasks.build_task(task, n=max(20 * n, 2000), seed=seed, operand_ranges=ranges)
    ds, _ = tasks.filter_single_token(ds, model, verbose=False)
    layouts = tasks.to_layouts(model, ds, prepend_bos=prepend_bos)
    best = layouts[0]
    scored, rest = split_covered(best.tokens, n)
    p = self_answer_prompts(model, best.tokens[scored], task=task)
    p.prompts = [best.prompts[i] for i in scored]
    p.fit = FitSet.given(best.tokens[rest], min_count=1)
    return p


def self_answered_multi(model: Any, task: str, n: int, seed: int = 0, prepend_bos: bool | None = True,
                        fmt: Any = None, n_fit: int | None = None):
    """TEST ONLY: ``n`` prompts of ``task`` in the largest layout of several-token numbers
    (:mod:`circuits.tasks.digits`) whose "answers" are the model's own greedy continuation of the true answer's
    length ``k`` (each token the argmax given the ones before it), laid out for teacher forcing: ``tokens``
    are the prompt and the first ``k-1`` greedy tokens, ``answers`` ``[n, k]`` (``[n]`` when ``k = 1``);
    ``fit`` holds the other prompts of the layout (at most ``n_fit``) with their own greedy continuations."""
    import torch

    from circuits.prompts.fitset import FitSet
    from circuits.prompts.sampling import self_answer_prompts
    from circuits.tasks import catalogue as tasks
    from circuits.tasks.digits import filter_multi_token

    ds = tasks.build_task(task, n=max(20 * n, 600), seed=seed)
    if fmt is not None:
        ds = fmt.apply(ds, task, model)
    ds, _ = filter_multi_token(ds, model)
    best = tasks.to_layouts(model, ds, prepend_bos=prepend_bos)[0]
    k = 1 if best.answers.ndim == 1 else int(best.answers.shape[1])
    prompt_len = int(best.tokens.shape[1]) - (k - 1)
    rows = best.tokens[: None if n_fit is None else n + n_fit, :prompt_len].clone()
    with torch.inference_mode():
        for _ in range(k):
            nxt = self_answer_prompts(model, rows).answers
            rows = torch.cat([rows, nxt[:, None]], dim=1)
    tokens, answers = rows[:, :-1], rows[:, prompt_len:]
    answers = answers[:, 0] if k == 1 else answers
    scored, rest = split_covered(tokens, n)
    p = self_answer_prompts(model, tokens[scored], task=task)
    p.answers = answers[scored]
    p.prompts = [best.prompts[i] for i in scored]
    p.fit = FitSet.given(tokens[rest], min_count=1)
    p.numbers = "multi"
    return p
