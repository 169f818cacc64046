"""The eval loop of a compiled program.

``finalize`` allocates the scratch arena, the literal area and the parameter buffers of ``run`` (all
before the first run, so every intermediate has a fixed address), uploads literals, builds the
arrays of every statically placed value, and turns each module into a list of steps.  A run binds the
parameters, then issues every step on the queue in order with no host synchronization between
instructions; a ``graph_launch`` step hands its body to :class:`~mgx_graph.graph_launch.GraphLaunchState`.
"""
from __future__ import annotations

import threading

import numpy as np

from .errors import ParameterError
from .graph_launch import GraphLaunchState
from .passes.hip_graph import launch_count


class Executor:
    def __init__(self, program, ctx, *, warmup: int = 2, debug: bool = False):
        self.program = program
        self.ctx = ctx
        self.lock = threading.RLock()
        self.warmup, self.debug = warmup, debug
        self.regions: list[GraphLaunchState] = []
        self.runs = 0
        self.last_launches = 0
        self._closed = False
        self._finalize()

    # -- finalize --------------------------------------------------------------------------------
    def _finalize(self) -> None:
        prog, ctx = self.program, self.ctx
        plan = prog.memory_plan
        modules = prog.module_order()
        self.slot = {}
        for m in modules:
            for ins in m.instructions:
                self.slot[id(ins)] = len(self.slot)
        env = [None] * len(self.slot)
        self.arena = ctx.allocate(plan.arena_bytes) if plan.arena_bytes else None
        self.literals = ctx.allocate(plan.literal_bytes) if plan.literal_bytes else None
        main = prog.get_main_module()
        params = [i for i in main.instructions if i.op.name == "@param"]
        pbytes = sum((i.shape.bytes() + 255) // 256 * 256 for i in params)
        self.param_area = ctx.allocate(max(pbytes, 1))
        self.param_buffers = {}
        off = 0
        for p in params:
            self.param_buffers[p.op.parameter] = ctx.array(self.param_area, off, p.shape.as_standard())
            off += (p.shape.bytes() + 255) // 256 * 256
        dynamic = set()
        for m in modules:
            for ins in m.instructions:
                op = ins.op
                s = self.slot[id(ins)]
                if op.name == "@literal":
                    env[s] = ctx.upload(op.value, self.literals, plan.literal_offsets[id(ins)])
                elif op.name in ("@param", "graph_launch", "@return") or "bind_param" in ins.meta:
                    dynamic.add(id(ins))
                elif op.is_view:
                    if id(ins.inputs[0]) in dynamic:
                        dynamic.add(id(ins))
                else:
                    env[s] = ctx.array(self.arena, plan.offsets[id(ins)], ins.shape)
        # static views, in execution order
        from .passes.memory import linear_order

        for ins in linear_order(main):
            if ins.op.is_view and id(ins) not in dynamic:
                env[self.slot[id(ins)]] = ins.op.view(ctx.xp, env[self.slot[id(ins.inputs[0])]], ins.shape)
        self.env = env
        self.dynamic = dynamic
        self.steps = {}
        self.labels = {}
        self.launch_totals = {}
        for m in modules:
            self._build_steps(m)
        self.param_specs = [(p.op.parameter, self.slot[id(p)], p.shape) for p in params]
        self.param_names = {p.op.parameter for p in params}
        self.bound = [(self.slot[id(i)], self.slot[id(main.get_parameter(i.meta["bind_param"]))], i.shape)
                      for m in modules for i in m.instructions if "bind_param" in i.meta]
        self._bound_views = {}
        self._param_checks = [(name, s, tuple(shape.lens), shape.np_dtype, shape) for name, s, shape in self.param_specs]
        ret = main.get_return()
        self.out_slots = [self.slot[id(i)] for i in ret.inputs]

    def _build_steps(self, m) -> None:
        ctx, env, slot, dynamic = self.ctx, self.env, self.slot, self.dynamic
        launch = ctx.launch
        steps, labels = [], []
        total = 0
        for n, ins in enumerate(m.instructions):
            op = ins.op
            if op.builtin:
                continue
            out = slot[id(ins)]
            ins_slots = [slot[id(i)] for i in ins.inputs]
            label = f"{m.name}:@{n} {op}"
            if op.name == "graph_launch":
                steps.append(self._graph_launch_step(ins, out, ins_slots))
                labels.append(label)
                continue
            if op.is_view:
                if id(ins) in dynamic:
                    steps.append(_view_step(op, ctx.xp, ins.shape, out, ins_slots[0]))
                    labels.append(label)
                continue
            k = ins.meta["kernel"]
            ws = [ctx.array(self.arena, o, s) for o, s in zip(self.program.memory_plan.workspace.get(id(ins), []),
                                                             k.workspace)]
            total += k.launches
            hook = getattr(op, "on_launch", None)
            static_ok = id(ins) not in dynamic and not any(id(i) in dynamic for i in ins.inputs)
            if static_ok and hook is None:
                steps.append(_static_kernel_step(launch, k.fn, env[out], [env[s] for s in ins_slots], ws))
            else:
                steps.append(_kernel_step(launch, k.fn, out, ins_slots, ws, hook, ctx))
            labels.append(label)
        self.steps[m.name] = steps
        self.labels[m.name] = labels
        self.launch_totals[m.name] = total

    def _graph_launch_step(self, ins, out_slot, in_slots):
        sub = ins.module_inputs[0]
        names = sorted(sub.get_parameter_names())
        sub_slots = [self.slot[id(sub.get_parameter(nm))] for nm in names]
        ret_slots = [self.slot[id(i)] for i in sub.get_return().inputs]
        body_launches = self._body_launches(sub)
        n_ins = sum(1 for i in sub.instructions if not i.op.builtin)
        state = GraphLaunchState(sub.name, self.ctx, body_launches, n_ins, self.warmup, self.debug)
        self.regions.append(state)
        env = self.env
        dyn = [(nm, s) for nm, s, src in zip(names, sub_slots, in_slots) if id(self._ins_of(src)) in self.dynamic]
        dyn_src = [src for src, (nm, _s) in zip(in_slots, zip(names, sub_slots))
                   if id(self._ins_of(src)) in self.dynamic]
        dyn_names = [nm for nm, _ in dyn]
        single = len(ret_slots) == 1
        data_ptr = self.ctx.data_ptr
        sub_name = sub.name

        def read_outputs():
            return [env[s] for s in ret_slots]

        dyn_pairs = []
        for ps, s in zip(sub_slots, in_slots):
            if id(self._ins_of(s)) in self.dynamic:
                dyn_pairs.append((ps, s))
            else:
                env[ps] = env[s]

        def step(env_, queue):
            for ps, s in dyn_pairs:
                env[ps] = env[s]
            items = tuple((nm, data_ptr(a), a.shape, a.dtype.char) for nm, a in
                          zip(dyn_names, [env[s] for s in dyn_src]))
            outs = state.execute((queue, items), queue, lambda: self.run_module(sub_name, queue),
                                 lambda: self.run_module(sub_name, queue, capture=True), read_outputs)
            self.last_launches += state.last_launches
            env[out_slot] = outs[0] if single else tuple(outs)

        return step

    def _ins_of(self, slot_index):
        if not hasattr(self, "_slot_ins"):
            self._slot_ins = {}
            for m in self.program.module_order():
                for ins in m.instructions:
                    self._slot_ins[self.slot[id(ins)]] = ins
        return self._slot_ins[slot_index]

    def _body_launches(self, sub) -> int:
        return sum(launch_count(i) for i in sub.instructions)

    # -- running ---------------------------------------------------------------------------------
    def run_module(self, name: str, queue, capture: bool = False) -> None:
        env = self.env
        if not capture:
            for step in self.steps[name]:
                step(env, queue)
            return
        guard = getattr(self.ctx, "set_guard_where", None)
        with self.ctx.capture_guard(name):
            for step, label in zip(self.steps[name], self.labels[name]):
                if guard is not None:
                    guard(label)
                step(env, queue)

    def bind(self, params: dict, device: bool) -> None:
        """Validate and bind parameters (raises ParameterError before touching any state)."""
        ctx = self.ctx
        if not isinstance(params, dict):
            raise ParameterError(f"parameters must be a dict of name -> array, got {type(params).__name__}")
        if len(params) != len(self._param_checks) or any(k not in self.param_names for k in params):
            unknown = [k for k in params if k not in self.param_names]
            if unknown:
                raise ParameterError(f"unknown parameter(s) {unknown}; the program takes {sorted(self.param_names)}")
        values = []
        is_dev = ctx.is_device_array
        for name, s, lens, dt, shape in self._param_checks:
            a = params.get(name)
            if a is None:
                raise ParameterError(f"parameter '{name}' is missing (expected {shape.brief()})")
            if device:
                if not is_dev(a):
                    raise ParameterError(f"parameter '{name}': expected a {ctx.name} device array "
                                         f"({'cupy.ndarray' if ctx.name == 'gpu' else 'numpy.ndarray'}), "
                                         f"got {type(a).__module__}.{type(a).__name__}")
            elif not isinstance(a, np.ndarray):
                a = np.asarray(a)
            if a.shape != lens or a.dtype != dt:
                if a.ndim != len(lens):
                    raise ParameterError(f"parameter '{name}': expected rank {len(lens)} {shape.brief()}, "
                                         f"got rank {a.ndim} {list(a.shape)}")
                if a.shape != lens:
                    raise ParameterError(f"parameter '{name}': expected shape {list(lens)}, got {list(a.shape)}")
                raise ParameterError(f"parameter '{name}': expected dtype {shape.dtype}, got {a.dtype}")
            if device and not a.flags.c_contiguous:
                raise ParameterError(f"parameter '{name}': device array must be C-contiguous (strides {a.strides})")
            values.append((s, a))
        env = self.env
        for s, a in values:
            env[s] = a
        cache = self._bound_views
        for bs, ps, layout in self.bound:
            a = env[ps]
            hit = cache.get(bs)
            if hit is not None and hit[0] is a:
                env[bs] = hit[1]
                continue
            v = a if layout.standard() else ctx.xp.lib.stride_tricks.as_strided(a, layout.lens, layout.byte_strides())
            cache[bs] = (a, v)
            env[bs] = v

    def run_async(self, params: dict, queue=None) -> list:
        with self.lock:
            self._check_open()
            q = self.ctx.queue if queue is None else int(queue)
            self.bind(params, device=True)
            return self._run(q)

    def _run(self, q) -> list:
        ctx = self.ctx
        self.last_launches = self.launch_totals["main"]
        with ctx.on_queue(q):
            ctx.current_queue = q
            self.run_module("main", q)
        self.runs += 1
        env = self.env
        return [env[s] for s in self.out_slots]

    def run(self, params: dict) -> list[np.ndarray]:
        with self.lock:
            self._check_open()
            ctx = self.ctx
            q = ctx.queue
            if not isinstance(params, dict):
                raise ParameterError(f"parameters must be a dict of name -> numpy array, got {type(params).__name__}")
            self.bind(params, device=False)  # validates host arrays
            dev = {}
            for name, s, shape in self.param_specs:
                buf = self.param_buffers[name]
                ctx.copy_from_host(buf, np.asarray(params[name], order="C"), q)
                dev[name] = buf
            self.bind(dev, device=True)
            outs = self._run(q)
            ctx.synchronize(q)
            return [ctx.to_host(o, q) for o in outs]

    def _check_open(self):
        if self._closed:
            from .errors import MgxError

            raise MgxError("the program was released")

    def stats(self) -> dict:
        regions = [r.stats() for r in self.regions]
        tot = {k: sum(r[k] for r in regions) for k in ("warmups", "captures", "replays", "fallbacks", "eager_runs")}
        eager_launches = self.launch_totals.get("main", 0) + sum(r["launches_eager"] for r in regions)
        return {"target": self.ctx.name, "runs": self.runs, "regions": regions, **tot,
                "launches_per_run": self.last_launches, "launches_per_run_eager": eager_launches,
                "scratch_bytes": self.program.memory_plan.arena_bytes,
                "literal_bytes": self.program.memory_plan.literal_bytes}

    def close(self) -> None:
        with self.lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.ctx.synchronize(self.ctx.queue)
            except Exception:
                pass
            for r in self.regions:
                r.release()
            self.env = []
            self.ctx.close()


def _view_step(op, xp, shape, out, src):
    view = op.view

    def step(env, queue):
        env[out] = view(xp, env[src], shape)

    return step


def _static_kernel_step(launch, fn, out, args, ws):
    def step(env, queue):
        launch(queue, fn, out, args, ws)

    return step


def _kernel_step(launch, fn, out, in_slots, ws, hook, ctx):
    if hook is None:
        def step(env, queue):
            launch(queue, fn, env[out], [env[s] for s in in_slots], ws)
    else:
        def step(env, queue):
            hook(ctx, queue)
            launch(queue, fn, env[out], [env[s] for s in in_slots], ws)
    return step
