"""A live `draftsmith serve` app on 127.0.0.1 (uvicorn in a thread, a free port) over a tiny float32
target, for the real `openai` client to talk to."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import pytest
import torch
import uvicorn
from tokenizers import decoders
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

from draftsmith.drafters import registry
from draftsmith.serve.app import create_app
from draftsmith.target.model import load_target

MODEL = "tiny-serve"


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def live(app):
    """Run `app` under uvicorn on a free loopback port; yields the base URL (with /v1)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def make_app(target, drafter: str = "ngram", **kw):
    return create_app(target, registry.build(drafter), model_name=MODEL, **kw)


@pytest.fixture(scope="session")
def served(serve_target):
    """The shared server, (url, app): ngram drafter, k=4, continuous batching over up to 16 rows."""
    app = make_app(serve_target, k=4, max_batch=16, max_queue=64)
    with live(app) as url:
        yield url, app


@pytest.fixture(scope="session")
def server(served):
    return served[0]
