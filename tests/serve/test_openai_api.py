"""The real `openai` client against a live server: chat and completions, streaming and not, equal to
plain greedy decoding (the engine's and `draftsmith generate`'s); 16 concurrent streaming clients
each equal to their solo run; stop strings, seeds, usage and its `spec_decode` extension."""

from __future__ import annotations

import asyncio
import json
import random

import openai
import pytest

from draftsmith.cli import main
from draftsmith.decoding.engine import generate
from draftsmith.decoding.sampling import draft_stream, make_generator
from draftsmith.drafters.ngram import NgramFactory
from draftsmith.serve.app import create_app
from draftsmith.target.chat import encode_messages

from .live import MODEL, live


def solo(target, ids: list[int], max_tokens: int) -> tuple[str, str, list[int]]:
    """(text, finish_reason, token ids) of plain greedy decoding, the reference for the server."""
    res = generate(target, None, [ids], max_new_tokens=max_tokens)[0]
    return target.tokenizer.decode(res.token_ids, skip_special_tokens=True), res.finish_reason, res.token_ids


def chat_ids(target, text: str) -> list[int]:
    return encode_messages(target.tokenizer, [{"role": "user", "content": text}])


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key="EMPTY", max_retries=0, timeout=60)


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_greedy_equals_draftsmith_generate(client, serve_target_dir, serve_target, capsys):
    prompt = "Write a haiku about the sea"
    assert main(["generate", "--target", serve_target_dir, "--dtype", "float32", "--drafter", "ar"]
                + ["--max-new-tokens", "40", "--json", prompt]) == 0  # fmt: skip
    cli = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=40, temperature=0
    )
    assert resp.choices[0].message.content == cli["text"]
    assert resp.choices[0].finish_reason == cli["finish_reason"]
    assert resp.usage.completion_tokens == len(cli["token_ids"])
    assert resp.usage.prompt_tokens == len(chat_ids(serve_target, prompt))
    spec = resp.usage.model_extra["spec_decode"]
    assert set(spec) == {"tau", "drafted", "accepted", "steps"} and spec["accepted"] <= spec["drafted"]


def test_chat_stream_equals_non_stream(client, serve_target):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "count: 1 2 3 4"}]
    text, finish, ids = solo(serve_target, encode_messages(serve_target.tokenizer, messages), 48)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=48,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        finish
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)


@pytest.mark.parametrize("stream", [False, True])
def test_completions_greedy_equal_plain_decoding(client, serve_target, stream):
    prompt = "def add(a, b):\n    return a + b\n\ndef"
    ids = serve_target.tokenizer(prompt)["input_ids"]
    text, finish, _ = solo(serve_target, ids, 32)
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0, stream=stream)
    if stream:
        chunks = list(resp)
        assert "".join(c.choices[0].text for c in chunks) == text
        assert chunks[-1].choices[0].finish_reason == finish
    else:
        assert resp.choices[0].text == text and resp.choices[0].finish_reason == finish
    # Token ids are a prompt too.
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=32, temperature=0)
    assert by_ids.choices[0].text == text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_answer(client, serve_target, stream):
    prompt = "tell me a story"
    text, _, _ = solo(serve_target, chat_ids(serve_target, prompt), 60)
    stop = text[12:14]
    assert len(stop) == 2 and stop in text
    want = text[: text.find(stop)]
    kw = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=60, temperature=0)
    if stream:
        chunks = list(client.chat.completions.create(**kw, stop=[stop, "never-there"], stream=True))
        got = "".join(c.choices[0].delta.content or "" for c in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        resp = client.chat.completions.create(**kw, stop=stop)
        got, finish = resp.choices[0].message.content, resp.choices[0].finish_reason
    assert got == want and finish == "stop"


def test_seeded_sampling_reproduces(client):
    kw = dict(model=MODEL, prompt="once upon a time", max_tokens=24, temperature=1.0, top_p=0.9)
    a = client.completions.create(**kw, seed=7).choices[0].text
    b = client.completions.create(**kw, seed=7).choices[0].text
    assert a == b


class _Recording(NgramFactory):
    """Prompt lookup that records the settings each request's drafter is made with."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __call__(self, sampling=None, generator=None):
        self.made.append((sampling, generator))
        return super().__call__(sampling, generator)


def test_each_request_drafts_with_its_own_sampling(serve_target):
    """The server's batch is bound greedy; a request at temperature > 0 still reaches its drafter
    with its own settings and a draft stream tied to its seed (EAGLE-3, MTP and draft LMs sample)."""
    factory = _Recording()
    with live(create_app(serve_target, factory, model_name=MODEL, k=4)) as url:
        client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=60)
        kw = dict(model=MODEL, prompt="abc", max_tokens=4)
        client.completions.create(**kw, temperature=0.7, top_p=0.9, seed=5)
        client.completions.create(**kw, temperature=0)
    (hot, stream), (cold, none) = factory.made
    assert (hot.temperature, hot.top_p, hot.seed) == (0.7, 0.9, 5) and cold.greedy and none is None
    assert stream.initial_seed() == draft_stream(make_generator(5, 0)).initial_seed()


def test_sixteen_concurrent_streams_each_equal_their_solo_run(served, serve_target):
    server, app = served
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "sea", "sky", "tree", "code", "list", "map"]
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(16)]
    budgets = [rng.randint(8, 64) for _ in range(16)]
    expected = [
        solo(serve_target, chat_ids(serve_target, p), n)[:2] for p, n in zip(prompts, budgets, strict=True)
    ]

    async def one(client, i):
        await asyncio.sleep(rng.random() * 0.3)  # staggered: requests join a batch already decoding
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompts[i]}],
            max_tokens=budgets[i],
            temperature=0,
            stream=True,
        )
        text, finish = [], None
        async for c in stream:
            text.append(c.choices[0].delta.content or "")
            finish = c.choices[0].finish_reason or finish
        return "".join(text), finish

    async def run():
        client = openai.AsyncOpenAI(base_url=server, api_key="EMPTY", max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(16)))
        finally:
            await client.close()

    got = asyncio.run(run())
    for i in range(16):
        assert got[i] == expected[i], i
    assert app.state.scheduler.peak_rows > 4  # they were decoded together, not one after another


def test_metrics_and_health(server, client):
    import urllib.request

    client.completions.create(model=MODEL, prompt="abc abc abc abc", max_tokens=16, temperature=0)
    root = server.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/health") as r:
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
    with urllib.request.urlopen(f"{root}/metrics") as r:
        text = r.read().decode()
    for name in (
        "spec_decode_num_drafts_total",
        "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total",
        "spec_decode_num_accepted_tokens_per_pos_total",
        "time_to_first_token_seconds_bucket",
        "time_per_output_token_seconds_bucket",
    ):
        assert name in text, name
    drafts = _sample(text, "spec_decode_num_drafts_total")
    accepted = _sample(text, "spec_decode_num_accepted_tokens_total")
    per_pos = sum(_samples(text, "spec_decode_num_accepted_tokens_per_pos_total"))
    assert drafts > 0 and accepted == per_pos


def _samples(text: str, name: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]


def _sample(text: str, name: str) -> float:
    (value,) = _samples(text, name)
    return value
