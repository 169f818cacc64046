"""The compile pipeline of every target, one definition: named groups of passes run in this order.

A target specializes it through the arguments of :func:`pipeline` (its name, which ``Lowering`` gets,
and ``gemv_layout``).  Adding a pass is one import of its module here and one entry in its group.
"""
from __future__ import annotations

from ..passes.bind_outputs import BindOutputs
from ..passes.eliminate_dead_code import EliminateDeadCode
from ..passes.fuse_attention import FuseAttention
from ..passes.fuse_converts import FuseConverts
from ..passes.fuse_gemv import FuseGemv
from ..passes.fuse_horizontal import FuseHorizontal
from ..passes.fuse_norms import FuseNorms
from ..passes.fuse_pointwise import FusePointwise
from ..passes.fuse_reduce import FuseReduce
from ..passes.fuse_rotary_kv import FuseRotaryKv
from ..passes.fuse_scatternd import FuseScatterND
from ..passes.gemv_layout import GemvLayout
from ..passes.hip_graph import HipGraph
from ..passes.lowering import Lowering
from ..passes.memory_coloring import MemoryColoring
from ..passes.merge_dots import MergeDots
from ..passes.pass_manager import PassGroup, PipelineOptions
from ..passes.propagate_constant import PropagateConstant
from ..passes.share_literals import ShareLiterals
from ..passes.quantize_fp16 import QuantizeFp16
from ..passes.simplify_reshapes import SimplifyReshapes


def pipeline(target_name: str, options: PipelineOptions, *, gemv_layout: bool = False) -> list[PassGroup]:
    """The compile pipeline of target ``target_name`` for ``options``: a list of :class:`PassGroup`.

    ``gemv_layout`` (the gpu target): the group ``layout`` stores the weights of one-row ``dot``
    instructions transposed for the gemv kernel (``gemv_layout``) before ``fuse_gemv`` fuses such a
    ``dot`` with the RMSNorm before it and the elementwise epilogue after it; without it the group is
    ``gemv`` with ``fuse_gemv`` alone.  ``share``, there only with ``options.shared_literals`` (another
    program's literals), reads the literals that program holds from its memory.  ``lower`` picks the kernels of
    ``target_name``; ``graph`` then cuts the capture regions.
    """
    o = options
    gemv = (PassGroup("layout", [GemvLayout(), FuseGemv(o.host_ops)]) if gemv_layout
            else PassGroup("gemv", [FuseGemv(o.host_ops)]))
    return [
        PassGroup("simplify", [EliminateDeadCode(), PropagateConstant(), SimplifyReshapes(), FuseConverts()]),
        PassGroup("fuse", [FuseNorms(), EliminateDeadCode()]),
        PassGroup("precision", [QuantizeFp16(), PropagateConstant()], enabled=o.fp16),
        PassGroup("fuse_kernels", [MergeDots(), FuseAttention(o.host_ops), FuseReduce(o.host_ops),
                                   FusePointwise(o.host_ops), FuseScatterND(o.host_ops), FuseHorizontal(o.host_ops),
                                   FuseRotaryKv(o.host_ops), EliminateDeadCode()]),
        gemv,
        *([PassGroup("share", [ShareLiterals(o.shared_literals)])] if o.shared_literals is not None else []),
        PassGroup("outputs", [BindOutputs(o.alias, strict=o.strict_alias)]),
        PassGroup("lower", [Lowering(target_name, host_ops=o.host_ops)]),
        PassGroup("graph", [HipGraph(o.min_partition_size)], enabled=o.hip_graph),
        PassGroup("memory", [MemoryColoring()]),
    ]
