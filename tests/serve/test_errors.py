"""Client mistakes get OpenAI error objects with a 4xx status; a property-based fuzz of request
bodies never gets a 5xx and never stops the server."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .live import MODEL


def post(url: str, path: str, body, raw: bytes | None = None) -> tuple[int, dict | str]:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        data = raw if raw is not None else json.dumps(body).encode()
        conn.request("POST", f"/v1{path}", body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    if resp.getheader("content-type", "").startswith("application/json"):
        return resp.status, json.loads(text)
    return resp.status, text


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 4}


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/chat/completions", {**CHAT, "model": "gpt-4"}, "model"),
        ("/chat/completions", {**CHAT, "max_tokens": -1}, "max_tokens"),
        ("/chat/completions", {**CHAT, "max_tokens": 0}, "max_tokens"),
        ("/chat/completions", {**CHAT, "max_tokens": 10**12}, "max_tokens"),
        ("/chat/completions", {**CHAT, "max_tokens": 4.5}, "max_tokens"),
        ("/chat/completions", {**CHAT, "temperature": -0.1}, "temperature"),
        ("/chat/completions", {**CHAT, "temperature": 2.5}, "temperature"),
        ("/chat/completions", {**CHAT, "top_p": 0}, "top_p"),
        ("/chat/completions", {**CHAT, "top_p": 1.5}, "top_p"),
        ("/chat/completions", {**CHAT, "n": 2}, "n"),
        ("/chat/completions", {**CHAT, "messages": []}, "messages"),
        ("/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ("/chat/completions", {**CHAT, "messages": "hi"}, "messages"),
        ("/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * 600}]}, "messages"),
        ("/chat/completions", {**CHAT, "logprobs": True}, "logprobs"),
        ("/chat/completions", {k: v for k, v in CHAT.items() if k != "model"}, "model"),
        ("/completions", {**COMPLETION, "prompt": ""}, "prompt"),
        ("/completions", {**COMPLETION, "prompt": [10**9]}, "prompt"),
        ("/completions", {**COMPLETION, "prompt": ["a", "b"]}, "prompt"),
        ("/completions", {**COMPLETION, "prompt": "x" * 600}, "prompt"),
        ("/completions", {**COMPLETION, "max_tokens": 511}, "max_tokens"),
        ("/completions", {**COMPLETION, "presence_penalty": 1.0}, "presence_penalty"),
        ("/completions", [COMPLETION], None),
    ],
)
def test_bad_requests_get_openai_errors(server, path, body, param):
    status, out = post(server, path, body)
    assert status == 400, out
    assert set(out["error"]) == {"message", "type", "param", "code"}
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["message"]
    assert out["error"]["param"] == param


@pytest.mark.parametrize("raw", [b"{bad", b"", b"\xff\xfe", b"null", b'{"model": NaN}'])
def test_malformed_json_is_a_400(server, raw):
    status, out = post(server, "/chat/completions", None, raw=raw)
    assert status == 400 and "error" in out


def test_unknown_route_and_method_are_openai_errors(server):
    status, out = post(server, "/embeddings", COMPLETION)
    assert status == 404 and "error" in out


def test_openai_client_sees_bad_request(server):
    import openai

    client = openai.OpenAI(base_url=server, api_key="EMPTY", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=MODEL, prompt="x" * 300, max_tokens=300)


# ---- fuzz --------------------------------------------------------------------------------------

anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
# Valid values for every field; the fuzz then corrupts up to two fields of a valid body, so about a
# third of the requests generate text and the rest probe one or two mistakes at a time.
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "developer"]), "content": st.text(max_size=30)}
)
VALID = {
    "model": st.just(MODEL),
    "max_tokens": st.integers(1, 6),
    "temperature": st.just(0) | st.floats(0, 2),
    "top_p": st.floats(0.05, 1),
    "seed": st.integers(-(2**70), 2**70),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=4),
    "stream": st.booleans(),
    "n": st.just(1),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "messages": st.lists(message, min_size=1, max_size=3),
    "prompt": st.text(max_size=40) | st.lists(st.integers(0, 99), min_size=1, max_size=8),
}
BAD = {
    "max_tokens": st.sampled_from([0, -1, 511, 10**30, -(10**30), 2.5, "4", True]),
    "temperature": st.floats(allow_nan=False) | st.sampled_from([-0.01, 2.01, "hot"]),
    "top_p": st.sampled_from([0, -0.1, 1.01, "1"]),
    "n": st.integers(-2, 4),
    "messages": st.lists(st.fixed_dictionaries({"role": anything, "content": anything}), max_size=2),
    "prompt": st.lists(st.integers(-5, 10**6), max_size=4) | st.lists(st.text(max_size=3), max_size=3),
}


@st.composite
def bodies(draw, path: str):
    keys = ["model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "n", "stream_options"]
    keys.append("messages" if path == "/chat/completions" else "prompt")
    required = {"model", "max_tokens", keys[-1]}
    body = {k: draw(VALID[k]) for k in keys if k in required or draw(st.booleans())}
    for k in draw(st.sets(st.sampled_from(keys), max_size=2)):
        choice = draw(st.sampled_from(["bad", "anything", "missing"]))
        if choice == "missing":
            body.pop(k, None)
        else:
            body[k] = draw(BAD.get(k, anything) if choice == "bad" else anything)
    return body


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/chat/completions", "/completions"]), data=st.data())
def test_fuzzed_bodies_never_get_a_5xx(server, path, data):
    body = data.draw(bodies(path))
    status, out = post(server, path, body)
    event(f"HTTP {status}")
    assert status < 500, (body, out)
    if status != 200:
        assert isinstance(out, dict) and out["error"]["message"], (body, out)
    elif body.get("stream") is True:
        assert out.rstrip().endswith("data: [DONE]")


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_fuzzed_raw_bytes_never_get_a_5xx(server, raw):
    status, _ = post(server, "/chat/completions", None, raw=raw)
    assert status == 400
