"""`draftsmith serve` as users start it: a subprocess that answers on its port, one-line errors with
exit code 2 for bad flags, and an engine failure that fails its requests but not the server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest

from draftsmith.cli import main
from draftsmith.target.model import load_target

from .live import MODEL, free_port, live, make_app


def test_serve_subprocess_answers(serve_target_dir):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "draftsmith", "serve", "--target", serve_target_dir, "--dtype", "float32",
           "--port", str(port), "--drafter", "suffix", "--served-model-name", "m"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    assert json.loads(r.read()) == {"status": "ok"}
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0)
        out = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
        )
        assert out.usage.completion_tokens <= 5 and out.choices[0].finish_reason in ("stop", "length")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "flags,match",
    [
        (["--max-batch", "0"], "--max-batch"),
        (["--k", "0"], "--k"),
        (["--max-queue", "-1"], "--max-queue"),
        (["--port", "70000"], "--port"),
        (["--max-model-len", "100000"], "--max-model-len"),
    ],
)
def test_bad_flags_are_one_line_errors(serve_target_dir, capsys, flags, match):
    assert main(["serve", "--target", serve_target_dir, "--dtype", "float32", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_port_in_use_is_one_line_error(serve_target_dir, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", "--target", serve_target_dir, "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"127.0.0.1:{port}" in err and len(err.splitlines()) == 1


def test_engine_failure_fails_its_requests_not_the_server(serve_target_dir):
    t = load_target(serve_target_dir, "float32", "cpu")
    forward, calls = t.forward, []

    def flaky(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated device error")
        return forward(*args, **kw)

    t.forward = flaky
    with live(make_app(t, "ar")) as url:
        client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)
        kw = dict(model=MODEL, prompt="abc", max_tokens=4, temperature=0)
        with pytest.raises(openai.InternalServerError, match="simulated device error"):
            client.completions.create(**kw)
        assert client.completions.create(**kw).usage.completion_tokens == 4
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health") as r:
            assert r.status == 200
