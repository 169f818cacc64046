"""Decoders with seeded random weights (gpt2, llama): construction, weights hash, rebuild.

The weights are drawn from torch's RNG right after ``torch.manual_seed(seed)``, inside
``torch.random.fork_rng`` so the caller's RNG state is untouched. ``model.json`` keeps the
construction arguments, the seed and a SHA-256 of the weights (:func:`random_weights_record`)
so the oracle rebuilds the very module the graph was exported from and checks it
(:func:`rebuild_random_model`). :class:`RandomDecoder` bundles these for one transformers
architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import BuildError, VerificationError
from .outline import BuildOutline, DecoderShape, Loaded, Note, decoder_config, export_static, verify_static
from .verify import random_verify_tokens


def seeded_model(factory: Callable[[], Any], seed: int) -> Any:
    """Call ``factory()`` (which constructs a torch module) right after ``torch.manual_seed(seed)``.

    The construction happens inside ``torch.random.fork_rng`` so the caller's RNG state
    is untouched. Returns the module in eval mode, float32, on CPU.
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = factory()
    return model.to(torch.float32).eval()


def weights_sha256(model: Any) -> str:
    """SHA-256 over the names, shapes, dtypes and bytes of every parameter and buffer."""
    import hashlib

    import torch

    h = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def random_weights_record(model: Any, arch: dict[str, Any], seed: int, digest: str | None = None) -> dict[str, Any]:
    """What ``model.json`` keeps so that :func:`rebuild_random_model` can rebuild ``model``:
    the config arguments ``arch``, the ``seed``, the weights' SHA-256, the parameter count,
    the torch / transformers versions and the full transformers config."""
    import torch
    import transformers

    return {
        "arch": dict(arch),
        "seed": int(seed),
        "weights_sha256": digest if digest is not None else weights_sha256(model),
        "num_params": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_config": model.config.to_dict(),
    }


def rebuild_random_model(
    record: dict[str, Any],
    make_model: Callable[[dict[str, Any], int], Any],
    label: str,
    error: type[BuildError] = BuildError,
) -> Any:
    """``make_model(record["arch"], record["seed"])``, checked against ``record["weights_sha256"]``.

    ``record`` is a :func:`random_weights_record`. Raises ``error`` (default
    :class:`BuildError`) if the rebuilt weights differ from the recorded ones (for
    example under another torch/transformers version).
    """
    model = make_model(record["arch"], record["seed"])
    digest = weights_sha256(model)
    if digest != record["weights_sha256"]:
        raise error(
            f"rebuilt {label} weights differ from the exported ones "
            f"(sha256 {digest[:12]} != {record['weights_sha256'][:12]}); "
            f"built with torch {record.get('torch')} / transformers {record.get('transformers')}"
        )
    return model


@dataclass(frozen=True)
class RandomDecoder:
    """A transformers causal LM with seeded random weights, as one builder needs it.

    Attributes:
        name: the registry name; also ``config["architecture"]`` and the config key under
            which the :func:`random_weights_record` is kept.
        label: the name in messages (``"GPT-2"``).
        config_class / model_class: transformers class names (``"GPT2Config"``,
            ``"GPT2LMHeadModel"``); the model is ``model_class(config_class(**arch))``.
        architecture: normalized options -> the config keyword arguments ``arch``; its
            ``eos_token_id`` is the special token (bos = eos = pad).
        shape: normalized options -> the :class:`~.outline.DecoderShape`.
        summary: ``(opts, num_params) -> str``, the note printed after loading.
        check: optional ``model -> None`` run after construction (raises BuildError).
    """

    name: str
    label: str
    config_class: str
    model_class: str
    architecture: Callable[[dict[str, Any]], dict[str, Any]]
    shape: Callable[[dict[str, Any]], DecoderShape]
    summary: Callable[[dict[str, Any], int], str]
    check: Callable[[Any], None] | None = None

    def make_model(self, arch: dict[str, Any], seed: int) -> Any:
        """``model_class(config_class(**arch))`` with weights drawn after ``manual_seed(seed)``
        (eval mode, float32, CPU; the caller's RNG state is restored)."""
        import transformers

        config = getattr(transformers, self.config_class)(**arch)
        model_cls = getattr(transformers, self.model_class)
        return seeded_model(lambda: model_cls(config), seed)

    def rebuild_from_info(self, config: dict[str, Any]) -> Any:
        """Rebuild the module described by ``ModelInfo.config``; raises :class:`BuildError`
        if its weights differ from the exported ones (another torch/transformers version)."""
        return rebuild_random_model(config[self.name], self.make_model, self.label)

    def load(self, source: Any, opts: dict[str, Any], note: Note) -> Loaded:
        """The load step: construct the model, record how to rebuild it, print the summary."""
        arch = self.architecture(opts)
        model = self.make_model(arch, opts["seed"])
        if self.check is not None:
            self.check(model)
        record = random_weights_record(model, arch, opts["seed"])
        note(self.summary(opts, record["num_params"]))
        return Loaded(model, shape=self.shape(opts), extra={"record": record, "special": arch["eos_token_id"]})

    def verify_rebuild(self, loaded: Loaded, opts: dict[str, Any], note: Note) -> None:
        """Rebuild from the record and require identical weights (:class:`VerificationError`)."""
        record = loaded.extra["record"]
        rebuild_random_model(record, self.make_model, self.label, error=VerificationError)
        note(f"verify: rebuilt with seed {opts['seed']}: identical weights (sha256 {record['weights_sha256'][:16]})")

    def verify_static(self, loaded: Loaded, onnx_path: Path, opts: dict[str, Any], note: Note) -> None:
        """The verify step of a static export: :meth:`verify_rebuild`, then seeded random
        tokens decoded through onnxruntime against torch."""
        self.verify_rebuild(loaded, opts, note)
        tokens = random_verify_tokens(opts["vocab_size"], loaded.shape.max_cache_len)
        verify_static(loaded, onnx_path, tokens, note)

    def describe(self, loaded: Loaded, opts: dict[str, Any], root: Path) -> dict[str, Any]:
        """``ModelInfo.config``: :func:`~.outline.decoder_config` plus the rebuild record under :attr:`name`."""
        special = loaded.extra["special"]
        return decoder_config(self.name, opts.get("kind", "static"), loaded.shape, [special], special, special,
                              **{self.name: loaded.extra["record"]})

    def outline(self, export: Callable = export_static, verify: Callable | None = None) -> BuildOutline:
        """The :class:`~.outline.BuildOutline`: nothing to fetch, :meth:`load`, ``export``
        (default: the fixed-shape decode step), ``verify`` (default :meth:`verify_static`),
        :meth:`describe`."""
        return BuildOutline(self.name, load=self.load, export=export, verify=verify or self.verify_static,
                            describe=self.describe)
