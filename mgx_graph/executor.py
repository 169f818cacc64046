"""The eval loop of a compiled program.

``finalize`` allocates the scratch arena, the literal area and the parameter buffers of ``run`` (all
before the first run, so every intermediate has a fixed address), uploads literals, builds the
arrays of every statically placed value, and turns each module into a list of steps.  A run binds the
parameters, then issues every step on the queue in order with no host synchronization between
instructions; a ``graph_launch`` step hands its body to :class:`~mgx_graph.graph_launch.GraphLaunchState`.
Only the instructions that need the host synchronize: ``if`` and ``loop`` (condition, trip count),
``copy_from_gpu`` before a host-fallback op, and ``guard``.
"""
from __future__ import annotations

import threading

import numpy as np

from .errors import ExecutionError, MgxError, ParameterError
from .graph_launch import GraphBudget, GraphLaunchState, GraphOptions, Validator
from .operators.base import HOST
from .operators.dynamic import SpecializationMiss
from .passes.hip_graph import launch_count
from .passes.memory_coloring import linear_order, on_host, param_bindings
from .staging import InputStaging


class Executor:
    def __init__(self, program, ctx, *, options: GraphOptions | None = None, budget: GraphBudget | None = None,
                 label: str = ""):
        self.program = program
        self.ctx = ctx
        self.lock = threading.RLock()
        self.budget = budget or GraphBudget(options or GraphOptions.from_env())
        self.options = self.budget.options
        self.label = label
        self.regions: list[GraphLaunchState] = []
        self.runs = 0
        self.last_launches = 0
        self._closed = False
        self.queues: set[int] = set()  # queues given to run_async (released with the context)
        self._finalize()
        self.staging = InputStaging.for_executor(self)

    # -- finalize --------------------------------------------------------------------------------
    def _finalize(self) -> None:
        prog, ctx = self.program, self.ctx
        plan = prog.memory_plan
        modules = prog.module_order()
        self.slot = {}
        self._slot_ins = {}
        for m in modules:
            for ins in m.instructions:
                self._slot_ins[len(self.slot)] = ins
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
            if p.shape.dtype == "object":  # strings live on the host
                self.param_buffers[p.op.parameter] = np.empty(p.shape.lens, dtype=object)
                continue
            self.param_buffers[p.op.parameter] = ctx.array(self.param_area, off, p.shape.as_standard())
            off += (p.shape.bytes() + 255) // 256 * 256
        self.binds = param_bindings(prog)
        dynamic = set()
        self.loop_vars = {}
        for m in modules:
            for ins in m.instructions:
                op = ins.op
                s = self.slot[id(ins)]
                if op.name == "@literal":
                    env[s] = op.value if id(ins) not in plan.literal_offsets else \
                        ctx.upload(op.value, self.literals, plan.literal_offsets[id(ins)])
                elif op.name == "@param":
                    b = self.binds.get(id(ins))
                    if b is not None and b[0] in ("loop", "loopvar"):
                        continue  # bound to loop-owned buffers below
                    dynamic.add(id(ins))
                elif op.name in ("graph_launch", "@return") or "bind_param" in ins.meta:
                    dynamic.add(id(ins))
                elif op.is_view:
                    if id(ins.inputs[0]) in dynamic or op.name == "guard":
                        dynamic.add(id(ins))
                elif on_host(ins):
                    env[s] = _host_value(ins.shape)
                else:
                    env[s] = self._owned(ins, plan)
        # loop bodies read their carried values / counters from loop-owned buffers
        for m in modules:
            for ins in m.instructions:
                if ins.op.name == "loop":
                    body = ins.module_inputs[0]
                    own = env[self.slot[id(ins)]]
                    own = own if isinstance(own, tuple) else (own,)
                    vars_ = [ctx.array(self.arena, plan.offsets[(id(ins), ("var", k))], body.get_parameter(n).shape)
                             if body.get_parameter(n) is not None else None
                             for k, n in enumerate(ins.op.param_names[:2])]
                    self.loop_vars[id(ins)] = vars_
                    for k, n in enumerate(ins.op.param_names):
                        p = body.get_parameter(n)
                        if p is not None:
                            env[self.slot[id(p)]] = vars_[k] if k < 2 else own[k - 2]
        for ins in linear_order(main):
            op = ins.op
            if op.is_view and id(ins) not in dynamic:
                env[self.slot[id(ins)]] = op.view(ctx.xp, env[self.slot[id(ins.inputs[0])]], ins.shape)
        self.env = env
        self.dynamic = dynamic
        self.steps, self.labels, self.launch_totals = {}, {}, {}
        for m in modules:
            self._build_steps(m)
        self.param_specs = [(p.op.parameter, self.slot[id(p)], p.shape) for p in params]
        self.param_names = {p.op.parameter for p in params}
        self._param_checks = [(name, s, tuple(shape.lens), shape.np_dtype, shape) for name, s, shape in self.param_specs]
        self.bound = [(self.slot[id(i)], self.slot[id(main.get_parameter(i.meta["bind_param"]))], i.shape)
                      for m in modules for i in m.instructions if "bind_param" in i.meta]
        self._bound_views = {}
        ret = main.get_return()
        self.out_slots = [self.slot[id(i)] for i in ret.inputs]
        # library handles and workspaces exist before any capture (never created inside one)
        if any(i.op.name in ("dot", "convolution", "lstm", "rnn", "gru") for m in modules for i in m.instructions):
            ctx.blas(ctx.queue)

    def _owned(self, ins, plan):
        if isinstance(ins.shape, tuple):
            return tuple(self.ctx.array(self.arena, plan.offsets[(id(ins), k)], s) for k, s in enumerate(ins.shape))
        return self.ctx.array(self.arena, plan.offsets[(id(ins), None)], ins.shape)

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
                step = self._graph_launch_step(ins, out, ins_slots)
            elif op.name == "if":
                step = self._if_step(ins, out, ins_slots)
            elif op.name == "loop":
                step = self._loop_step(ins, out, ins_slots)
            elif op.name == "guard":
                step = _guard_step(ctx, op, out, ins_slots[0])
            elif op.name == "copy_from_gpu":
                step = _copy_from_gpu_step(ctx, out, ins_slots[0])
            elif op.name == "copy_to_gpu":
                step = _copy_to_gpu_step(ctx, out, ins_slots[0])
                total += 1
            elif op.is_view:
                if id(ins) not in dynamic:
                    continue
                step = _view_step(op, ctx.xp, ins.shape, out, ins_slots[0])
            elif on_host(ins):
                k = ins.meta["kernel"]
                ws = [_host_value(s) for s in k.workspace]
                step = _host_step(k.fn, out, ins_slots, ws)
            else:
                k = ins.meta["kernel"]
                ws = [ctx.array(self.arena, o, s) for o, s in zip(self.program.memory_plan.workspace.get(id(ins), []),
                                                                 k.workspace)]
                total += k.launches
                hook = getattr(op, "on_launch", None)
                static_ok = id(ins) not in dynamic and not any(id(i) in dynamic for i in ins.inputs)
                if static_ok and hook is None:
                    step = _static_kernel_step(launch, k.fn, env[out], [env[s] for s in ins_slots], ws)
                else:
                    step = _kernel_step(launch, k.fn, out, ins_slots, ws, hook, ctx)
            steps.append(step)
            labels.append(label)
        self.steps[m.name] = steps
        self.labels[m.name] = labels
        self.launch_totals[m.name] = total

    # -- control flow ----------------------------------------------------------------------------
    def _if_step(self, ins, out_slot, in_slots):
        ctx, env = self.ctx, self.env
        then_m, else_m = ins.module_inputs
        rets = [[self.slot[id(i)] for i in m.get_return().inputs] for m in (then_m, else_m)]
        own = env[out_slot]
        own_t = own if isinstance(own, tuple) else (own,)
        cond_slot = in_slots[0]

        def step(env_, queue):
            cond = bool(np.asarray(ctx.to_host(env[cond_slot], queue)).reshape(-1)[0])
            b = 0 if cond else 1
            name = (then_m, else_m)[b].name
            self.run_module(name, queue)
            for dst, s in zip(own_t, rets[b]):
                ctx.copy(queue, dst, env[s])
            self.last_launches += self.launch_totals[name] + len(own_t)

        return step

    def _loop_step(self, ins, out_slot, in_slots):
        ctx, env, xp = self.ctx, self.env, self.ctx.xp
        op = ins.op
        body = ins.module_inputs[0]
        n = op.n_carried
        ret_slots = [self.slot[id(i)] for i in body.get_return().inputs]
        own = env[out_slot]
        own_t = own if isinstance(own, tuple) else (own,)
        carried, scans = own_t[:n], own_t[n:]
        it_buf, cond_buf = self.loop_vars[id(ins)]
        m_slot, c_slot = in_slots[0], in_slots[1]
        init_slots = in_slots[2:2 + n]
        trip = op.trip_count
        key = ins.meta.get("trip_key", "")

        def step(env_, queue):
            limit = int(np.asarray(ctx.to_host(env[m_slot], queue)).reshape(-1)[0])
            cond = bool(np.asarray(ctx.to_host(env[c_slot], queue)).reshape(-1)[0])
            for dst, s in zip(carried, init_slots):
                ctx.copy(queue, dst, env[s])
            i = 0
            while cond and i < limit:
                if it_buf is not None:
                    ctx.fill(queue, it_buf, i)
                if cond_buf is not None:
                    ctx.fill(queue, cond_buf, cond)
                self.run_module(body.name, queue)
                cond = bool(np.asarray(ctx.to_host(env[ret_slots[0]], queue)).reshape(-1)[0])
                if i < trip:  # scan outputs first: they may read a carried value about to be updated
                    for dst, s in zip(scans, ret_slots[1 + n:]):
                        ctx.copy(queue, dst[i, ...], env[s])
                pairs = [(dst, env[s]) for dst, s in zip(carried, ret_slots[1:1 + n])]
                own_ptrs = {ctx.data_ptr(d) for d in carried}
                pairs = [(d, xp.array(src, copy=True) if ctx.data_ptr(src) in own_ptrs and
                          ctx.data_ptr(src) != ctx.data_ptr(d) else src) for d, src in pairs]
                for dst, src in pairs:
                    if ctx.data_ptr(src) != ctx.data_ptr(dst):
                        ctx.copy(queue, dst, src)
                self.last_launches += self.launch_totals[body.name] + n + len(scans)
                i += 1
            if scans and i != trip:  # scan outputs were specialized for another trip count
                raise SpecializationMiss(key, np.asarray(i, np.int64), np.asarray(trip, np.int64))

        return step

    def _graph_launch_step(self, ins, out_slot, in_slots):
        sub = ins.module_inputs[0]
        names = sorted(sub.get_parameter_names())
        sub_slots = [self.slot[id(sub.get_parameter(nm))] for nm in names]
        ret_slots = [self.slot[id(i)] for i in sub.get_return().inputs]
        body_launches = self._body_launches(sub)
        n_ins = sum(1 for i in sub.instructions if not i.op.builtin)
        region = f"{self.label}{sub.name}" if self.label else sub.name
        main = self.program.get_main_module()
        state_slots = [self.slot[id(main.get_parameter(i.meta["bind_param"]))] for i in sub.instructions
                       if "bind_param" in i.meta]
        validator = Validator(self.ctx, lambda: [self.env[s] for s in state_slots])
        state = GraphLaunchState(region, self.ctx, body_launches, n_ins, budget=self.budget, family=sub.name,
                                 validator=validator)
        self.regions.append(state)
        env = self.env
        dyn_pairs, dyn_names, dyn_src = [], [], []
        for nm, ps, s in zip(names, sub_slots, in_slots):
            if id(self._slot_ins[s]) in self.dynamic:
                dyn_pairs.append((ps, s))
                dyn_names.append(nm)
                dyn_src.append(s)
            else:
                env[ps] = env[s]
        single = len(ret_slots) == 1
        data_ptr = self.ctx.data_ptr
        sub_name = sub.name

        def read_outputs():
            return [env[s] for s in ret_slots]

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

    def _body_launches(self, sub) -> int:
        return sum(launch_count(i) for i in sub.instructions)

    # -- running ---------------------------------------------------------------------------------
    def run_module(self, name: str, queue, capture: bool = False) -> None:
        env = self.env
        if not capture:
            steps = self.steps[name]
            k = 0
            try:
                for k, step in enumerate(steps):
                    step(env, queue)
            except (MgxError, SpecializationMiss, KeyboardInterrupt):
                raise
            except Exception as e:
                raise ExecutionError(f"instruction {self.labels[name][k]}: {type(e).__name__}: {e}") from e
            return
        guard = getattr(self.ctx, "set_guard_where", None)
        with self.ctx.capture_guard(name):
            for step, label in zip(self.steps[name], self.labels[name]):
                if guard is not None:
                    guard(label)
                step(env, queue)

    def bind(self, params: dict, device: bool, queue=None) -> None:
        """Validate and bind parameters (raises ParameterError before touching any state).  Device inputs
        that overlap the program's own memory are staged into their parameter buffers on ``queue``
        (see :mod:`mgx_graph.staging`)."""
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
        staged = self.staging.check(values) if device else ()
        env = self.env
        for s, a in values:
            env[s] = a
        if staged:
            self.staging.stage(ctx.queue if queue is None else queue, staged, env)
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
            self.queues.add(q)
            self.bind(params, device=True, queue=q)
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

    def _upload(self, params: dict, q) -> None:
        """Validate host ``params`` and copy them into the program's parameter buffers on queue ``q``."""
        self.bind(params, device=False)
        dev = {}
        srcs = [np.asarray(params[name], order="C") for name, _, _ in self.param_specs]
        # a host array in the program's memory (ref) may be another parameter's buffer: read it first
        srcs = [a.copy() if self.ctx.is_device_array(a) and self.staging.overlaps(a) else a for a in srcs]
        for (name, _, _), src in zip(self.param_specs, srcs):
            buf = self.param_buffers[name]
            self.ctx.copy_from_host(buf, src, q)
            dev[name] = buf
        self.bind(dev, device=True, queue=q)

    def run(self, params: dict) -> list[np.ndarray]:
        with self.lock:
            self._check_open()
            ctx = self.ctx
            q = ctx.queue
            if not isinstance(params, dict):
                raise ParameterError(f"parameters must be a dict of name -> numpy array, got {type(params).__name__}")
            self._upload(params, q)
            outs = self._run(q)
            ctx.synchronize(q)
            return [ctx.to_host(o, q) for o in outs]

    def profile(self, params: dict, runs: int = 10) -> list:
        """Time every instruction of ``main`` (eager, the queue synchronized after each one) over ``runs``
        runs: ``[(label, op name, [ms per run])]``; host (numpy) inputs."""
        import time

        with self.lock:
            ctx = self.ctx
            q = ctx.queue
            self._upload(params, q)
            times = [[] for _ in self.steps["main"]]
            with ctx.on_queue(q):
                ctx.current_queue = q
                for _ in range(runs):
                    for k, step in enumerate(self.steps["main"]):
                        t0 = time.perf_counter()
                        step(self.env, q)
                        ctx.synchronize(q)
                        times[k].append((time.perf_counter() - t0) * 1e3)
            return [(lab, lab.split(" ", 1)[1].split("[")[0], t) for lab, t in zip(self.labels["main"], times)]

    def _check_open(self):
        if self._closed:
            raise MgxError("the program was released")

    def stats(self) -> dict:
        regions = [r.stats() for r in self.regions]
        tot = {k: sum(r[k] for r in regions) for k in ("warmups", "captures", "replays", "fallbacks", "eager_runs",
                                                          "updates", "evictions", "validations",
                                                          "validation_mismatches")}
        eager_launches = self.launch_totals.get("main", 0) + sum(r["launches_eager"] for r in regions)
        return {"target": self.ctx.name, "runs": self.runs, "regions": regions, **tot,
                "launches_per_run": self.last_launches, "launches_per_run_eager": eager_launches,
                "graph_bytes": self.budget.live_bytes,
                "scratch_bytes": self.program.memory_plan.arena_bytes,
                "literal_bytes": self.program.memory_plan.literal_bytes}

    def close(self) -> None:
        with self.lock:
            if self._closed:
                return
            self._closed = True
            regions, self.env = self.regions, []
            self.staging.clear()
            # the context synchronizes, then graph execs go, then memory: later if a capture is open
            self.ctx.close(self.queues, before=lambda: [r.release() for r in regions])


def _host_value(shape):
    if isinstance(shape, tuple):
        return tuple(np.empty(s.lens, s.np_dtype) for s in shape)
    return np.empty(shape.lens, shape.np_dtype)


def _view_step(op, xp, shape, out, src):
    view = op.view

    def step(env, queue):
        env[out] = view(xp, env[src], shape)

    return step


def _guard_step(ctx, op, out, src):
    expected = op.expected

    def step(env, queue):
        x = env[src]
        observed = op.observe(ctx.to_host(x, queue))
        if observed.shape != expected.shape or not np.array_equal(observed, expected):
            raise SpecializationMiss(op.key, observed, expected)
        env[out] = x

    return step


def _copy_from_gpu_step(ctx, out, src):
    def step(env, queue):
        dst = env[out]
        dst[...] = ctx.to_host(env[src], queue)

    return step


def _copy_to_gpu_step(ctx, out, src):
    def step(env, queue):
        ctx.copy_from_host(env[out], env[src], queue)

    return step


def _host_step(fn, out, in_slots, ws):
    def step(env, queue):
        fn(HOST, env[out], [env[s] for s in in_slots], ws)

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
