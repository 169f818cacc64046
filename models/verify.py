"""Check an exported graph against the torch model it came from, with onnxruntime (CPU).

:func:`verify_static_step` decodes token by token through a fixed-shape decode step, feeding
the caches back, and compares every step's logits with one full-sequence torch forward
(:func:`reference_logits`); :func:`verify_batched_step` does the same for a step of several
left-padded rows. onnxruntime comes with mgx_graph's ``[test]`` extra; numpy and
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


def left_padded_feeds(rows: list[list[int]], slot: int, pad_token: int, max_cache_len: int):
    """The step inputs of slot ``slot`` for ``rows`` (token lists) left-padded to the longest row:
    ``input_ids`` [B,1], ``cache_position`` [1], ``attention_mask`` [B, max_cache_len] and
    ``position_ids`` [B,1] (int64), and which rows hold a real token at ``slot``.

    Row b starts at slot ``pad_b = longest - len(row)``. Its mask is 1 on its real slots up to
    ``slot`` and on ``slot`` itself (a padding step attends to itself only, so no row is ever
    fully masked); its position is ``slot - pad_b`` (0 while padding). Slots past the longest row
    hold nothing here (the caller feeds generated tokens there).
    """
    import numpy as np

    longest = max(len(r) for r in rows)
    b = len(rows)
    ids = np.full((b, 1), pad_token, np.int64)
    pos = np.zeros((b, 1), np.int64)
    mask = np.zeros((b, max_cache_len), np.int64)
    real = []
    for i, row in enumerate(rows):
        pad = longest - len(row)
        mask[i, pad:slot + 1] = 1
        mask[i, slot] = 1
        if pad <= slot < longest:
            ids[i, 0] = row[slot - pad]
            pos[i, 0] = slot - pad
        real.append(pad <= slot < longest)
    feeds = {"input_ids": ids, "cache_position": np.array([slot], np.int64), "attention_mask": mask,
             "position_ids": pos}
    return feeds, real


def verify_batched_step(
    onnx_path: Path,
    reference_logits: Callable[[list[int]], Any],
    token_ids: list[int],
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    max_cache_len: int,
    batch: int,
    note: Callable[[str], None] = lambda s: None,
    atol: float = VERIFY_ATOL,
) -> float:
    """Decode prefixes of ``token_ids`` of ``batch`` different lengths (row b: the first
    ``max(1, T - b)`` tokens), left-padded, through a step of ``batch`` rows with onnxruntime
    (inputs of :func:`left_padded_feeds`, caches fed back), and compare each real token's
    logits with ``reference_logits(token_ids)`` at its position in its row. Returns the max abs
    error; raises :class:`VerificationError` if it is >= ``atol``.
    """
    import numpy as np

    if len(token_ids) > max_cache_len:
        raise ValueError("more verification tokens than cache slots")
    sess = ort_session(onnx_path)
    in_names, out_names, alias = static_step_names(num_layers, batch)
    shape = (batch, num_kv_heads, max_cache_len, head_dim)
    caches = {n: np.zeros(shape, np.float32) for n in alias.values()}
    ref = np.asarray(reference_logits(token_ids), dtype=np.float32)
    total = len(token_ids)
    rows = [list(token_ids[: max(1, total - b)]) for b in range(batch)]
    worst, compared = 0.0, 0
    for slot in range(total):
        feeds, real = left_padded_feeds(rows, slot, 0, max_cache_len)
        outs = dict(zip(out_names, sess.run(out_names, {**feeds, **caches})))
        logits = outs["logits"]
        if logits.shape != (batch, 1, ref.shape[-1]):
            raise VerificationError(f"logits shape {logits.shape}, expected ({batch}, 1, {ref.shape[-1]})")
        for b in range(batch):
            if real[b]:
                pos = int(feeds["position_ids"][b, 0])
                worst = max(worst, float(np.max(np.abs(logits[b, 0] - ref[pos]))))
                compared += 1
        for out_name, in_name in alias.items():
            caches[in_name] = outs[out_name]
    note(f"verify: {total} batched decode steps of {batch} left-padded rows ({compared} real tokens), "
         f"max abs logits error ORT vs torch = {worst:.3e}")
    if not np.isfinite(worst) or worst >= atol:
        raise VerificationError(f"{onnx_path.name}: ORT logits differ from torch by {worst:.3e} (tolerance {atol:.0e})")
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
