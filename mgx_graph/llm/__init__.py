"""Generation over a compiled decoder step: the decode loop, its KV cache, sampling, streaming, and the
runners of onnxruntime-genai and optimum model folders."""
from .generation import generate  # noqa: F401
