"""Check an exported graph against the torch model it came from, with onnxruntime (CPU).

:func:`verify_static_step` decodes token by token through a fixed-shape decode step, feeding
the caches back, and compares every step's logits with one full-sequence torch forward
(:func:`reference_logits`). onnxruntime comes with mgx_graph's ``[test]`` extra; numpy and
torch are imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .errors import VerificationError, require_modules
from .export import static_step_names

#: Tolerance on the max abs logits error between onnxruntime and torch (fp32 builds).
VERIFY_ATOL = 1e-3


def ort_session(path: Path, model: str = "mgx_graph.models"):
    """An onnxruntime CPU InferenceSession on ``path`` (graph optimisations on, warnings off).

    Raises :class:`~.errors.MissingExtraError` (a BuildError naming ``model``) when onnxruntime,
    from the ``[test]`` extra, is not installed.
    """
    require_modules(model, ("onnxruntime",), "running the graph with onnxruntime (verify=False skips it in a build)")
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def verify_static_step(
    onnx_path: Path,
    reference_logits: Callable[[list[int]], Any],
    token_ids: list[int],
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    max_cache_len: int,
    note: Callable[[str], None] = lambda s: None,
    atol: float = VERIFY_ATOL,
) -> float:
    """Decode ``token_ids`` one at a time through a fixed-shape step graph and compare.

    Each step feeds ``input_ids`` [1,1], ``cache_position`` [1] and the previous step's
    ``present.*`` outputs back as ``past_key_values.*`` (zeros at the start). The logits
    of step t are compared with ``reference_logits(token_ids)[t]`` (an array [T, vocab]
    from a full-sequence torch forward). Returns the max abs error; raises
    :class:`VerificationError` if it is >= ``atol``.
    """
    import numpy as np

    if len(token_ids) > max_cache_len:
        raise ValueError("more verification tokens than cache slots")
    sess = ort_session(onnx_path)
    in_names, out_names, alias = static_step_names(num_layers)
    shape = (1, num_kv_heads, max_cache_len, head_dim)
    feeds = {n: np.zeros(shape, np.float32) for n in in_names[2:]}
    ref = np.asarray(reference_logits(token_ids), dtype=np.float32)
    worst = 0.0
    per_step = []
    for t, tok in enumerate(token_ids):
        feeds["input_ids"] = np.array([[tok]], dtype=np.int64)
        feeds["cache_position"] = np.array([t], dtype=np.int64)
        outs = dict(zip(out_names, sess.run(out_names, feeds)))
        logits = outs["logits"]
        if logits.shape != (1, 1, ref.shape[-1]):
            raise VerificationError(f"logits shape {logits.shape}, expected (1, 1, {ref.shape[-1]})")
        err = float(np.max(np.abs(logits[0, 0] - ref[t])))
        per_step.append(err)
        worst = max(worst, err)
        for out_name, in_name in alias.items():
            feeds[in_name] = outs[out_name]
    note(f"verify: {len(token_ids)} decode steps, max abs logits error ORT vs torch = {worst:.3e} "
         f"(per step: {', '.join(f'{e:.1e}' for e in per_step)})")
    if not np.isfinite(worst) or worst >= atol:
        raise VerificationError(
            f"{onnx_path.name}: ORT logits differ from torch by {worst:.3e} (tolerance {atol:.0e}); per step {per_step}"
        )
    return worst


def reference_logits(model: Any) -> Callable[[list[int]], Any]:
    """``token_ids -> logits [T, vocab]`` (numpy float32) from one full-sequence torch forward
    without a cache; the reference that :func:`verify_static_step` compares against."""
    import torch

    def run(token_ids):
        with torch.no_grad():
            ids = torch.tensor([list(token_ids)], dtype=torch.long)
            return model(input_ids=ids, use_cache=False).logits[0].float().numpy()

    return run


def random_verify_tokens(vocab_size: int, max_cache_len: int, count: int = 8, seed: int = 1234) -> list[int]:
    """``min(count, max_cache_len)`` token ids drawn uniformly from ``[0, vocab_size)`` (numpy, fixed seed)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, size=min(count, max_cache_len)).tolist()
