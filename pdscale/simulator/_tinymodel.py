"""A tiny llama-style model folder for Dynamo's frontend and mocker workers, built at run time.

Dynamo's frontend needs a model folder for its tokenizer, chat template and context length, and
its mocker workers read the same folder's ``config.json``; no weights are loaded. There is no
model hub here, and a real tokenizer would make a prompt's token count depend on its text, so
the folder is made up: a ``tokenizer.json`` with a **WordLevel** model over a few thousand
made-up words split on whitespace, so that one word is exactly one token and a prompt of ``n``
vocabulary words is exactly ``n`` prompt tokens (the replayer relies on it), and a chat template
that adds no tokens of its own (the messages' contents joined by a space). About 100 KB, written
by hand as JSON (no ``tokenizers`` package needed), deterministic, never committed.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "build_tiny_model", "tiny_vocabulary"]

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
"""Token ids 0, 1, 2: unknown, begin and end of sequence."""

CHAT_TEMPLATE = ("{% for message in messages %}{{ message['content'] }}"
                 "{% if not loop.last %} {% endif %}{% endfor %}")
"""The rendered prompt is the contents joined by one space: no role markers, no extra tokens."""

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_MARKER = ".pdscale-tiny-model.json"


def tiny_vocabulary(size: int = 4000) -> list[str]:
    """``size`` distinct lower-case made-up words (consonant-vowel syllables), in a fixed
    order: ``bab``, ``bad``, ... then longer ones. The same size gives the same list."""
    if size < 1:
        raise ValueError(f"The 'size' parameter of tiny_vocabulary must be >= 1. Got {size}.")
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    words: list[str] = []
    # Two syllables and a closing consonant (4,900 words), then three syllables.
    for first in syllables:
        for second in syllables:
            for end in _CONSONANTS:
                words.append(first + second + end)
                if len(words) == size:
                    return words
    for a in syllables:
        for b in syllables:
            for c in syllables:
                words.append(a + b + c)
                if len(words) == size:
                    return words
    raise ValueError(f"tiny_vocabulary can make at most {len(words)} words. Got size={size}.")


def _tokenizer_json(words: list[str]) -> dict[str, object]:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({w: len(SPECIAL_TOKENS) + i for i, w in enumerate(words)})
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, tok in enumerate(SPECIAL_TOKENS)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        # WordPiece's decoder puts a space between words (WordLevel has no decoder of its own).
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def build_tiny_model(folder: Path, *, vocab_size: int = 4000,
                     max_context_tokens: int = 65536) -> Path:
    """Write the model folder (``config.json``, ``tokenizer.json``, ``tokenizer_config.json``,
    ``generation_config.json``) into ``folder`` and return it. Idempotent: a folder already
    built with the same settings is left as it is (a marker file records them)."""
    if max_context_tokens < 16:
        raise ValueError("The 'max_context_tokens' parameter of build_tiny_model must be >= 16."
                         f" Got {max_context_tokens}.")
    settings = {"vocab_size": vocab_size, "max_context_tokens": max_context_tokens,
                "format": 1}
    marker = folder / _MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == settings:
                return folder
        except (OSError, ValueError):
            pass
    words = tiny_vocabulary(vocab_size)
    n_vocab = len(SPECIAL_TOKENS) + len(words)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": n_vocab,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "max_position_embeddings": max_context_tokens,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": max_context_tokens,
        "chat_template": CHAT_TEMPLATE,
    }
    generation_config = {"bos_token_id": 1, "eos_token_id": 2}
    folder.mkdir(parents=True, exist_ok=True)
    files = {"config.json": config, "tokenizer.json": _tokenizer_json(words),
             "tokenizer_config.json": tokenizer_config,
             "generation_config.json": generation_config}
    for name, body in files.items():
        (folder / name).write_text(json.dumps(body, indent=None, sort_keys=False) + "\n")
    marker.write_text(json.dumps(settings) + "\n")
    return folder
