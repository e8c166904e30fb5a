"""The tokenizer-dependent half of the task catalogue: single-token numbers, answer tokens, layouts.

Re-exported by :mod:`circuits.tasks` (``tasks.filter_single_token``, ``tasks.to_layouts``, ...).

Conventions:

* A number is *single-token* when, in running text, the characters of its digits fall in exactly one
  token (a leading space may belong to that token, as in GPT-2's ``'Ġ112'``, or be its own token, as
  in Llama-3's ``' '`` ``'112'``). Operands are judged in their prompt, answers as the text that
  follows the prompt.
* The answer is written the way the tokenizer writes it after the prompt (:func:`answer_form`): the
  answer token is the one that ``tokenizer(prompt + answer)`` adds to ``tokenizer(prompt)``. When the
  prompt ends in a space and the tokenizer folds a space into the number (``'Ġ112'``), the prompt loses
  its trailing space and the answer text is ``' 112'``; the choice is kept in the ``answer_text`` column.
* BOS: ``prepend_bos=None`` means the model's own default (``model.cfg.default_prepend_bos``;
  TransformerLens sets it False for Pythia/GPT-NeoX and Qwen2). With BOS, position 0 holds it and the
  last prompt token is at position -1.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, SupportsInt

from circuits.errors import ArgumentError, PromptError
from interventions.types import Model, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from jaxtyping import Int

    from datasets import Dataset

__all__ = ["Layout", "answer_form", "answer_forms", "answer_value", "answer_token_ids", "check_prepend_bos",
           "filter_correct", "filter_single_token", "number_tokens", "resolve_bos", "single_token_ranges", "to_layouts"]

_NUMBER = re.compile(r"\d+")


def tokenizer_of(model_or_tokenizer: Model | Tokenizer) -> Any:
    """The Hugging Face tokenizer of a model (its ``.tokenizer``), or the argument itself."""
    tok = getattr(model_or_tokenizer, "tokenizer", None)
    return tok if tok is not None else model_or_tokenizer


def encode_texts(tok: Tokenizer, texts: Sequence[str], offsets: bool = False) -> Any:
    """``tok(texts, add_special_tokens=False)`` as ``{"input_ids": [...], "offset_mapping": [...]}`` (offsets
    only with ``offsets``), through the Rust tokenizer's ``encode_batch`` where the tokenizer has one (the same
    ids, without a Python call per text). A backend left padding or truncating by an earlier call (the
    Hugging Face wrapper sets these per call and keeps them) is not used."""
    texts = list(texts)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or not texts or backend.padding is not None or backend.truncation is not None:
        return tok(texts, add_special_tokens=False, return_offsets_mapping=offsets) if texts else \
            {"input_ids": [], "offset_mapping": []}
    encs = backend.encode_batch(texts, add_special_tokens=False)
    out: dict[str, Any] = {"input_ids": [e.ids for e in encs]}
    if offsets:
        out["offset_mapping"] = [e.offsets for e in encs]
    return out


def _pieces(tok: Tokenizer, text: str, span: tuple[int, int]) -> tuple[list[int], list[str]]:
    """Ids and token strings of the tokens of ``text`` that overlap the character ``span``."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = [i for i, (s, e) in zip(enc["input_ids"], enc["offset_mapping"]) if s < span[1] and e > span[0]]
    pieces = tok.convert_ids_to_tokens(ids)
    return ids, [pieces] if isinstance(pieces, str) else pieces


def number_tokens(model_or_tokenizer: Model | Tokenizer, value: int, after_space: bool = False) -> list[str]:
    """The tokens that carry the digits of ``value`` in running text: after a word and a space
    (``after_space``, e.g. ``"is 112"``) or after an operator (``"=112"``). A space that is its own
    token is not counted; one folded into the number is (``['Ġ112']``)."""
    tok = tokenizer_of(model_or_tokenizer)
    prefix = "is " if after_space else "1+"
    text = prefix + str(int(value))
    if not getattr(tok, "is_fast", False):
        return tok.convert_ids_to_tokens(tok.encode(str(int(value)), add_special_tokens=False))
    return _pieces(tok, text, (len(prefix), len(text)))[1]


def single_token_ranges(
    model_or_tokenizer: Model | Tokenizer, lo: int = 0, hi: int = 999, after_space: bool = False
) -> list[tuple[int, int]]:
    """Inclusive ``(lo, hi)`` ranges of the integers in ``[lo, hi]`` that are one token for this
    tokenizer (see :func:`number_tokens`; ``after_space`` as there), in increasing order.

    E.g. ``[(0, 999)]`` for Llama-3 (digits in groups of up to three), ``[(0, 9)]`` for Qwen2 (one digit
    per token), scattered ranges for GPT-2 / GPT-NeoX byte-level BPE."""
    tok = tokenizer_of(model_or_tokenizer)
    unk = getattr(tok, "unk_token", None)
    out: list[tuple[int, int]] = []
    for v in range(int(lo), int(hi) + 1):
        pieces = number_tokens(tok, v, after_space)
        if len(pieces) == 1 and (pieces[0] != unk or str(v) == unk):
            if out and out[-1][1] == v - 1:
                out[-1] = (out[-1][0], v)
            else:
                out.append((v, v))
    return out


def answer_string(answer: str | SupportsInt) -> str:
    """An answer as text: a string as it is, a number as ``str(int(answer))``."""
    return answer if isinstance(answer, str) else str(int(answer))


def answer_value(answer: str | SupportsInt) -> int | str:
    """An answer as JSON keeps it: an integer, or the string of a task whose answers are text."""
    return answer if isinstance(answer, str) else int(answer)


def is_number(text: str) -> bool:
    """Whether an answer text is an integer (``"112"``, ``" 112"``, ``"-3"``)."""
    return text.strip().lstrip("-").isdigit()


def answer_texts_of(rows: Any) -> list[Any]:
    """The answers a dataset's rows write after their prompts: the ``answer_text`` column where there is one
    (task files with an answer format or string answers, :func:`circuits.tasks.build_task`), else ``answer``."""
    columns = rows.keys() if isinstance(rows, dict) else getattr(rows, "column_names", ())
    return list(rows["answer_text"] if "answer_text" in columns else rows["answer"])


def answer_form(model_or_tokenizer: Model | Tokenizer, prompt: str, answer: int | str) -> tuple[str, str, list[int]]:
    """``(prompt, answer_text, answer_ids)``: the answer as the tokenizer writes it after the prompt.

    ``answer_ids`` are the tokens that ``tokenizer(prompt + str(answer))`` adds to ``tokenizer(prompt)``
    (single-token answer: one id); a string answer (e.g. ``" Paris"``) is that text itself. If they are not a
    clean continuation and ``prompt`` ends in a space, the space moves into the answer:
    ``(prompt[:-1], " " + str(answer), ...)`` (GPT-2 style ``'Ġ112'``).
    Multi-token answers return their pieces, the caller decides."""
    return answer_forms(model_or_tokenizer, [prompt], [answer])[0]


def answer_forms(
    model_or_tokenizer: Model | Tokenizer, prompts: Sequence[str], answers: Sequence[int | str],
    base: Sequence[list[int]] | None = None
) -> list[tuple[str, str, list[int]]]:
    """:func:`answer_form` of many prompts with batched tokenizer calls; ``base``: the prompts' token ids
    (without special tokens) when already known."""
    tok = tokenizer_of(model_or_tokenizer)

    def encode(texts: list[str]) -> list[list[int]]:
        return list(encode_texts(tok, texts)["input_ids"])

    texts = [answer_string(a) for a in answers]
    base = list(base) if base is not None else encode(list(prompts))
    full = encode([p + t for p, t in zip(prompts, texts)])
    out: list[tuple[str, str, list[int]]] = []
    retry: list[int] = []
    clean: list[bool] = []  # whether the prompt's tokens are a prefix of prompt + answer's
    for i, (p, t, b, f) in enumerate(zip(prompts, texts, base, full)):
        ids = f[len(b):] if f[: len(b)] == b else None
        clean.append(ids is not None)
        out.append((p, t, ids if ids is not None else encode([t])[0]))
        if (ids is None or len(ids) != 1) and p.endswith(" ") and not t.startswith(" "):
            retry.append(i)
    if retry:
        stripped = [prompts[i][:-1] for i in retry]
        b2 = encode(stripped)
        f2 = encode([p + " " + texts[i] for p, i in zip(stripped, retry)])
        for i, p, b, f in zip(retry, stripped, b2, f2):
            moved = f[len(b):] if f[: len(b)] == b else None
            if moved is not None and (not clean[i] or len(moved) < len(out[i][2])):
                out[i] = (p, " " + texts[i], moved)
    return out


def filter_single_token(
    ds: Dataset, model_or_tokenizer: Model | Tokenizer, strict: bool = False, verbose: bool = True
) -> tuple[Dataset, int]:
    """Keep the rows whose numbers (every operand in the prompt, and the answer as it follows the
    prompt, see :func:`answer_form`) are each a single token, not ``<unk>``. A string answer (a lookup column,
    e.g. ``" Paris"``) must be one token; the prompt's digits are then not checked.

    The kept rows gain an ``answer_text`` column (the answer as written after the prompt, e.g. ``"112"``
    or ``" 112"``); when the answer takes the prompt's trailing space, ``prompt`` loses it.

    Args:
        ds: dataset with ``prompt`` and ``answer`` columns (``answer_text`` where the task writes its answer in its
            own format; see ``tasks.build_task``).
        model_or_tokenizer: a TransformerLens model (its ``.tokenizer`` is used) or a Hugging Face tokenizer.
        strict: if True, raise instead of dropping (for tasks that demand single-token numbers).
        verbose: print how many rows were dropped.

    Returns:
        ``(kept_dataset, n_dropped)``.

    Raises:
        ValueError: with ``strict=True``, on the first number split into several tokens (or unknown);
        the message names the number and its pieces.
    """
    from datasets import Dataset

    tok = tokenizer_of(model_or_tokenizer)
    unk = getattr(tok, "unk_token_id", None)
    fast = bool(getattr(tok, "is_fast", False))
    cache: dict[int, list[int]] = {}
    keep: list[int] = []
    prompts: list[str] = []
    texts: list[str] = []
    rows = ds.to_dict() if hasattr(ds, "to_dict") else {c: list(ds[c]) for c in ds.column_names}
    all_prompts = list(rows["prompt"])
    enc = encode_texts(tok, all_prompts, offsets=fast) if all_prompts else None
    forms = answer_forms(tok, all_prompts, answer_texts_of(rows), base=enc["input_ids"] if enc is not None else [])
    for i, prompt in enumerate(all_prompts):
        new_prompt, text, ans_ids = forms[i]
        checks: list[tuple[Any, list[int]]] = []
        if not is_number(text):
            pass  # a string answer (a lookup): the prompt's digits are text, not operands
        elif fast:
            assert enc is not None  # encoded above: there are prompts
            spans = list(zip(enc["input_ids"][i], enc["offset_mapping"][i]))
            for m in _NUMBER.finditer(prompt):
                a, b = m.span()
                checks.append((int(m.group()), [t for t, (s, e) in spans if s < b and e > a]))
        else:  # slow tokenizers have no offsets: judge each number on its own
            for v in _NUMBER.findall(prompt):
                cache.setdefault(int(v), tok.encode(str(int(v)), add_special_tokens=False))
                checks.append((int(v), cache[int(v)]))
        checks.append((int(text) if is_number(text) else text, ans_ids))
        bad = next(((v, ids) for v, ids in checks if len(ids) != 1 or ids[0] == unk), None)
        if bad is None:
            keep.append(i)
            prompts.append(new_prompt)
            texts.append(text)
        elif strict:
            v, ids = bad
            pieces = tok.convert_ids_to_tokens(ids)
            what = (f"is an unknown token ({pieces[0]})" if len(ids) == 1 else
                    f"is split into {len(ids)} tokens {pieces}")
            kind = "number" if isinstance(v, int) else "answer"
            raise PromptError(f"{kind} {v!r} {what} for this tokenizer, but the task demands single-token "
                              f"{kind}s (row {i}: {prompt!r})")
    dropped = len(ds) - len(keep)
    if verbose:
        from circuits.logs import get_logger

        get_logger("tasks").info("filter_single_token: kept %d, dropped %d of %d", len(keep), dropped, len(ds))
    cols = {c: [v[i] for i in keep] for c, v in rows.items() if c != "answer_text"}
    cols.update(prompt=prompts, answer_text=texts)
    return Dataset.from_dict(cols), dropped


def answer_token_ids(model: Model, answers: Sequence[str | SupportsInt]) -> Int[torch.Tensor, " n"]:
    """Token id of each answer as the *next* token after the prompt, shape ``[len(answers)]`` (long).

    An integer answer is looked up as ``str(answer)``, falling back to the space-prefixed form
    ``" " + str(answer)`` (GPT-2 style BPE) when only that is one token; a string answer (an
    ``answer_text`` of :func:`filter_single_token`) is encoded as it is. Raises
    :class:`~circuits.errors.PromptError` if an answer is not a single token."""
    import torch

    tok = tokenizer_of(model)
    texts = [a if isinstance(a, str) else str(int(a)) for a in answers]
    ids = list(encode_texts(tok, texts)["input_ids"])
    spaced = [i for i, (a, x) in enumerate(zip(answers, ids)) if not isinstance(a, str) and len(x) != 1]
    if spaced:  # integer answers that are one token only with a leading space (GPT-2 style BPE)
        again = encode_texts(tok, [" " + texts[i] for i in spaced])["input_ids"]
        for i, x in zip(spaced, again):
            ids[i] = x
    for a, x in zip(answers, ids):
        if len(x) != 1:
            raise PromptError(f"answer {a!r} is not a single token: {tok.convert_ids_to_tokens(x)}")
    return torch.tensor([x[0] for x in ids], dtype=torch.long)


def resolve_bos(model: Model, prepend_bos: bool | None = None) -> int | None:
    """The token id to put at position 0, or ``None`` for no BOS.

    ``prepend_bos=None``: the model's default (``model.cfg.default_prepend_bos``, True when the model
    has no such setting). ``True`` on a tokenizer without a BOS token (Qwen2) uses its EOS token
    (``<|endoftext|>``, the document separator of its training text). Raises
    :class:`~circuits.errors.ArgumentError` when BOS is asked for and the tokenizer has neither."""
    check_prepend_bos(prepend_bos)
    if prepend_bos is None:
        prepend_bos = bool(getattr(getattr(model, "cfg", None), "default_prepend_bos", True))
    if not prepend_bos:
        return None
    tok = tokenizer_of(model)
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    if bos is None:
        raise ArgumentError("prepend_bos=True but the tokenizer has no BOS or EOS token: use prepend_bos=False")
    return int(bos)


def check_prepend_bos(prepend_bos: Any) -> bool | None:
    """``prepend_bos`` if it is ``True``, ``False`` or ``None`` (the model's default), else
    :class:`~circuits.errors.ArgumentError`."""
    if prepend_bos not in (None, True, False):
        raise ArgumentError(f"prepend_bos={prepend_bos!r} must be True, False or None (the model's default)")
    return prepend_bos


@dataclass(frozen=True)
class Layout:
    """Prompts of one token length, ready for a forward pass without padding.

    Attributes:
        tokens: ``[batch, pos]`` long tensor, BOS at position 0 (when prepended), last prompt token at -1
            (answers of ``k > 1`` tokens: followed by the first ``k-1`` answer tokens, see
            :mod:`circuits.tasks.digits`).
        answers: ``[batch]`` long tensor, answer token ids (see :func:`answer_token_ids`); ``[batch, k]`` for
            answers of ``k`` tokens.
        prompts: prompt strings (without BOS), one per row.
        answer_values: the answers, one per row (integers; strings for a task whose answers are text).
        indices: row indices into the source dataset, one per row.
        answer_texts: the answer as written after the prompt (``"112"`` / ``" 112"``), when known.
        bos: the token id at position 0, or ``None`` when no BOS was prepended.
        key: what groups the rows: the token length, or the layout key of :mod:`circuits.tasks.digits`.
    """

    tokens: torch.Tensor
    answers: torch.Tensor
    prompts: list[str]
    answer_values: list[int | str]
    indices: list[int]
    answer_texts: list[str] | None = None
    bos: int | None = None
    key: object = None

    @property
    def n_pos(self) -> int:
        """Token length of the layout (BOS included)."""
        return int(self.tokens.shape[1])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def to_layouts(model: Model, ds: Dataset, prepend_bos: bool | None = None) -> list[Layout]:
    """Tokenise ``ds["prompt"]`` with the model and group rows by token length.

    BOS per :func:`resolve_bos` (``None``: the model's default). Answer ids come from the
    ``answer_text`` column when there is one (see :func:`filter_single_token`), else from ``answer``.
    Prompts of different lengths are never mixed: one :class:`Layout` per length, sorted by descending
    number of rows (ties: shorter length first). Row order inside a layout follows ``ds``. Rows of
    :func:`circuits.tasks.digits.filter_multi_token` (columns ``answer_ids``, ``layout``) are grouped by their
    layout key and carry their first ``k-1`` answer tokens (``answers`` ``[batch, k]``; ``[batch]`` when
    ``k = 1``).
    """
    import torch

    prompts = list(ds["prompt"])
    answers = [a if isinstance(a, str) else int(a) for a in ds["answer"]]
    if not prompts:
        return []
    bos = resolve_bos(model, prepend_bos)
    columns = getattr(ds, "column_names", ())
    texts = list(ds["answer_text"]) if "answer_text" in columns else None
    multi = list(ds["answer_ids"]) if "answer_ids" in columns else None  # numbers of several tokens (tasks.digits)
    keys = list(ds["layout"]) if multi is not None else None
    tok = tokenizer_of(model)
    # One batched call without special tokens, then BOS in front: what model.to_tokens(p) gives; answers of k
    # tokens add their first k-1 (teacher forcing).
    enc = encode_texts(tok, prompts)["input_ids"]
    rows: list[torch.Tensor] = []
    groups: dict[object, list[int]] = {}
    for i, ids in enumerate(enc):
        forced = [] if multi is None else list(multi[i][:-1])
        t = torch.tensor(([bos] if bos is not None else []) + list(ids) + forced, dtype=torch.long)
        rows.append(t)
        groups.setdefault(len(t) if keys is None else keys[i], []).append(i)
    ans_ids = answer_token_ids(model, texts if texts is not None else answers) if multi is None else None
    layouts = []
    for key, idx in sorted(groups.items(), key=lambda kv: (-len(kv[1]), len(rows[kv[1][0]]), str(kv[0]))):
        if multi is None:
            assert ans_ids is not None  # single-token answers: looked up above
            lay_answers = ans_ids[idx].clone()
        else:
            lay_answers = torch.tensor([multi[i] for i in idx], dtype=torch.long)
            lay_answers = lay_answers[:, 0] if lay_answers.shape[1] == 1 else lay_answers
        layouts.append(Layout(
            tokens=torch.stack([rows[i] for i in idx]).long(),
            answers=lay_answers,
            prompts=[prompts[i] for i in idx],
            answer_values=[answers[i] for i in idx],
            indices=list(idx),
            answer_texts=[texts[i] for i in idx] if texts is not None else None,
            bos=bos,
            key=key,
        ))
    return layouts


def filter_correct(
    model: Model, ds: Dataset, batch_size: int = 256, prepend_bos: bool | None = None
) -> tuple[Dataset, float]:
    """Keep the rows the model answers correctly: argmax of the float32 logits at the last position
    equals the answer token. Rows are grouped by layout (token length, BOS per ``prepend_bos`` as in
    :func:`to_layouts`) internally, so no padding is used.

    Returns:
        ``(correct_rows, base_accuracy)`` with base accuracy = correct / checked (0.0 for an empty ``ds``).
        Correct rows keep their original order.
    """
    import torch

    if len(ds) == 0:
        return ds, 0.0
    dev = next(model.parameters()).device
    if dev.type == "meta":  # a remote model (weights on NDIF): its inputs are built here, on the CPU
        dev = torch.device("cpu")
    from circuits.tasks.positions import check_positions
    from interventions.readout import answer_positions

    layouts = to_layouts(model, ds, prepend_bos=prepend_bos)
    for lay in layouts:  # before any forward pass: one past the position table is an IndexError
        check_positions(model, lay.n_pos, lay.prompts[0] if lay.prompts else None)
    correct: list[int] = []
    with torch.no_grad():
        for lay in layouts:
            for s in range(0, len(lay), batch_size):
                ans = lay.answers[s : s + batch_size]
                logits = answer_positions(model(lay.tokens[s : s + batch_size].to(dev), return_type="logits"), ans)
                hit = (logits.float().argmax(-1).cpu() == ans)
                hits = (hit if ans.ndim == 1 else hit.all(dim=1)).tolist()
                correct += [lay.indices[s + j] for j, h in enumerate(hits) if h]
    correct.sort()
    return ds.select(correct), len(correct) / len(ds)
