"""The OpenAI API's request bodies (pydantic models: unknown or out-of-range fields are refused) and its
error body ``{"error": {"message", "type", "param", "code"}}``.

Supported fields: ``model``, ``messages`` (chat) / ``prompt`` (completions: a string, a list of strings, a
list of token ids or a list of such lists), ``max_tokens`` (``max_completion_tokens``), ``temperature`` (0: greedy; default 1,
sampled, as the OpenAI API), ``top_p``, ``stop``, ``seed``, ``stream``, ``stream_options.include_usage``,
``n`` (1 only), ``user`` (ignored); and two fields of vLLM's API: ``top_k`` and ``repetition_penalty``.
Int and bool fields are strict (``true`` or ``"3"`` is no int, ``1`` no bool) and float fields finite.
Fields the engine does not implement (``logprobs``, ``logit_bias``, penalties other than 0, ``echo``, tools)
are accepted only at their no-op values, so no request is silently served other than it asked.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: HTTP status -> the error ``type`` of the body
ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
               413: "invalid_request_error", 429: "rate_limit_error",
               500: "server_error", 503: "service_unavailable", 504: "timeout_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI API's error JSON for HTTP ``status``."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


class APIError(Exception):
    """An error answered with HTTP ``status`` and :func:`error_body`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart]]
    name: Optional[str] = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = Field(False, strict=True)


def _no_op(value, default, name: str):
    if value is not None and value != default:
        raise ValueError(f"{name}={value!r} is not supported (only {default!r})")
    return value


class _Sampling(_Strict):
    model: str
    max_tokens: Optional[int] = Field(None, ge=1, strict=True)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Optional[int] = Field(None, ge=0, strict=True)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, allow_inf_nan=False)
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = Field(None, ge=0, lt=2 ** 64, strict=True)
    stream: bool = Field(False, strict=True)
    stream_options: Optional[StreamOptions] = None
    n: int = Field(1, ge=1, le=1, strict=True)
    user: Optional[str] = None
    presence_penalty: Optional[float] = Field(None, allow_inf_nan=False)
    frequency_penalty: Optional[float] = Field(None, allow_inf_nan=False)
    logit_bias: Optional[dict] = None
    logprobs: Optional[Union[bool, int]] = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        for s in [v] if isinstance(v, str) else v or []:
            if not s:
                raise ValueError("stop strings must not be empty")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _penalty(cls, v, info):
        return _no_op(v, 0.0, info.field_name)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v:
            raise ValueError("logit_bias is not supported")
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v):
        if v not in (None, False, 0):
            raise ValueError("logprobs are not supported")
        return v

    def stops(self) -> list:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1, strict=True)
    top_logprobs: Optional[int] = None
    tools: Optional[list] = None
    tool_choice: Optional[Union[str, dict]] = None
    response_format: Optional[dict] = None

    @field_validator("tools")
    @classmethod
    def _tools(cls, v):
        if v:
            raise ValueError("tools are not supported")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v):
        return _no_op(v, "none", "tool_choice")

    @field_validator("response_format")
    @classmethod
    def _format(cls, v):
        if v and v.get("type") != "text":
            raise ValueError("only response_format {'type': 'text'} is supported")
        return v

    def messages_dicts(self) -> list:
        """The messages as the chat template takes them ("developer" as "system")."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]

    def token_limit(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: bool = Field(False, strict=True)
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and (not v or any(isinstance(p, list) and not p for p in v)):
            raise ValueError("the prompt must not be empty")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v):
        return _no_op(v, False, "echo")

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v):
        if v:
            raise ValueError("suffix is not supported")
        return v

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v):
        return _no_op(v, 1, "best_of")

    def prompts(self) -> list:
        """One entry per choice: a str, or a list of token ids (a list of them: one choice each)."""
        if isinstance(self.prompt, str) or all(isinstance(t, int) for t in self.prompt):
            return [self.prompt]
        return list(self.prompt)

    def token_limit(self) -> Optional[int]:
        return self.max_tokens
