"""An OpenAI-compatible HTTP server with in-flight batching (``mgx-graph serve``).

* :mod:`.scheduler`: :class:`Engine`, one thread that owns a batched onnxruntime-genai runner and runs each
  request in a row of its own, joining and leaving between decode steps;
* :mod:`.protocol`: the OpenAI request bodies (pydantic) and error JSON;
* :mod:`.app`: the FastAPI app (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``);
* :mod:`.server`: the command's flags and the uvicorn server with its graceful shutdown.

:mod:`.app` and :mod:`.server`'s server need the ``serve`` extra (FastAPI, uvicorn); the engine does not.
"""
__all__ = ["Engine", "QueueFull", "Request", "ShuttingDown"]


def __getattr__(name):  # imported on first use: the command line loads this package for its flags only
    if name in __all__:
        from . import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
