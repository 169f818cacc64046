"""Replicas of ``mgx-graph serve`` as a Ray Serve deployment (the ``ray`` extra: ``ray[serve]``).

Each replica is one Ray actor that loads the model and runs the same FastAPI app as ``mgx-graph serve``
(:func:`mgx_graph.serve.app.create_app` over :func:`mgx_graph.serve.server.build_service`): its engine,
in-flight batching of ``--max-rows`` rows, limits and errors. Ray Serve's proxy owns HTTP and spreads the
requests over the replicas; Ray places them (``ray_actor_options``: ``{"num_gpus": 1}`` gives each replica
a GPU of its own). Nothing here starts or manages a cluster: ``serve run`` or :func:`ray.serve.run` does.

    serve run mgx_graph.serve.ray_app:app_builder model=./qwen3-fp16 num_replicas=2 num_gpus=1 \\
        flags="--target gpu --hip-graph --max-rows 8"

The flags are ``mgx-graph serve``'s, checked where the application is built (a bad one is a ParameterError
before anything is deployed); ``--host``, ``--port`` and ``--grace`` are Ray Serve's to decide there
(``serve run --address``, its HTTP options) and are ignored.
"""
from __future__ import annotations

import argparse
import shlex
from typing import Any, Callable

from ..errors import ParameterError


class _Flags(argparse.ArgumentParser):
    """``mgx-graph serve``'s parser, raising ParameterError instead of exiting."""

    def error(self, message):
        raise ParameterError(f"mgx-graph serve flags: {message}")


def serve_args(model: str, flags=()) -> argparse.Namespace:
    """``mgx-graph serve MODEL FLAGS`` parsed by the command's own parser; ``flags`` is a list of words or a
    string split as a shell would. ParameterError for a flag the command refuses."""
    from .server import add_parser

    words = shlex.split(flags) if isinstance(flags, str) else [str(w) for w in flags]
    parser = _Flags(prog="mgx-graph", add_help=False)
    add_parser(parser.add_subparsers(dest="command", parser_class=_Flags), {"add_help": False}, None)
    return parser.parse_args(["serve", str(model), *words])


def asgi_app_builder(args: argparse.Namespace) -> Callable[[], Any]:
    """A function of no argument that loads the model and returns the app of ``mgx-graph serve``; Ray Serve
    calls it in each replica as it starts (the model is never pickled, only ``args``)."""
    def build_asgi_app():
        from .app import create_app
        from .server import build_service

        return create_app(build_service(args))

    return build_asgi_app


def deployment(model: str, flags=(), num_replicas: int = 1, ray_actor_options: dict | None = None,
               name: str = "mgx-graph-serve"):
    """The Ray Serve application of ``num_replicas`` replicas of ``mgx-graph serve MODEL FLAGS`` (bind it with
    :func:`ray.serve.run`). A replica takes up to ``--max-rows`` running plus ``--max-queue`` queued requests;
    Ray Serve queues the rest in its proxy."""
    from ray import serve

    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ParameterError(f"num_replicas: expected an int >= 1, got {num_replicas!r}")
    args = serve_args(model, flags)
    ingress = serve.ingress(asgi_app_builder(args))()
    dep = serve.deployment(name=name, num_replicas=num_replicas, ray_actor_options=dict(ray_actor_options or {}),
                           max_ongoing_requests=args.max_rows + args.max_queue)(ingress)
    return dep.bind()


def app_builder(config: dict):
    """The application builder of ``serve run mgx_graph.serve.ray_app:app_builder KEY=VALUE ...``: ``model``
    (required), ``flags`` (``mgx-graph serve``'s, one string), ``num_replicas`` (default 1), ``num_gpus`` and
    ``num_cpus`` (per replica; default: Ray's)."""
    config = dict(config)
    if "model" not in config:
        raise ParameterError("serve run ... app_builder: model=FOLDER is required")
    options = {}
    for key in ("num_gpus", "num_cpus"):
        if key in config:
            try:
                options[key] = float(config.pop(key))
            except ValueError:
                raise ParameterError(f"{key}: expected a number") from None
    try:
        replicas = int(config.pop("num_replicas", 1))
    except ValueError:
        raise ParameterError("num_replicas: expected an int >= 1") from None
    model, flags = config.pop("model"), config.pop("flags", "")
    if config:
        raise ParameterError(f"serve run ... app_builder: unknown arguments {sorted(config)}; expected model, flags, "
                             f"num_replicas, num_gpus, num_cpus")
    return deployment(model, flags, num_replicas=replicas, ray_actor_options=options)
