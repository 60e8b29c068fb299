"""Shared fixtures: a tiny local HF checkpoint (random Llama + character tokenizer + chat template),
the kind of folder `--target PATH` and hub ids load through the same from_pretrained path."""

from __future__ import annotations

import os
import string

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# The engine's fast path runs uncompiled in the suite: every tiny architecture would otherwise pay a
# few torch.compile runs of several seconds each. The same layer function runs either way; the
# compiled one is checked in tests/target/test_lean_decoder.py and the SmolLM2 lossless tests.
os.environ.setdefault("DRAFTSMITH_COMPILE", "0")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_checkpoint(path, max_positions: int = 256, seed: int = 0) -> str:
    chars = list(string.printable)
    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def one_thread():
    """For modules of tiny models (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny matrices
    gain nothing from threads, and on a shared 2-core machine OpenMP's spinning workers make them up
    to 10x slower; the torchrun tests set OMP_NUM_THREADS=1 likewise."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> str:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))
