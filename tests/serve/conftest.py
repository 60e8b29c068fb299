"""Fixtures: a tiny float32 target with a chat template, and one shared live server over it, for the
real `openai` client to talk to."""

from __future__ import annotations

import pytest
import torch
from tokenizers import decoders
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

from draftsmith.target.model import load_target

from .live import live, make_app


@pytest.fixture(scope="session")
def serve_target_dir(tiny_checkpoint, tmp_path_factory):
    """The tiny tokenizer over an untied random model (the tied one echoes its last token forever); a
    larger EOS row makes some answers stop early; a fused decoder makes decode(encode(text)) == text."""
    out = tmp_path_factory.mktemp("serve-target")
    cfg = AutoConfig.from_pretrained(tiny_checkpoint)
    cfg.tie_word_embeddings = False
    cfg.max_position_embeddings = 512
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight[cfg.eos_token_id].mul_(2.0)
    model.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    tok.backend_tokenizer.decoder = decoders.Fuse()
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def serve_target(serve_target_dir):
    return load_target(serve_target_dir, "float32", "cpu")


@pytest.fixture(scope="session")
def served(serve_target):
    """The shared server, (url, app): ngram drafter, k=4, continuous batching over up to 16 rows."""
    app = make_app(serve_target, k=4, max_batch=16, max_queue=64)
    with live(app) as url:
        yield url, app


@pytest.fixture(scope="session")
def server(served):
    return served[0]
