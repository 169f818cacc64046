"""Generation over a compiled decoder step: the decode loop, its KV cache, sampling, streaming, the
runners of onnxruntime-genai and optimum model folders, and :class:`LLM` (text in, text out)."""
from .api import LLM  # noqa: F401
from .generation import generate  # noqa: F401
