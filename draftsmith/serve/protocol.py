"""The OpenAI wire format: request bodies (validated here, so a client's mistake is a 400 and never
reaches the engine), response and chunk bodies, and OpenAI-style error objects.

Only what a lossless speculative server can honour is accepted: one choice (`n=1`), temperature,
top_p, seed, stop and max_tokens. Options that would change the target's distribution (penalties,
logit_bias) or that need what the engine does not compute (logprobs, tools) are refused with a clear
400 rather than silently ignored. Unknown fields are ignored, as OpenAI's own server does.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class APIError(Exception):
    """An error answered as OpenAI's `{"error": {...}}` object with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _Common(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    max_tokens: StrictInt | None = None
    temperature: FiniteFloat | None = Field(default=None, ge=0.0, le=2.0)
    top_p: FiniteFloat | None = Field(default=None, gt=0.0, le=1.0)
    n: StrictInt | None = 1
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: FiniteFloat | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: FiniteFloat | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Any] | None = None
    user: StrictStr | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 16:
            raise ValueError("at most 16 stop strings")
        return [s for s in stops if s]  # an empty stop string would end every answer at once

    def unsupported(self) -> tuple[str, str] | None:
        """(param, why) for a request we must refuse, or None."""
        if self.n not in (None, 1):
            return "n", "only n=1 is supported: send one request per choice"
        if self.presence_penalty or self.frequency_penalty:
            return "presence_penalty", "penalties change the target's distribution and are not supported"
        if self.logit_bias:
            return "logit_bias", "logit_bias changes the target's distribution and is not supported"
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    tools: list[Any] | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs or self.top_logprobs:
            return "logprobs", "logprobs are not supported by this server"
        if self.tools:
            return "tools", "tools are not supported by this server"
        return super().unsupported()

    def chat_messages(self) -> list[dict]:
        # "developer" is OpenAI's newer name for the system role; chat templates know "system".
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in self.messages
        ]


class CompletionRequest(_Common):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: StrictBool | None = False
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs is not None:
            return "logprobs", "logprobs are not supported by this server"
        if self.echo:
            return "echo", "echo is not supported by this server"
        if self.best_of not in (None, 1):
            return "best_of", "only best_of=1 is supported"
        if self.suffix:
            return "suffix", "suffix (insertion) is not supported by this server"
        return super().unsupported()


# ---- responses --------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int, spec: dict | None) -> dict:
    """OpenAI's usage plus `spec_decode`: this request's acceptance (tau, drafted, accepted, steps)."""
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if spec is not None:
        out["spec_decode"] = spec
    return out


def completion_body(rid: str, model: str, text: str, finish: str, use: dict) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {
        "id": rid,
        "object": "text_completion",
        "created": _now(),
        "model": model,
        "choices": [choice],
        "usage": use,
    }


def chat_body(rid: str, model: str, text: str, finish: str, use: dict) -> dict:
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    return {
        "id": rid,
        "object": "chat.completion",
        "created": _now(),
        "model": model,
        "choices": [choice],
        "usage": use,
    }


def completion_chunk(rid: str, model: str, text: str, finish: str | None) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "text_completion", "created": _now(), "model": model, "choices": [choice]}


def chat_chunk(rid: str, model: str, delta: dict, finish: str | None) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": _now(),
        "model": model,
        "choices": [choice],
    }


def usage_chunk(rid: str, model: str, obj: str, use: dict) -> dict:
    """The last chunk when `stream_options.include_usage`: no choices, only usage."""
    return {"id": rid, "object": obj, "created": _now(), "model": model, "choices": [], "usage": use}


def _now() -> int:
    return int(time.time())
