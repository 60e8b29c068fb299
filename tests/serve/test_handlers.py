"""The route handlers and request checks of `serve/app.py` on their own: no server, no model, a
`ServeState` with stand-ins for the scheduler and tokenizer."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from draftsmith.serve import protocol as P
from draftsmith.serve.app import (
    MIN_TOP_P,
    ServeState,
    completion_ids,
    health,
    list_models,
    parse_request,
    sampling_of,
    token_budget,
)
from draftsmith.serve.metrics import Metrics

MODEL = "m"


def state(alive: bool = True) -> ServeState:
    return ServeState(
        model=MODEL, max_len=16, max_queue=2, tokenizer=lambda text: {"input_ids": [ord(c) for c in text]},
        vocab_size=200, scheduler=SimpleNamespace(alive=alive), metrics=Metrics(MODEL),
    )  # fmt: skip


def request(s: ServeState, body: bytes = b"") -> Request:
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    app = SimpleNamespace(state=SimpleNamespace(serve=s))
    return Request({"type": "http", "method": "POST", "headers": [], "app": app}, receive)


def chat(**kw) -> P.ChatRequest:
    return P.ChatRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **kw}
    )


def test_health_answers_503_once_the_engine_thread_stopped() -> None:
    assert asyncio.run(health(request(state(alive=True)))) == {"status": "ok"}
    stopped = asyncio.run(health(request(state(alive=False))))
    assert stopped.status_code == 503 and json.loads(stopped.body) == {"status": "engine stopped"}


def test_models_lists_the_state_model_and_context() -> None:
    (card,) = asyncio.run(list_models(request(state())))["data"]
    assert card["id"] == MODEL and card["max_model_len"] == 16


@pytest.mark.parametrize(
    "body,param",
    [
        (b"{not json", None),
        (b"[1]", None),
        (json.dumps({"model": "other", "messages": [{"role": "user", "content": "x"}]}).encode(), "model"),
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), "n"),
    ],
)
def test_parse_request_refuses_with_a_400(body: bytes, param: str | None) -> None:
    with pytest.raises(P.APIError) as e:
        asyncio.run(parse_request(request(state(), body), P.ChatRequest, MODEL))
    assert e.value.status == 400 and e.value.body()["error"]["param"] == param


def test_token_budget_fills_the_context_or_refuses() -> None:
    assert token_budget(chat(), 6, 16, "messages") == 10  # no max_tokens: what the context leaves
    assert token_budget(chat(max_tokens=10), 6, 16, "messages") == 10
    for n_prompt, max_tokens, param in [(0, 4, "messages"), (16, None, "messages"), (6, 11, "max_tokens")]:
        with pytest.raises(P.APIError) as e:
            token_budget(chat(max_tokens=max_tokens), n_prompt, 16, "messages")
        assert e.value.status == 400 and e.value.body()["error"]["param"] == param


def test_completion_ids_takes_one_prompt_in_any_of_openai_forms() -> None:
    tok = state().tokenizer
    assert completion_ids("ab", tok, 200) == completion_ids(["ab"], tok, 200) == [97, 98]
    assert completion_ids([[5, 6]], tok, 200) == completion_ids([5, 6], tok, 200) == [5, 6]
    for prompt in (["a", "b"], [200]):
        with pytest.raises(P.APIError):
            completion_ids(prompt, tok, 200)


def test_sampling_of_maps_tiny_temperature_to_greedy_and_seeds_the_generator() -> None:
    sampling, gen = sampling_of(chat(temperature=1e-9))
    assert sampling.greedy and gen is None
    a, gen_a = sampling_of(chat(temperature=0.7, seed=3, top_p=MIN_TOP_P / 10))
    _, gen_b = sampling_of(chat(temperature=0.7, seed=3))
    assert a.top_p == MIN_TOP_P and gen_a.initial_seed() == gen_b.initial_seed()
