"""The ASGI app (FastAPI): ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, plus ``/health`` and
``/stats`` (the engine's rows and counters), over one :class:`~mgx_graph.serve.scheduler.Engine`.

Each HTTP request becomes one engine request per prompt; their events come back through an
``asyncio.Queue`` (the engine thread hands them over with ``call_soon_threadsafe``). A streamed answer is
server-sent events (``data: {chunk}`` lines, ``data: [DONE]`` last); a client that goes away cancels its
requests, which leave their rows at the engine's next step. Errors are the OpenAI API's JSON
(:func:`~mgx_graph.serve.protocol.error_body`): 400 for a bad field (pydantic's validation errors too), 404
for another model's name, 413 for a body over ``--max-body-bytes``, 429 when the queue is full, 503 while
shutting down, 504 past ``--timeout``, 500 (``server_error``) for anything else, never a plain-text page.
Once the engine stops accepting requests (SIGTERM, :meth:`~mgx_graph.serve.scheduler.Engine.drain`),
``/health`` and every new request but ``/stats`` get the 503 (code ``shutting_down``) before their body is
read; requests already admitted finish.

A request body is read (at most ``--max-body-bytes``) before it is parsed; a prompt's text longer than the
context could hold (``max_length`` tokens of at most :attr:`Service.chars_per_token` characters each) is
refused before it is tokenized, and tokenizing runs in a worker thread, one prompt at a time, so the event
loop keeps answering other requests (``/health`` too).
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from ..errors import ParameterError
from ..llm.sampling import SamplingConfig
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body
from .scheduler import QueueFull, Request, ShuttingDown

log = logging.getLogger("mgx_graph.serve")
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cache_full": "length"}
POLL_S = 0.5  # how often a non-streamed request checks that its client is still there
MAX_BODY_BYTES = 4 << 20  # default of --max-body-bytes
MIN_CHARS_PER_TOKEN = 64  # the least characters per token a prompt's length is bounded with


class Service:
    """What the routes share: the LLM (tokenizer, chat template), the engine and the limits."""

    def __init__(self, llm, engine, model_name: str, max_tokens: int, timeout: float | None,
                 max_body_bytes: int = MAX_BODY_BYTES):
        self.llm, self.engine, self.model_name = llm, engine, model_name
        self.max_tokens, self.timeout, self.max_body_bytes = max_tokens, timeout, max_body_bytes
        self.created = int(time.time())
        self.chars_per_token = max(MIN_CHARS_PER_TOKEN, _longest_token(llm.tokenizer))
        self._encoding = threading.Lock()

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                           "model", "model_not_found")

    def encode(self, prompt, param: str) -> list:
        """Token ids of one prompt (text, token ids or chat messages); a prompt longer than the context could
        hold is refused first (400, ``context_length_exceeded``).  Blocking: see :meth:`encode_async`."""
        chat = isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
        M = self.engine.max_length
        if isinstance(prompt, list) and not chat and len(prompt) >= M:
            raise APIError(400, f"the prompt has {len(prompt)} tokens; this model's context (--max-length) is {M} "
                                f"tokens, prompt and completion together", param, "context_length_exceeded")
        chars = sum(len(m.get("content") or "") for m in prompt) if chat else len(prompt) \
            if isinstance(prompt, str) else 0
        if chars > M * self.chars_per_token:
            raise APIError(400, f"the prompt has {chars} characters, more than {M} tokens of at most "
                                f"{self.chars_per_token} characters can hold (this model's context, --max-length, "
                                f"is {M} tokens)", param, "context_length_exceeded")
        try:
            with self._encoding:
                return self.llm.chat_ids(prompt) if chat else self.llm.encode(prompt)
        except ParameterError as e:
            raise APIError(400, str(e), param) from None

    async def encode_async(self, prompt, param: str) -> list:
        """:meth:`encode` in a worker thread: the event loop keeps serving while a prompt is tokenized."""
        return await asyncio.to_thread(self.encode, prompt, param)

    def limit(self, body, prompt: list, param: str) -> int:
        """max_tokens of one prompt: as asked (at most ``--max-tokens``, and the cache must hold it), else
        what the cache has room for, at most ``--max-tokens``."""
        M, asked = self.engine.max_length, body.token_limit()
        room = M - len(prompt)
        if not prompt:
            raise APIError(400, "the prompt is empty (no tokens)", param)
        if room < 1:
            raise APIError(400, f"the prompt has {len(prompt)} tokens; this model's context (--max-length) is {M} "
                                f"tokens, prompt and completion together", param, "context_length_exceeded")
        if asked is None:
            return min(self.max_tokens, room)
        if asked > self.max_tokens:
            raise APIError(400, f"max_tokens is {asked}; this server allows at most {self.max_tokens} "
                                f"(--max-tokens)", "max_tokens")
        if asked > room:
            raise APIError(400, f"the prompt has {len(prompt)} tokens and max_tokens is {asked}: more than this "
                                f"model's context of {M} tokens", "max_tokens", "context_length_exceeded")
        return asked

    def config(self, body) -> SamplingConfig:
        t = 1.0 if body.temperature is None else body.temperature
        try:
            return SamplingConfig(do_sample=t > 0, temperature=t if t > 0 else 1.0, top_k=body.top_k or None,
                                  top_p=1.0 if body.top_p is None else body.top_p, seed=body.seed,
                                  repetition_penalty=body.repetition_penalty or 1.0)
        except ParameterError as e:
            raise APIError(400, str(e)) from None

    def submit(self, body, prompts: list, events: asyncio.Queue, param: str = "prompt") -> list:
        """One engine request per prompt, their events put on ``events`` as ``(index, kind, value)``."""
        loop = asyncio.get_running_loop()
        config, stops = self.config(body), tuple(body.stops())
        reqs = []

        def sink(i):
            def on_event(kind, value):
                try:
                    loop.call_soon_threadsafe(events.put_nowait, (i, kind, value))
                except RuntimeError:  # the event loop is closed: nobody is listening
                    pass
            return on_event

        try:
            for i, p in enumerate(prompts):
                reqs.append(self.engine.submit(Request(prompt=p, max_new=self.limit(body, p, param), config=config,
                                                       stop=stops, on_event=sink(i), timeout=self.timeout)))
        except BaseException as e:
            for r in reqs:
                r.cancel()
            if isinstance(e, QueueFull):
                raise APIError(429, str(e), None, "queue_full") from None
            if isinstance(e, ShuttingDown):
                raise APIError(503, str(e), None, "shutting_down") from None
            if isinstance(e, ParameterError):
                raise APIError(400, str(e)) from None
            raise
        return reqs


def _failure(r: Request) -> APIError | None:
    """The error a request that ended without a finish reason of the API maps to."""
    if r.finish_reason == "timeout":
        return APIError(504, "the request ran past the server's --timeout", None, "timeout")
    if r.finish_reason == "cancelled":
        return APIError(503, "the server shut down before the request finished", None, "shutting_down")
    if r.finish_reason == "error":
        return APIError(500, f"the generation failed: {type(r.error).__name__}: {r.error}")
    return None


def _usage(reqs) -> dict:
    p = sum(len(r.prompt) for r in reqs)
    c = sum(len(r.tokens) for r in reqs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


async def _wait_all(http, reqs, events: asyncio.Queue) -> bool:
    """Wait until every request is done (True); cancel them all when the client goes away (False)."""
    pending = set(range(len(reqs)))
    try:
        while pending:
            try:
                i, kind, _ = await asyncio.wait_for(events.get(), POLL_S)
            except asyncio.TimeoutError:
                if await http.is_disconnected():
                    return False
                continue
            if kind == "done":
                pending.discard(i)
        return True
    finally:
        if pending:
            for r in reqs:
                r.cancel()


def _sse(obj) -> str:
    return f"data: {json.dumps(obj) if not isinstance(obj, str) else obj}\n\n"


async def _stream(reqs, events: asyncio.Queue, chunk, include_usage: bool, head: dict):
    """Server-sent events of the requests' pieces: ``chunk(index, text, finish_reason)`` makes each."""
    pending = set(range(len(reqs)))
    try:
        for i in range(len(reqs)):
            first = chunk(i, "", None)
            if first is not None:
                yield _sse(first)
        while pending:
            i, kind, value = await events.get()
            if kind == "text":
                yield _sse(chunk(i, value, None))
                continue
            pending.discard(i)
            err = _failure(value)
            if err is not None:
                yield _sse(err.body())
                for r in reqs:
                    r.cancel()
                return
            yield _sse(chunk(i, None, FINISH.get(value.finish_reason, value.finish_reason)))
        if include_usage:
            yield _sse(dict(head, choices=[], usage=_usage(reqs)))
        yield _sse("[DONE]")
    finally:
        for r in reqs:
            r.cancel()  # a no-op for requests already done


def create_app(service: Service):
    """The FastAPI app of ``service``; its lifespan starts the engine and stops it (cancelling what is
    left) on shutdown."""
    @asynccontextmanager
    async def lifespan(app):
        if service.engine._thread is None:
            service.engine.start()
        yield
        service.engine.stop(cancel=True, timeout=60)
        log.info("shutdown: %s", json.dumps(service.engine.stats()))

    app = FastAPI(title="mgx_graph OpenAI-compatible server", lifespan=lifespan)
    app.add_middleware(BodyLimit, limit=service.max_body_bytes)
    app.add_middleware(Draining, engine=service.engine)  # the outermost: before any body is read

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        return _validation_error(exc)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc: HTTPException):
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request, exc: Exception):  # logged by the server; the client gets the API's JSON
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}"), status_code=500)

    @app.get("/health")
    async def health():
        if not service.engine.accepting:
            return shutting_down()
        return JSONResponse({"status": "ok"})

    @app.get("/stats")
    async def stats():
        return service.engine.stats()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "created": service.created,
                                            "owned_by": "mgx_graph", "max_model_len": service.engine.max_length}]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, http: HTTPRequest):
        service.check_model(body.model)
        prompts = [await service.encode_async(body.messages_dicts(), "messages")]
        return await _answer(service, body, prompts, http, chat=True, param="messages")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HTTPRequest):
        service.check_model(body.model)
        prompts = [await service.encode_async(p, "prompt") for p in body.prompts()]
        return await _answer(service, body, prompts, http, chat=False, param="prompt")

    async def _answer(service, body, prompts, http, chat: bool, param: str):
        events: asyncio.Queue = asyncio.Queue()
        reqs = service.submit(body, prompts, events, param)
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": service.model_name}
        if body.stream:
            return StreamingResponse(_stream(reqs, events, _chunker(head, chat), body.include_usage(), head),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        if not await _wait_all(http, reqs, events):
            return JSONResponse(error_body(499, "the client closed the request"), status_code=499)
        for r in reqs:
            err = _failure(r)
            if err is not None:
                raise err
        choices = [dict({"index": i, "finish_reason": FINISH.get(r.finish_reason, r.finish_reason), "logprobs": None},
                        **({"message": {"role": "assistant", "content": r.text}} if chat else {"text": r.text}))
                   for i, r in enumerate(reqs)]
        return dict(head, object="chat.completion" if chat else "text_completion", choices=choices,
                    usage=_usage(reqs))

    return app


def _validation_error(exc: RequestValidationError) -> JSONResponse:
    """The 400 of a body pydantic refused: the first error's field as ``param`` (none for malformed JSON)."""
    errs = exc.errors()
    first: dict = dict(errs[0]) if errs else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":  # its location is a character offset, not a field
        at = [x for x in first.get("loc", ()) if isinstance(x, int)]
        why = str((first.get("ctx") or {}).get("error", ""))[:200]
        msg = f"the body is not valid JSON{f' (at character {at[0]})' if at else ''}{f': {why}' if why else ''}"
        return JSONResponse(error_body(400, msg), status_code=400)
    loc = [str(x) for x in first.get("loc", ()) if x != "body" and not _union_tag(x)]
    msg = f"{'.'.join(loc) + ': ' if loc else ''}{first.get('msg')}" + (f" (and {len(errs) - 1} more)"
                                                                  if len(errs) > 1 else "")
    return JSONResponse(error_body(400, msg, ".".join(loc) or None), status_code=400)


def _longest_token(tokenizer) -> int:
    """The characters of the tokenizer's longest vocabulary entry (0 when it has no vocabulary to ask)."""
    try:
        return max(map(len, tokenizer.get_vocab()), default=0)
    except (AttributeError, TypeError, NotImplementedError):
        return 0


class BodyLimit:
    """ASGI middleware: an HTTP request's body is read whole before the app sees it; one over ``limit`` bytes
    (by its Content-Length or as it arrives) is answered 413 without being parsed."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(send, int(declared))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._refuse(send, size)
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send, size: int) -> None:
        body = json.dumps(error_body(413, f"the request body has more than {self.limit} bytes ({size} or more); this "
                                          f"server takes at most {self.limit} (--max-body-bytes)", None,
                                     "request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def shutting_down() -> JSONResponse:
    """The 503 of a server that no longer accepts requests: the API's error JSON (code ``shutting_down``),
    with ``status`` as ``/health`` gives it."""
    body = error_body(503, "the server is shutting down: it takes no new requests", None, "shutting_down")
    return JSONResponse(dict(body, status="shutting_down"), status_code=503, headers={"Connection": "close"})


class Draining:
    """ASGI middleware: once ``engine`` no longer accepts requests, every HTTP request but ``GET /stats`` is
    answered :func:`shutting_down` before its body is read (``/health`` included)."""

    def __init__(self, app, engine):
        self.app, self.engine = app, engine

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.engine.accepting or scope.get("path") == "/stats":
            return await self.app(scope, receive, send)
        await shutting_down()(scope, receive, send)


def _union_tag(x) -> bool:
    """Whether an entry of a pydantic error's location names a member of a union (``str``, ``list[int]``),
    not a field."""
    return isinstance(x, str) and ("[" in x or x in ("str", "int", "float", "bool", "dict", "list", "none"))


def _chunker(head: dict, chat: bool):
    """``chunk(index, text, finish_reason)``: one SSE chunk (None for a completion's opening chunk)."""
    def chunk(i, text, finish):
        if chat:
            delta = {"role": "assistant", "content": ""} if text == "" and finish is None else \
                {"content": text} if text is not None else {}
            return dict(head, choices=[{"index": i, "delta": delta, "finish_reason": finish, "logprobs": None}])
        if text == "" and finish is None:
            return None
        return dict(head, choices=[{"index": i, "text": text or "", "finish_reason": finish, "logprobs": None}])
    return chunk
