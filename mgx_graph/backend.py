"""An ``onnx.backend.base.Backend`` for mgx_graph, so the official ONNX backend test suite runs through
pytest (``onnx.backend.test.BackendTest``).  Device ``CPU`` is the ``ref`` target, ``CUDA`` the ``gpu``
target; ``hip_graph`` chooses graph mode (default: ``MIGRAPHX_HIP_GRAPH``).

    from mgx_graph.backend import MgxBackend
    rep = MgxBackend.prepare(model_proto, "CPU")
    outputs = rep.run([x, y])
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

import mgx_graph


class MgxBackendRep(BackendRep):
    def __init__(self, program, input_names):
        self.program = program
        self.input_names = input_names

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feeds = dict(zip(self.input_names, inputs))
        feeds = {k: np.asarray(v) for k, v in feeds.items()}
        return tuple(self.program.run(feeds))


class MgxBackend(Backend):
    hip_graph = None
    min_partition_size = 1

    @classmethod
    def _target(cls, device: str) -> str:
        return "gpu" if str(device).upper().startswith(("CUDA", "GPU", "HIP")) else "ref"

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if cls._target(device) == "gpu":
            return mgx_graph.gpu_available()
        return True

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        super().prepare(model, device, **kwargs)
        inits = {t.name for t in model.graph.initializer}
        names = [i.name for i in model.graph.input if i.name not in inits]
        # the suite's inputs have the shapes the model declares; symbolic dims take the test data's dims
        prog = mgx_graph.compile(model, target=cls._target(device), hip_graph=kwargs.get("hip_graph", cls.hip_graph),
                                 min_partition_size=cls.min_partition_size, alias=None)
        return MgxBackendRep(prog, names)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        raise NotImplementedError("run a model with prepare()/run()")


class MgxBackendGraph(MgxBackend):
    """The same backend with graph_launch on (min_partition_size 1: every run of kernels is a region)."""

    hip_graph = True


class MgxBackendEager(MgxBackend):
    hip_graph = False
