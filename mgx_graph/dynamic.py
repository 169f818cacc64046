"""Shapes known only at run time: specializations of one ONNX model, chosen per call.

A model whose input dims are symbolic, or whose shapes depend on data (``NonZero``, a ``Reshape`` fed
by a computed shape, a ``Loop`` with scan outputs ...), is compiled per *specialization*: its input
shapes plus the run-time values the frontend needed (``known``).  On each call the dispatcher picks
the specialization for the given input shapes (most recently used first); a ``guard`` inside it
re-checks every specialized value, and a mismatch (``SpecializationMiss``) abandons that run and
re-dispatches with the observed value.  A value needed before any specialization exists is computed
by a *prefix program*: the model pruned to the nodes that produce it.  Specializations are capped
(LRU, released on eviction); every event is traced when ``MIGRAPHX_HIP_GRAPH_DEBUG`` is on.

Outputs bound in place (``alias``) are not allowed here: a re-dispatched run must have no side effects.
"""
from __future__ import annotations

import sys
from collections import OrderedDict

import numpy as np

from . import env
from .errors import MgxError, ParameterError
from .operators.dynamic import NeedsValue, SpecializationMiss, reduce_for_key

MAX_ATTEMPTS = 16


def _freeze(known: dict) -> tuple:
    return tuple(sorted((k, np.asarray(v).tobytes(), np.asarray(v).shape) for k, v in known.items()))


class Dispatcher:
    def __init__(self, model, parse_kw: dict, compile_kw: dict, target: str, max_specializations: int = 8,
                 debug: bool = False):
        self.model = model
        self.parse_kw = dict(parse_kw)
        self.compile_kw = dict(compile_kw)
        self.target = target
        self.cap = int(max_specializations)
        self.debug = debug or env.enabled("MIGRAPHX_HIP_GRAPH_DEBUG")
        self.specs: OrderedDict = OrderedDict()  # (shapes, frozen known) -> Program
        self.known_by_shapes: dict = {}
        self.prefixes: dict = {}
        self.misses = 0
        self.compiles = 0
        self.evictions = 0
        self.budget = compile_kw.get("budget")
        self._retired = {k: 0 for k in ("warmups", "captures", "replays", "fallbacks", "eager_runs", "updates",
                                         "evictions", "validations", "validation_mismatches")}

    def trace(self, event: str, detail: str) -> None:
        if self.debug:
            print(f"[mgx_graph] {event:<8} {detail}", file=sys.stderr, flush=True)

    # -- specializations -------------------------------------------------------------------------
    def _compile(self, shapes: tuple, known: dict, params, device: bool, ctx_hint=None):
        from .onnx_frontend import parse_onnx

        for _ in range(MAX_ATTEMPTS):
            try:
                prog = parse_onnx(self.model, input_dims=dict(shapes), known_values=known, **self.parse_kw)
            except NeedsValue as nv:
                if nv.guess is not None:
                    known[nv.key] = np.asarray(nv.guess, np.int64)
                    continue
                if nv.evaluate is not None:
                    known.update(self._prefix_eval(nv, shapes, known, params, device))
                else:
                    known[nv.key] = self._prefix_value(nv, shapes, known, params, device)
                continue
            self.compiles += 1
            label = f"[spec {self.compiles}] "
            prog.compile(self.target, alias=None, _label=label, **self.compile_kw)
            self.trace("SPECIALIZE", f"{label}shapes={_fmt_shapes(shapes)}" +
                       (f" values={_fmt_known(known)}" if known else ""))
            return prog
        raise MgxError(f"could not specialize the program after {MAX_ATTEMPTS} attempts (values {list(known)})")

    def _prefix_value(self, nv: NeedsValue, shapes, known, params, device):
        """Run the program parsed up to the node that needs the value (it ends in the tensor)."""
        pkey = (nv.tensor, nv.fn, shapes, _freeze(known))
        prog = self.prefixes.get(pkey)
        if prog is None:
            prog = nv.program
            main = prog.get_main_module()
            if nv.ins.module is not main:
                raise MgxError(f"node '{nv.node}': {nv.fn}({nv.tensor}) is needed inside a subgraph; "
                               f"this data-dependent shape is not supported")
            main.add_return([nv.ins], [nv.tensor])
            prog.compile(self.target, hip_graph=False, alias=None, fp16=self.compile_kw.get("fp16", False))
            self.prefixes[pkey] = prog
            self.trace("PREFIX", f"computing {nv.fn}({nv.tensor}) needed by node '{nv.node}'")
        names = prog.get_parameter_names()
        sub = {n: params[n] for n in names}
        outs = prog.run_async(sub) if device else prog.run(sub)
        val = prog.context.to_host(outs[0], prog.queue) if device else outs[0]
        return reduce_for_key(nv.fn, val)

    def _prefix_eval(self, nv: NeedsValue, shapes, known, params, device) -> dict:
        """Run the program parsed so far, returning the node's inputs, and evaluate them on the host."""
        prog = nv.program
        main = prog.get_main_module()
        if any(i.module is not main for i in nv.inputs):
            raise MgxError(f"node '{nv.node}': its output shape depends on values inside a subgraph; "
                           f"this data-dependent shape is not supported")
        main.add_return(list(nv.inputs), [f"in{k}" for k in range(len(nv.inputs))])
        prog.compile(self.target, hip_graph=False, alias=None, fp16=self.compile_kw.get("fp16", False))
        self.trace("PREFIX", f"evaluating node '{nv.node}' on the host for its output shapes")
        sub = {n: params[n] for n in prog.get_parameter_names()}
        outs = prog.run_async(sub) if device else prog.run(sub)
        vals = [prog.context.to_host(o, prog.queue) for o in outs] if device else outs
        prog.release()
        return nv.evaluate(vals)

    def _lookup(self, shapes: tuple, known: dict):
        return self.specs.get((shapes, _freeze(known)))

    def _insert(self, shapes, known, prog):
        self.specs[(shapes, _freeze(known))] = prog
        self.known_by_shapes[shapes] = dict(known)
        while len(self.specs) > self.cap:
            _, old = self.specs.popitem(last=False)
            st = old._compiled.stats()
            for k in self._retired:
                self._retired[k] += st.get(k, 0)
            old._compiled.close()
            self.evictions += 1
            self.trace("EVICT", f"specialization cap {self.cap} reached: released the least recently used")

    # -- running ---------------------------------------------------------------------------------
    def _validate(self, params: dict) -> None:
        g = self.model.graph
        inits = {t.name for t in g.initializer}
        decl = {vi.name: vi for vi in g.input if vi.name not in inits}
        unknown = [k for k in params if k not in decl]
        if unknown:
            raise ParameterError(f"unknown parameter(s) {unknown}; the program takes {sorted(decl)}")
        for name, vi in decl.items():
            if name not in params:
                raise ParameterError(f"parameter '{name}' is missing")
            a = params[name]
            dims = vi.type.tensor_type.shape.dim
            shape = np.shape(a)
            if len(shape) != len(dims):
                raise ParameterError(f"parameter '{name}': expected rank {len(dims)}, got rank {len(shape)} "
                                     f"{list(shape)}")
            for k, (d, given) in enumerate(zip(dims, shape)):
                if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != given:
                    raise ParameterError(f"parameter '{name}': dim {k} is fixed to {d.dim_value} by the model, "
                                         f"got {given} (shape {list(shape)})")

    def run(self, params: dict, device: bool, queue=None):
        if not isinstance(params, dict):
            raise ParameterError(f"parameters must be a dict of name -> array, got {type(params).__name__}")
        self._validate(params)
        shapes = tuple(sorted((n, tuple(int(d) for d in np.shape(a))) for n, a in params.items()))
        known = dict(self.known_by_shapes.get(shapes, {}))
        for _ in range(MAX_ATTEMPTS):
            prog = self._lookup(shapes, known)
            if prog is None:
                prog = self._compile(shapes, known, params, device)
                self._insert(shapes, known, prog)
            else:
                self.specs.move_to_end((shapes, _freeze(known)))
            try:
                return prog._compiled.run_async(params, queue) if device else prog._compiled.run(params)
            except SpecializationMiss as miss:
                self.misses += 1
                self.trace("RESPECIALIZE", f"{miss}")
                known[miss.key] = miss.observed
        raise MgxError(f"run-time values keep changing under the program (last known {list(known)})")

    def last(self):
        return next(reversed(self.specs.values())) if self.specs else None

    def stats(self) -> dict:
        agg = dict(self._retired)
        regions = []
        launches = eager = 0
        for prog in self.specs.values():
            st = prog._compiled.stats()
            for k in agg:
                agg[k] += st.get(k, 0)
            regions += st["regions"]
        last = self.last()
        if last is not None:
            st = last._compiled.stats()
            launches, eager = st["launches_per_run"], st["launches_per_run_eager"]
        return {"target": self.target, "regions": regions, **agg, "launches_per_run": launches,
                "launches_per_run_eager": eager, "specializations": len(self.specs),
                "specialization_compiles": self.compiles, "specialization_misses": self.misses,
                "specialization_evictions": self.evictions,
                "scratch_bytes": last._compiled.stats()["scratch_bytes"] if last else 0,
                "literal_bytes": last._compiled.stats()["literal_bytes"] if last else 0}

    def release(self) -> None:
        for p in list(self.specs.values()) + list(self.prefixes.values()):
            p._compiled.close()
        self.specs.clear()
        self.prefixes.clear()


def _fmt_shapes(shapes) -> str:
    return ",".join(f"{n}{list(s)}" for n, s in shapes)


def _fmt_known(known) -> str:
    return ",".join(f"{k}={np.asarray(v).tolist()}" for k, v in sorted(known.items()))
