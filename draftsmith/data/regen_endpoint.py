"""Regeneration through an OpenAI-compatible server (vLLM, SGLang, ...): how users regenerate at scale.

Each conversation is one asyncio task whose turns are sent one after another (a turn needs the
previous answer); a semaphore keeps at most `concurrency` requests in flight, and at most twice that
many conversations are open at once, so finished ones stream out to the resumable file while the
rest run. The server applies its own chat template; the target's tokenizer here only checks that a
prompt plus `max_new_tokens` fits the target's context (the server would refuse it otherwise) and
counts tokens when a server sends no `usage`.

Errors: a server that cannot be reached, refuses the key or the model, or fails (5xx after the
client's retries) ends the run with one line naming the URL (what was written so far is kept; rerun
to resume). A 400 on one request (say, a server whose `--max-model-len` is shorter than the
target's context) ends only that conversation, keeping its earlier turns, and is counted in the
report as "rejected".

`base_url` may be given with or without its `/v1` suffix. The API key is `$OPENAI_API_KEY`, or
"EMPTY" (what vLLM and SGLang accept when started without a key).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable

from draftsmith.data.conversation import Conversation, turn_seed
from draftsmith.errors import UserError


def load_tokenizer(spec: str):
    """(name, tokenizer, max context) of a target without loading its weights."""
    from transformers import AutoConfig, AutoTokenizer

    from draftsmith.target.resolve import resolve_target

    resolved = resolve_target(spec)
    try:
        config = AutoConfig.from_pretrained(resolved.model_path).get_text_config()
        tokenizer = AutoTokenizer.from_pretrained(resolved.model_path)
    except OSError as e:
        raise UserError(f"cannot load target '{spec}': {str(e).splitlines()[0]}") from None
    max_context = getattr(config, "max_position_embeddings", None) or 1 << 20
    return resolved.name, tokenizer, max_context


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def regenerate_endpoint(
    url: str,
    convs: list[Conversation],
    *,
    model: str | None,
    concurrency: int,
    sampling,
    max_new_tokens: int,
    tokenizer,
    max_context: int,
    seed: int,
    on_done: Callable[[list[Conversation]], None],
    on_tokens: Callable[[int], None] | None = None,
    flush_every: int = 8,
) -> None:
    """Write every turn of `convs` through the server at `url`; `on_done` gets finished ones in
    groups of about `flush_every` (each group is one fsync of the output)."""
    import openai

    from draftsmith.target.chat import encode_messages

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=base_url(url), api_key=os.environ.get("OPENAI_API_KEY", "EMPTY"))
        sem = asyncio.Semaphore(concurrency)
        pending: set[asyncio.Task] = set()
        warned = False
        try:
            name = model if model is not None else await _first_model(client, url)

            async def one(c: Conversation) -> Conversation:
                nonlocal warned
                for turn in range(len(c.segments)):
                    history = c.history(turn)
                    if len(encode_messages(tokenizer, history)) + max_new_tokens > max_context:
                        c.ended_by = "context"
                        break
                    try:
                        async with sem:
                            resp = await client.chat.completions.create(
                                model=name,
                                messages=history,
                                max_tokens=max_new_tokens,
                                temperature=sampling.temperature,
                                top_p=sampling.top_p,
                                seed=turn_seed(seed, c.index, turn),
                            )
                    except openai.BadRequestError as e:
                        if not warned:
                            warned = True
                            sys.stderr.write(
                                f"endpoint {url} refused a request ({_short(e)}); skipping such turns\n"
                            )
                        c.ended_by = "rejected"
                        break
                    choice = resp.choices[0]
                    text = choice.message.content or ""
                    usage = getattr(resp, "usage", None)
                    n = usage.completion_tokens if usage is not None and usage.completion_tokens else None
                    if n is None:
                        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
                    c.add_reply(turn, text, "length" if choice.finish_reason == "length" else "stop", n)
                    if on_tokens is not None:
                        on_tokens(n)
                return c

            todo = iter(convs)
            finished: list[Conversation] = []
            while True:
                while len(pending) < 2 * concurrency and (c := next(todo, None)) is not None:
                    pending.add(asyncio.create_task(one(c)))
                if not pending:
                    break
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = [t.exception() for t in done if t.exception() is not None]
                finished += [t.result() for t in done if t.exception() is None]
                if len(finished) >= flush_every or failed:
                    on_done(finished)  # keep what finished before reporting a failure
                    finished = []
                if failed:
                    raise (
                        _user_error(failed[0], url)
                        if isinstance(failed[0], openai.OpenAIError)
                        else failed[0]
                    )
            if finished:
                on_done(finished)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await client.close()

    asyncio.run(run())


async def _first_model(client, url: str) -> str:
    import openai

    try:
        page = await client.models.list()
    except openai.OpenAIError as e:
        raise _user_error(e, url) from None
    ids = [m.id for m in page.data]
    if not ids:
        raise UserError(f"endpoint {url} lists no models under /v1/models; pass --model NAME")
    return ids[0]


def _user_error(e: Exception, url: str) -> UserError:
    import openai

    if isinstance(e, openai.APITimeoutError):
        return UserError(f"endpoint {url} timed out; check the server, then rerun the same command to resume")
    if isinstance(e, openai.APIConnectionError):
        return UserError(
            f"cannot reach endpoint {url}: is the server running there? rerun the same command to resume"
        )
    if isinstance(e, openai.APIStatusError):
        return UserError(
            f"endpoint {url} answered HTTP {e.status_code}: {_short(e)}; check --model and the server"
        )
    return UserError(f"endpoint {url} failed: {_short(e)}")


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
