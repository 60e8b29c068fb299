"""A live `draftsmith serve` app for tests: uvicorn on a free 127.0.0.1 port, in a thread."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

from draftsmith.drafters import registry
from draftsmith.serve.app import create_app

MODEL = "tiny-serve"


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
