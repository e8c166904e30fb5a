"""Hugging Face tokenizers built offline, and the preparation ``TransformerBridge.boot_transformers``
needs for a locally built tokenizer."""

from __future__ import annotations


def make_word_tokenizer(d_vocab: int, bos_token: str = "<bos>", add_bos: bool = True):
    """A word-level ``PreTrainedTokenizerFast``: ``<bos>``=0, ``<unk>``=1, ``w0..``.

    Built fully offline. ``add_bos`` installs a post-processor that prepends BOS.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {bos_token: 0, "<unk>": 1}
    for i in range(d_vocab - 2):
        vocab[f"w{i}"] = i + 2
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if add_bos:
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", special_tokens=[(bos_token, 0)]
        )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=bos_token,
        eos_token=bos_token,
        pad_token=bos_token,
        unk_token="<unk>",
    )
    return prepare_tokenizer(tok)


def prepare_tokenizer(tokenizer, name: str = "local-tokenizer"):
    """Make a locally built HF tokenizer acceptable to ``boot_transformers``.

    TL 4.x (``get_tokenizer_with_bos``) pops ``init_kwargs["name_or_path"]``
    (KeyError for a tokenizer built from a ``tokenizers.Tokenizer`` object) and,
    unless ``add_bos_token`` is truthy, re-downloads the tokenizer with
    ``AutoTokenizer.from_pretrained(name_or_path, add_bos_token=True)``.
    Setting both keys keeps the tokenizer as-is (no network). Whether BOS is
    actually prepended is then detected by TL (``cfg.tokenizer_prepends_bos``)
    and ``to_tokens`` prepends it manually when the tokenizer does not.
    """
    if tokenizer is None:
        return None
    tokenizer.init_kwargs.setdefault("name_or_path", getattr(tokenizer, "name_or_path", "") or name)
    if not tokenizer.init_kwargs.get("name_or_path"):
        tokenizer.init_kwargs["name_or_path"] = name
    tokenizer.init_kwargs["add_bos_token"] = True
    return tokenizer
