"""Fixed-shape decode steps with the KV cache bound in place, against onnxruntime running the same
ONNX graph with the caches fed back (and, for tokens, transformers' generate)."""
import numpy as np
import pytest

import mgx_graph
from mgx_graph.llm.generation import Decoder, generate


def _ort_session(info):
    import onnxruntime as ort

    return ort.InferenceSession(str(info.onnx_path), providers=["CPUExecutionProvider"])


# (the `tiny` fixture, a small gpt2 and llama decode step: tests/conftest.py)


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_logits_and_cache_match_onnxruntime(tiny, target, hip_graph):
    prog = mgx_graph.compile(str(tiny.onnx_path), target=target, hip_graph=hip_graph)
    assert set(prog.alias) == set(tiny.alias)
    dec = Decoder(prog)
    sess = _ort_session(tiny)
    shapes = {i.name: i.shape for i in sess.get_inputs()}
    feeds = {n: np.zeros(s, np.float32) for n, s in shapes.items() if n.startswith("past")}
    tokens = [3, 17, 42, 5, 99, 8, 1, 250, 7, 7]
    for pos, t in enumerate(tokens):
        dec.step(t)
        feeds.update(input_ids=np.array([[t]], np.int64), cache_position=np.array([pos], np.int64))
        outs = sess.run(None, feeds)
        names = [o.name for o in sess.get_outputs()]
        got = prog.context.to_host(dec.last_logits, prog.queue)
        np.testing.assert_allclose(got, outs[0], rtol=1e-4, atol=1e-4, err_msg=f"step {pos}")
        for n, v in zip(names[1:], outs[1:]):
            feeds[tiny.alias[n]] = v
    cache = dec.cache()
    for n, v in cache.items():
        np.testing.assert_allclose(v, feeds[n], rtol=1e-4, atol=1e-5, err_msg=n)
        # positions never written stay zero: warmup and capture wrote nothing extra
        assert not np.any(v[:, :, len(tokens):, :])
    st = prog.stats()
    if hip_graph:
        assert (st["warmups"], st["captures"], st["fallbacks"]) == (2, 1, 0)
        assert st["replays"] == len(tokens) - 3
        assert len(st["regions"]) == 1 and st["launches_per_run"] == 1
    else:
        assert st["regions"] == [] and st["launches_per_run"] == st["launches_per_run_eager"]


def test_greedy_tokens_match_transformers(tiny, target):
    from mgx_graph.models.oracle import hf_greedy_tokens

    prompt = [5, 9, 2, 77]
    n_new = 8
    want = hf_greedy_tokens(tiny, prompt, n_new)
    for hip_graph in (False, True):
        prog = mgx_graph.compile(str(tiny.onnx_path), target=target, hip_graph=hip_graph)
        res = generate(Decoder(prog), prompt, n_new, tiny.config["eos_token_ids"])
        assert res.tokens == want, (hip_graph, res.tokens, want)
        prog.release()


def test_decoder_rejects_unbound_state(tiny):
    prog = mgx_graph.compile(str(tiny.onnx_path), target="ref", alias=None)
    with pytest.raises(mgx_graph.MgxError, match="not bound in place"):
        Decoder(prog)


def test_decoders_bind_their_cache_as_state(tiny, target):
    """A static step gets its cache bound once (bind_state): each step passes the two step inputs and
    repeats through the fast path.  Two Decoders of one program, stepped in turns, each rebind their own
    cache, so each matches onnxruntime fed its own cache; reset() clears the bound memory."""
    prog = mgx_graph.compile(str(tiny.onnx_path), target=target, hip_graph=True)
    decs = [Decoder(prog), Decoder(prog)]
    for d in decs:
        assert set(d.step_params) == {"input_ids", "cache_position"}
        assert set(d.params) == set(prog.get_parameter_names())
    sess = _ort_session(tiny)
    names = [o.name for o in sess.get_outputs()]
    feeds = [{i.name: np.zeros(i.shape, np.float32) for i in sess.get_inputs() if i.name.startswith("past")}
             for _ in decs]
    tokens = ([3, 17, 42, 5, 99, 8], [250, 7, 1, 64, 12, 30, 4, 5, 6])

    def step(k, pos):
        d, t = decs[k], tokens[k][pos]
        d.step(t)
        feeds[k].update(input_ids=np.array([[t]], np.int64), cache_position=np.array([pos], np.int64))
        outs = sess.run(None, feeds[k])
        np.testing.assert_allclose(prog.context.to_host(d.last_logits, prog.queue), outs[0], rtol=1e-4,
                                   atol=1e-4, err_msg=f"decoder {k} step {pos}")
        for n, v in zip(names[1:], outs[1:]):
            feeds[k][tiny.alias[n]] = v

    for pos in range(len(tokens[0])):
        step(0, pos)
        step(1, pos)
    assert prog.stats()["fast_path_hits"] == 0  # each turn bound the other cache: never the same call
    for pos in range(len(tokens[0]), len(tokens[1])):
        step(1, pos)
    assert prog.stats()["fast_path_hits"] == 3  # decoder 1 made the last call of the turns too
    for k, d in enumerate(decs):
        for n, v in d.cache().items():
            np.testing.assert_allclose(v, feeds[k][n], rtol=1e-4, atol=1e-5, err_msg=f"decoder {k} {n}")
    decs[1].reset()
    assert all(not np.any(v) for v in decs[1].cache().values())
    assert any(np.any(v) for v in decs[0].cache().values())
    prog.release()


def test_a_decoder_step_in_another_thread_never_runs_on_the_other_cache(tiny, target, monkeypatch):
    """Two Decoders of one program in two threads: the rebind of a Decoder's cache and its run are one
    step under the program's lock, so a bind by the other Decoder in between waits for that run (else
    the step would read and write the other cache).  Both match onnxruntime fed their own cache."""
    import threading

    prog = mgx_graph.compile(str(tiny.onnx_path), target=target, hip_graph=False)
    a, b = Decoder(prog), Decoder(prog)
    sess = _ort_session(tiny)
    names = [o.name for o in sess.get_outputs()]
    feeds = {d: {i.name: np.zeros(i.shape, np.float32) for i in sess.get_inputs() if i.name.startswith("past")}
             for d in (a, b)}

    def want(d, t, pos):
        feeds[d].update(input_ids=np.array([[t]], np.int64), cache_position=np.array([pos], np.int64))
        outs = sess.run(None, feeds[d])
        for n, v in zip(names[1:], outs[1:]):
            feeds[d][tiny.alias[n]] = v
        return outs[0]

    def check(d, t, pos, got=None):
        got = prog.context.to_host(d.last_logits, prog.queue) if got is None else got
        np.testing.assert_allclose(got, want(d, t, pos), rtol=1e-4, atol=1e-4)

    a.step(3)
    check(a, 3, 0)
    run_async, ready, go, logits_a = prog.executor.run_async, threading.Event(), threading.Event(), []

    def held(params, queue=None, copy=False):  # decoder a's run waits here, after its cache was bound
        if threading.current_thread() is not thread_a:
            return run_async(params, queue, copy)
        ready.set()
        go.wait()
        outs = run_async(params, queue, copy)
        logits_a.append(prog.context.to_host(outs[a.logits_index], queue or prog.queue))  # before b's run
        return outs

    monkeypatch.setattr(prog.executor, "run_async", held)
    thread_a = threading.Thread(target=a.step, args=(17,))
    thread_b = threading.Thread(target=b.step, args=(250,))
    thread_a.start()
    assert ready.wait(60)
    thread_b.start()
    thread_b.join(2)  # unlocked, b binds its cache (and runs) while a's run waits
    go.set()
    thread_a.join()
    thread_b.join()
    prog.context.synchronize(prog.queue)
    check(a, 17, 1, logits_a[0])
    check(b, 250, 0)
    for d in (a, b):
        for n, v in d.cache().items():
            np.testing.assert_allclose(v, feeds[d][n], rtol=1e-4, atol=1e-5, err_msg=n)
    prog.release()


@pytest.mark.parametrize("hip_graph", [False, True], ids=["eager", "graph"])
def test_a_released_step_is_an_error_before_any_write(tiny, target, hip_graph, monkeypatch):
    """Once the program is released (by the decoder or another owner), every entry point of a Decoder over it
    raises MgxError naming the release before it writes or reads the step's arrays, which are views of freed
    memory (on a device, a host copy into one was a crash of the process)."""
    from mgx_graph.errors import MgxError

    from mgx_graph.llm.sampling import SamplingConfig, TokenSampler

    prog = mgx_graph.compile(str(tiny.onnx_path), target=target, hip_graph=hip_graph)
    dec, other = Decoder(prog), Decoder(prog)
    dec.step(3)
    made_before = other.greedy_tokens(5, 3)  # a generator made before the release, started after it
    prog.release()
    assert prog.released
    touched = []
    for name in ("copy_from_host", "to_host", "synchronize"):
        monkeypatch.setattr(prog.context, name, lambda *a, name=name, **k: touched.append(name))
    host = target == "ref"  # the step's arrays are numpy there: unchanged means no write (fill) reached them
    both = {f"{k}:{n}": a for k, d in enumerate((dec, other)) for n, a in d.params.items()}
    before = {n: np.array(a, copy=True) for n, a in both.items()} if host else {}
    calls = [lambda d: d.step(5), lambda d: d.feed(np.array([5])), lambda d: d.prefill_tokens([1, 2]),
             lambda d: d.greedy_next(), lambda d: d.logits_rows(), lambda d: d.cache(), lambda d: d.reset(),
             lambda d: list(d.greedy_tokens(5, 3)),
             lambda d: d.sample_next(TokenSampler(SamplingConfig(do_sample=True, seed=0), 1, d.vocab_size))]
    for d in (dec, other):
        for k, call in enumerate(calls):
            with pytest.raises(MgxError, match="released"):
                call(d)
            assert not touched, (k, touched)
    with pytest.raises(MgxError, match="released"):
        next(made_before)
    assert not touched, touched
    for n, a in before.items():
        np.testing.assert_array_equal(both[n], a, err_msg=n)
    dec.release()  # twice is fine
