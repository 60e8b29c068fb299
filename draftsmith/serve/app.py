"""The OpenAI-compatible HTTP layer: routes, request validation, streaming, errors.

    GET  /v1/models             the one served model
    POST /v1/completions        prompt (text or token ids) -> text
    POST /v1/chat/completions   messages -> text, with the target's chat template
    GET  /health                200 while the engine thread runs, else 503
    GET  /metrics               Prometheus text (see metrics.py)

Every request is checked here before it reaches the engine, and every client mistake (bad JSON, a
wrong type, an unknown model, max_tokens that do not fit the context, temperature or top_p out of
range) is answered with OpenAI's error object and a 4xx status; 429 with Retry-After when the
queue is full. A 5xx means a bug in the server, never a bad request. Generation runs on the
scheduler's thread; this module only tokenizes, waits for events and formats them.

Each route is a module-level handler that finds what it needs in one `ServeState` (the scheduler,
tokenizer, metrics and limits) at `request.app.state.serve`; `create_app` only builds that state and
registers the handlers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from draftsmith.decoding.engine import Row
from draftsmith.decoding.sampling import GREEDY_BELOW, SamplingParams, make_generator
from draftsmith.drafters.base import DrafterFactory
from draftsmith.serve import protocol as P
from draftsmith.serve.detok import TextStream
from draftsmith.serve.metrics import CONTENT_TYPE, Metrics
from draftsmith.serve.scheduler import Job, QueueFull, Scheduler
from draftsmith.target.chat import encode_messages, stop_checker
from draftsmith.target.model import Target

log = logging.getLogger("draftsmith.serve")
RETRY_AFTER_S = 1
MIN_TOP_P = 1e-6
DISCONNECT_POLL_S = 0.5


@dataclass
class ServeState:
    """Everything the handlers share, built once per app."""

    model: str  # the name clients must send in `model`
    max_len: int  # prompt + max_tokens may not exceed it
    max_queue: int
    tokenizer: object
    vocab_size: int
    scheduler: Scheduler
    metrics: Metrics
    # One lock for the tokenizer: the engine thread decodes in stop checks while requests encode.
    tok_lock: threading.Lock = field(default_factory=threading.Lock)


def create_app(
    target: Target,
    factory: DrafterFactory | None,
    *,
    k: int = 8,
    model_name: str | None = None,
    max_model_len: int | None = None,
    max_batch: int = 16,
    max_queue: int = 64,
) -> FastAPI:
    model = model_name or target.name
    metrics = Metrics(model)
    state = ServeState(
        model=model,
        max_len=max_model_len or target.max_context,
        max_queue=max_queue,
        tokenizer=target.tokenizer,
        vocab_size=target.vocab_size,
        scheduler=Scheduler(target, factory, k=k, max_batch=max_batch, max_queue=max_queue, metrics=metrics),
        metrics=metrics,
    )
    app = FastAPI(title="draftsmith", lifespan=_lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    app.state.scheduler = state.scheduler  # read by tests and benchmarks
    app.state.metrics = metrics
    app.add_exception_handler(P.APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, server_bug)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics_text, methods=["GET"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI):
    sched = app.state.serve.scheduler
    sched.start()
    yield
    await asyncio.to_thread(sched.shutdown)


def _state(request: Request) -> ServeState:
    return request.app.state.serve


# ---- errors ----------------------------------------------------------------------------------------


async def api_error(request: Request, e: P.APIError):
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def http_error(request: Request, e: HTTPException):
    kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
    return JSONResponse(P.error_body(str(e.detail), kind), status_code=e.status_code, headers=e.headers)


async def server_bug(request: Request, e: Exception):
    log.exception("unhandled error on %s", request.url.path)
    return JSONResponse(P.error_body(f"internal server error: {type(e).__name__}", "server_error"), 500)


# ---- routes ----------------------------------------------------------------------------------------


async def health(request: Request):
    if not _state(request).scheduler.alive:
        return JSONResponse({"status": "engine stopped"}, status_code=503)
    return {"status": "ok"}


async def metrics_text(request: Request):
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


async def list_models(request: Request):
    s = _state(request)
    card = {
        "id": s.model,
        "object": "model",
        "created": 0,
        "owned_by": "draftsmith",
        "max_model_len": s.max_len,
    }
    return {"object": "list", "data": [card]}


async def completions(request: Request):
    s = _state(request)
    req = await parse_request(request, P.CompletionRequest, s.model)
    with s.tok_lock:
        ids = completion_ids(req.prompt, s.tokenizer, s.vocab_size)
    return await answer(request, s, req, ids, chat=False)


async def chat_completions(request: Request):
    s = _state(request)
    req = await parse_request(request, P.ChatRequest, s.model)
    if req.max_tokens is None:
        req.max_tokens = req.max_completion_tokens
    try:
        with s.tok_lock:
            ids = encode_messages(s.tokenizer, req.chat_messages())
    except Exception as e:  # the chat template refused these messages (say, roles out of order)
        raise P.APIError(400, f"cannot apply the chat template: {e}", param="messages") from None
    return await answer(request, s, req, ids, chat=True)


# ---- checking a request ----------------------------------------------------------------------------


async def parse_request(request: Request, kind: type[P._Common], model: str) -> P._Common:
    """The body as `kind`, for the served `model`; any client mistake raises a 400 APIError."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise P.APIError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise P.APIError(400, "request body must be a JSON object")
    try:
        req = kind.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or None
        raise P.APIError(400, f"{where}: {err['msg']}" if where else err["msg"], param=where) from None
    if req.model != model:
        raise P.APIError(
            400,
            f"model '{req.model}' is not served here: use '{model}'",
            param="model",
            code="model_not_found",
        )
    bad = req.unsupported()
    if bad is not None:
        raise P.APIError(400, bad[1], param=bad[0])
    return req


def completion_ids(prompt, tokenizer, vocab_size: int) -> list[int]:
    """OpenAI's prompt forms: text, [text], token ids, [token ids]; one prompt per request here."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise P.APIError(
                400, "only one prompt per request is supported: send one request each", param="prompt"
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"]) if prompt else []
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise P.APIError(
            400, f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", param="prompt"
        )
    return list(prompt)


def token_budget(req: P._Common, n_prompt: int, max_len: int, param: str) -> int:
    """How many tokens the request may generate: its max_tokens, else what the context leaves."""
    if n_prompt == 0:
        raise P.APIError(400, "the prompt is empty: give at least one token of input", param=param)
    if n_prompt >= max_len:
        raise P.APIError(
            400,
            f"prompt of {n_prompt} tokens leaves no room in this model's context of {max_len} tokens",
            param=param,
            code="context_length_exceeded",
        )
    if req.max_tokens is None:
        return max_len - n_prompt
    if req.max_tokens < 1:
        raise P.APIError(400, f"max_tokens {req.max_tokens} must be at least 1", param="max_tokens")
    if n_prompt + req.max_tokens > max_len:
        raise P.APIError(
            400,
            f"this model's maximum context length is {max_len} tokens, but {n_prompt + req.max_tokens} "
            f"were requested ({n_prompt} in the prompt, {req.max_tokens} in max_tokens): lower max_tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return req.max_tokens


def sampling_of(req: P._Common) -> tuple[SamplingParams, torch.Generator | None]:
    """The request's sampling, and its generator (None when greedy)."""
    temperature = 1.0 if req.temperature is None else req.temperature
    sampling = SamplingParams(
        # vLLM's rule: a temperature this close to 0 is greedy (dividing logits by it overflows).
        temperature=0.0 if temperature < GREEDY_BELOW else temperature,
        # Below float32's resolution top_p would drop every token; any p this small keeps only the top one.
        top_p=1.0 if req.top_p is None else max(req.top_p, MIN_TOP_P),
        seed=req.seed,
    )
    gen = None
    if not sampling.greedy:  # a seed gives the same answer whatever the batch; no seed, a fresh one
        gen = make_generator((req.seed if req.seed is not None else secrets.randbits(62)) % (1 << 31), 0)
    return sampling, gen


# ---- one request -----------------------------------------------------------------------------------


async def answer(request: Request, s: ServeState, req: P._Common, ids: list[int], chat: bool):
    """Queue the checked request; answer with one body, or a stream of chunks."""
    budget = token_budget(req, len(ids), s.max_len, "messages" if chat else "prompt")
    sampling, gen = sampling_of(req)
    stop_fn = stop_checker(s.tokenizer, req.stop) if req.stop else None
    job = Job(
        prompt=ids,
        max_tokens=budget,
        sampling=sampling,
        generator=gen,
        stop=None if stop_fn is None else _locked_stop(stop_fn, s.tok_lock),
        loop=asyncio.get_running_loop(),
    )
    _submit(s, job)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    text = TextStream(s.tokenizer, req.stop or [])
    if req.stream:
        return StreamingResponse(
            _stream(s, job, text, rid, chat, req.include_usage, len(ids)), media_type="text/event-stream"
        )
    finish, row = await _collect(request, s.scheduler, job, text)
    with s.tok_lock:
        out = text.text()
    use = P.usage(len(ids), len(row.output), _spec(row))
    return (P.chat_body if chat else P.completion_body)(rid, s.model, out, finish, use)


def _submit(s: ServeState, job: Job) -> None:
    try:
        s.scheduler.submit(job)
    except QueueFull:
        raise P.APIError(
            429,
            f"the server is busy ({s.max_queue} requests waiting): retry after {RETRY_AFTER_S} s",
            type="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None


async def _collect(request: Request, sched: Scheduler, job: Job, text: TextStream) -> tuple[str, Row]:
    done = False
    loop = asyncio.get_running_loop()
    checked = loop.time()
    try:
        while True:
            # Nothing is sent before the answer ends, so ask the server every half second
            # whether the client is still there.
            try:
                event = await asyncio.wait_for(job.events.get(), timeout=DISCONNECT_POLL_S)
            except TimeoutError:
                event = ("idle",)
            if loop.time() - checked >= DISCONNECT_POLL_S:
                checked = loop.time()
                if await request.is_disconnected():
                    raise P.APIError(499, "client closed the request")
            if event[0] == "tokens":
                text.ids.extend(event[1])
            elif event[0] == "done":
                done = True
                return event[1], event[2]
            elif event[0] == "error":
                done = True
                raise P.APIError(500, event[1], type="server_error")
    finally:
        if not done:
            sched.cancel(job)


async def _stream(
    s: ServeState, job: Job, text: TextStream, rid: str, chat: bool, include_usage: bool, n_prompt: int
):
    def chunk(delta: str, finish: str | None = None) -> str:
        if chat:
            body = P.chat_chunk(rid, s.model, {"content": delta} if delta or finish is None else {}, finish)
        else:
            body = P.completion_chunk(rid, s.model, delta, finish)
        return _sse(body)

    done = False
    try:
        if chat:
            yield _sse(P.chat_chunk(rid, s.model, {"role": "assistant", "content": ""}, None))
        async for event in _events(job):
            if event[0] == "tokens":
                with s.tok_lock:
                    delta = text.push(event[1])
                if delta:
                    yield chunk(delta)
            elif event[0] == "done":
                finish, row = event[1], event[2]
                with s.tok_lock:
                    tail = text.finish()
                if tail:
                    yield chunk(tail)
                yield chunk("", finish)
                if include_usage:
                    obj = "chat.completion.chunk" if chat else "text_completion"
                    yield _sse(
                        P.usage_chunk(rid, s.model, obj, P.usage(n_prompt, len(row.output), _spec(row)))
                    )
            else:
                yield _sse(P.error_body(event[1], "server_error"))
        yield "data: [DONE]\n\n"
        done = True
    finally:
        if not done:  # the client went away (the response was cancelled): free its row
            s.scheduler.cancel(job)


async def _events(job: Job) -> AsyncIterator[tuple]:
    while True:
        event = await job.events.get()
        yield event
        if event[0] != "tokens":
            return


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _spec(row: Row) -> dict:
    s = row.stats
    return {"tau": round(s.tau, 4), "drafted": s.draft_tokens, "accepted": sum(s.accepted), "steps": s.steps}


def _locked_stop(stop_fn, lock: threading.Lock):
    def stop(ids: list[int]) -> bool:
        with lock:
            return stop_fn(0, ids)

    return stop
