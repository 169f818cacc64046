"""``mgx-graph serve MODEL``: the OpenAI-compatible server on uvicorn, its flags and its shutdown.

SIGTERM (or Ctrl-C) shuts it down gracefully: the engine stops accepting requests (503), uvicorn closes its
socket and waits up to ``--grace`` seconds for the open requests to finish, then the engine cancels what is
left and stops; the process exits 0.
"""
from __future__ import annotations

import contextlib
import math
import logging
import signal
import threading

DESCRIPTION = ("An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models; streamed\n"
               "as server-sent events) over an onnxruntime-genai folder, with in-flight batching: concurrent\n"
               "requests share the batched decode step of --max-rows rows; a request joins a free row between\n"
               "steps and leaves it when done.")


def add_parser(sub, parser_kw: dict, cmd) -> None:
    """Add the ``serve`` command to the subparsers ``sub``; ``cmd`` is its function."""
    from ..cli.errors import float_in, int_at_least, int_in

    s = sub.add_parser("serve", help="serve a model over the OpenAI HTTP API, with in-flight batching",
                       description=DESCRIPTION, **parser_kw)
    s.add_argument("model", help="an onnxruntime-genai folder (with its tokenizer) or smollm2-genai")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int_in(0, 65535), default=8000, help="port to listen on")
    s.add_argument("--max-rows", type=int_at_least(1), default=8, metavar="N",
                   help="rows of the batched decode step: requests decoded at once")
    s.add_argument("--max-queue", type=int_at_least(0), default=64, metavar="N",
                   help="requests waiting for a row at most; beyond it a request gets 429")
    s.add_argument("--max-tokens", type=int_at_least(1), metavar="N",
                   help="max_tokens a request may ask for (default: --max-length)")
    s.add_argument("--max-length", type=int_at_least(1), metavar="N",
                   help="KV cache rows per request, prompt and completion together (default: 256, at most the "
                        "model's context)")
    s.add_argument("--max-body-bytes", type=int_at_least(1), default=4 << 20, metavar="N",
                   help="request bodies larger than this get 413, unread (default: 4 MiB)")
    s.add_argument("--timeout", type=float_in(0.0, low_open=True), metavar="S",
                   help="seconds a request may take, queued and running; past it: 504 (default: no limit)")
    s.add_argument("--grace", type=float_in(0.0), default=30.0, metavar="S",
                   help="on SIGTERM, seconds the open requests have to finish before they are cancelled")
    s.add_argument("--served-model-name", metavar="NAME",
                   help="the model name clients send and /v1/models lists (default: MODEL's folder name)")
    s.add_argument("--target", default="auto", choices=["auto", "gpu", "ref"],
                   help="where to run; auto: gpu if one is usable, else ref")
    s.add_argument("--hip-graph", action="store_true", help="capture the decode step as a graph (default: off, "
                                                            "or on with MIGRAPHX_HIP_GRAPH=1)")
    s.add_argument("--fp16", action="store_true", help="run in half precision (default: off)")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's and the engine's log level")
    s.set_defaults(fn=cmd)


def build_service(args):
    """The :class:`~mgx_graph.serve.app.Service` of the parsed ``args``: the model loaded and compiled."""
    from pathlib import Path

    from ..cli.inputs import UsageError
    from ..llm.api import LLM
    from .app import MAX_BODY_BYTES, Service
    from .scheduler import Engine

    llm = LLM(args.model, target=args.target, max_length=args.max_length, batch=args.max_rows,
              hip_graph=True if args.hip_graph else None, fp16=args.fp16)
    if llm.tokenizer is None:
        raise UsageError(f"{args.model} has no tokenizer: the server takes text")
    engine = Engine(llm.runner, llm.tokenizer, llm.eos_token_ids, max_queue=args.max_queue)
    name = args.served_model_name or Path(str(args.model).rstrip("/")).name
    return Service(llm, engine, name, max_tokens=args.max_tokens or engine.max_length, timeout=args.timeout,
                   max_body_bytes=getattr(args, "max_body_bytes", None) or MAX_BODY_BYTES)


def make_server(service, host: str, port: int, grace: float = 30.0, log_level: str = "info"):
    """A uvicorn server of the app (:func:`~mgx_graph.serve.app.create_app`); SIGTERM / SIGINT drain the
    engine and shut it down gracefully, and the process then exits normally (status 0)."""
    import uvicorn

    from .app import create_app

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            service.engine.drain()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):  # as uvicorn's, without raising the signal again once shut down
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

    config = uvicorn.Config(create_app(service), host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=math.ceil(grace))
    return Server(config)


def cmd_serve(args) -> int:
    import importlib.util

    from ..cli.inputs import UsageError

    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"mgx-graph serve needs {' and '.join(missing)}: pip install 'mgx_graph[serve]'")
    log = logging.getLogger("mgx_graph")
    handlers, level = list(log.handlers), log.level
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(args.log_level.upper())
    try:
        service = build_service(args)
        make_server(service, args.host, args.port, args.grace, args.log_level).run()
    finally:  # the caller's logger as it was (main() may run in a process that goes on)
        log.handlers[:] = handlers
        log.setLevel(level)
    return 0
