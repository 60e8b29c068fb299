"""Admission and cancellation on a deliberately slow target (each forward sleeps): a full queue is a
429 with Retry-After, and a client that goes away stops its generation within a step or two."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse
from urllib.request import urlopen

import openai
import pytest

from draftsmith.target.model import load_target

from .live import MODEL, live, make_app

STEP_S = 0.02


@pytest.fixture(scope="module")
def slow_target(serve_target_dir):
    t = load_target(serve_target_dir, "float32", "cpu")
    forward = t.forward

    def slow(*args, **kw):
        time.sleep(STEP_S)
        return forward(*args, **kw)

    t.forward = slow
    return t


def metric(url: str, name: str, **labels) -> float:
    with urlopen(url.removesuffix("/v1") + "/metrics") as r:
        text = r.read().decode()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_full_queue_is_429_with_retry_after(slow_target):
    app = make_app(slow_target, "ar", max_batch=1, max_queue=1)
    with live(app) as url:
        client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=60)
        kw = dict(model=MODEL, prompt="abc", max_tokens=300, temperature=0, stream=True)
        running = client.completions.create(**kw)
        next(iter(running))  # its first token: it holds the batch's only row
        queued = client.completions.create(**kw)  # waits for that row
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model=MODEL, prompt="abc", max_tokens=4)
        e = info.value
        assert e.status_code == 429 and e.response.headers["retry-after"] == "1"
        assert e.body["type"] == "rate_limit_error" and e.body["code"] == "queue_full"
        assert metric(url, "request_rejected_total") == 1
        running.close()
        queued.close()
        # Both went away: their rows are freed and the server takes new work at once.
        wait_for(lambda: not app.state.scheduler.jobs and not app.state.scheduler.waiting)
        out = client.completions.create(model=MODEL, prompt="abc", max_tokens=3, temperature=0)
        assert out.usage.completion_tokens == 3


def test_disconnect_stops_generation(slow_target):
    app = make_app(slow_target, "ar", max_batch=4, max_queue=4)
    sched = app.state.scheduler
    with live(app) as url:
        client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=60)
        # A streaming client that reads one chunk and leaves.
        stream = client.completions.create(
            model=MODEL, prompt="abc", max_tokens=300, temperature=0, stream=True
        )
        next(iter(stream))
        stream.close()
        wait_for(lambda: metric(url, "request_success_total", finished_reason="cancelled") == 1)
        assert metric(url, "generation_tokens_total") < 100  # 300 tokens would take 6 s

        # A non-streaming client that sends its request and hangs up.
        u = urlparse(url)
        body = json.dumps({"model": MODEL, "prompt": "xyz", "max_tokens": 300, "temperature": 0}).encode()
        with socket.create_connection((u.hostname, u.port)) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            wait_for(lambda: len(sched.jobs) == 1)
        wait_for(lambda: metric(url, "request_success_total", finished_reason="cancelled") == 2)
        assert not sched.jobs and metric(url, "generation_tokens_total") < 200


def test_without_a_queue_only_free_rows_take_requests(slow_target):
    app = make_app(slow_target, "ar", max_batch=2, max_queue=0)
    with live(app) as url:
        client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=60)
        kw = dict(model=MODEL, prompt="abc", max_tokens=300, temperature=0, stream=True)
        streams = [client.completions.create(**kw) for _ in range(2)]
        for s in streams:
            next(iter(s))
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL, prompt="abc", max_tokens=4)
        for s in streams:
            s.close()
        wait_for(lambda: not app.state.scheduler.jobs)
        assert client.completions.create(model=MODEL, prompt="abc", max_tokens=2).usage.completion_tokens == 2
