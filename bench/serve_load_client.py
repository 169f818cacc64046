"""The two sides of ``bench/serve_load.py``: concurrent streaming clients of an OpenAI-compatible server
(httpx on asyncio) and onnxruntime-genai's batch generation at the same batch size, each summarized as one
cell.

A client request is ``POST /v1/completions`` with the prompt as token ids, ``temperature`` 0, ``stream`` and
``stream_options.include_usage``. Per request: TTFT (sending it to the first chunk with text), the gaps
between its chunks with text (ITL), its output tokens (the ``usage`` of the last chunk), its end-to-end time
and finish reason. TPOT is ``(e2e - TTFT) / (tokens - 1)``. A chunk carries the text of one token or more
(the server holds text back until it is settled: a token that only adds whitespace comes with the next one),
so ITL is measured between chunks, as vLLM's ``benchmark_serving`` does.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import numpy as np

ERRORS_KEPT = 5


class ClientsFailed(RuntimeError):
    """A client process did not start or did not hand its records back."""


def spread(values) -> dict:
    """``{"p50", "p99", "mean", "n"}`` of ``values`` in ms (None each when there are none)."""
    v = np.asarray([x for x in values if x is not None], np.float64)
    if not v.size:
        return {"p50": None, "p99": None, "mean": None, "n": 0}
    return {"p50": round(float(np.percentile(v, 50)), 3), "p99": round(float(np.percentile(v, 99)), 3),
            "mean": round(float(v.mean()), 3), "n": int(v.size)}


def _chunk(line: str, rec: dict, t: float) -> bool:
    """Take one SSE line into the request's record; True at ``data: [DONE]``."""
    if not line.startswith("data: "):
        return False
    data = line[6:].strip()
    if data == "[DONE]":
        return True
    obj = json.loads(data)
    if "error" in obj:
        rec["error"] = str(obj["error"].get("message", obj["error"]))[:300]
        return True
    if obj.get("usage"):
        rec["tokens"] = int(obj["usage"]["completion_tokens"])
    for c in obj.get("choices") or []:
        if c.get("text"):
            rec["times"].append(t)
            rec["text"] += c["text"]
        rec["finish"] = c.get("finish_reason") or rec["finish"]
    return False


async def one_request(http, url: str, body: dict) -> dict:
    """Send one streamed completion; its record: ``ttft_s``, ``itl_s``, ``e2e_s``, ``tokens``, ``finish``,
    ``text``, ``error`` (None when it succeeded)."""
    rec: dict = {"times": [], "text": "", "tokens": 0, "finish": None, "error": None}
    t0 = time.perf_counter()
    try:
        async with http.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                rec["error"] = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}"
            else:
                async for line in resp.aiter_lines():
                    if _chunk(line, rec, time.perf_counter()):
                        break
    except Exception as e:  # noqa: BLE001 - a failed request is counted, the run goes on
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    end = time.perf_counter()
    times = rec.pop("times")
    rec["e2e_s"] = end - t0
    rec["ttft_s"] = times[0] - t0 if times else None
    rec["itl_s"] = [b - a for a, b in zip(times, times[1:])]
    rec["start"], rec["end"] = t0, end
    if rec["error"] is None and not rec["tokens"]:
        rec["error"] = "the stream ended without a usage chunk"
    return rec


async def _level(base_url: str, body: dict, clients: int, per_client: int, timeout_s: float) -> list:
    import httpx

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, trust_env=False,
                                 timeout=httpx.Timeout(timeout_s, connect=30.0)) as http:
        async def client() -> list:
            return [await one_request(http, "/v1/completions", body) for _ in range(per_client)]

        done = await asyncio.gather(*[client() for _ in range(clients)])
    return [r for rs in done for r in rs]


def _proc_level(base_url: str, body: dict, clients: int, per_client: int, timeout_s: float, ready, results) -> None:
    """A client process: its clients start once every process is ready (``ready``: a barrier)."""
    ready.wait()
    results.put(asyncio.run(_level(base_url, body, clients, per_client, timeout_s)))


def run_level(base_url: str, model: str, prompt: list, clients: int, per_client: int, max_tokens: int,
              timeout_s: float = 600.0, procs: int = 1) -> list:
    """``clients`` concurrent clients, each sending ``per_client`` requests one after the other, spread over
    ``procs`` processes (each an asyncio loop of its own, so that parsing the streams never holds the clients
    back; their start is synchronized, and ``time.perf_counter`` is one clock for all of them on Linux); the
    requests' records."""
    body = {"model": model, "prompt": [int(t) for t in prompt], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    procs = max(1, min(procs, clients))
    if procs == 1:
        return asyncio.run(_level(base_url, body, clients, per_client, timeout_s))
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")  # no fork of a process that may hold a GPU context
    ready, results = ctx.Barrier(procs + 1), ctx.Queue()
    counts = [clients // procs + (i < clients % procs) for i in range(procs)]
    workers = [ctx.Process(target=_proc_level, args=(base_url, body, n, per_client, timeout_s, ready, results),
                           daemon=True) for n in counts]
    for w in workers:
        w.start()
    recs: list = []
    try:
        ready.wait(timeout=300)
        for _ in workers:
            recs += results.get(timeout=timeout_s * per_client + 300)
    except (queue.Empty, threading.BrokenBarrierError) as e:
        raise ClientsFailed(f"a client process did not answer ({type(e).__name__})") from None
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.terminate()
    return recs


def summarize(recs: list, clients: int) -> dict:
    """One cell of the server side: throughput over the wall time of the level and the latency spreads."""
    ok = [r for r in recs if r["error"] is None]
    wall = max(r["end"] for r in recs) - min(r["start"] for r in recs) if recs else 0.0
    tokens = sum(r["tokens"] for r in ok)
    tpot = [(r["e2e_s"] - r["ttft_s"]) / (r["tokens"] - 1) * 1e3 for r in ok
            if r["ttft_s"] is not None and r["tokens"] > 1]
    return {"clients": clients, "requests": len(recs), "completed": len(ok), "failed": len(recs) - len(ok),
            "errors": [r["error"] for r in recs if r["error"]][:ERRORS_KEPT],
            "output_tokens": tokens, "wall_s": round(wall, 4),
            "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
            "requests_per_s": round(len(ok) / wall, 3) if wall > 0 else None,
            "ttft_ms": spread(r["ttft_s"] * 1e3 for r in ok if r["ttft_s"] is not None),
            "itl_ms": spread(x * 1e3 for r in ok for x in r["itl_s"]),
            "tpot_ms": spread(tpot), "e2e_ms": spread(r["e2e_s"] * 1e3 for r in ok),
            "finish_reasons": dict(Counter(r["finish"] or "none" for r in ok)),
            "first_text": ok[0]["text"] if ok else None}


# -- the peer: onnxruntime-genai's batch generation ---------------------------------------------------------

def og_round(og, model, prompt: list, batch: int, max_length: int, max_tokens: int, search: dict | None = None,
             until_done: bool = False):
    """One batch generation: ``(prefill_s, [step_s], tokens [batch, n], wall_s)``.  ``prompt``: one prompt
    (every row gets it) or ``batch`` prompts of one length; ``search``: the search options besides
    ``max_length`` and ``batch_size`` (default greedy).  A generator that ends before ``max_tokens``
    (its eos id in every row, or ``max_length``) raises RuntimeError, or with ``until_done`` returns the
    ``n`` tokens made so far."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, batch_size=batch, **(search or {"do_sample": False}))
    gen = og.Generator(model, params)
    ids = np.asarray(prompt, np.int32)
    ids = ids.reshape(batch, -1) if ids.ndim == 2 else np.tile(ids[None, :], (batch, 1))
    t0 = time.perf_counter()
    gen.append_tokens(ids)
    gen.generate_next_token()  # the prompt's logits give the first token
    out = [np.asarray(gen.get_next_tokens()).reshape(batch)]
    t1 = time.perf_counter()
    steps = []
    for _ in range(max_tokens - 1):
        if gen.is_done():
            if until_done:
                break
            raise RuntimeError(f"onnxruntime-genai ended the batch after {len(out)} tokens (its eos id or "
                               f"max_length {max_length})")
        s = time.perf_counter()
        gen.generate_next_token()
        out.append(np.asarray(gen.get_next_tokens()).reshape(batch))
        steps.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    return t1 - t0, steps, np.stack(out, axis=1), wall


def og_batch(model, prompt: list, batch: int, rounds: int, max_length: int, max_tokens: int,
             warm: bool = True) -> dict:
    """onnxruntime-genai's greedy batch generation of ``batch`` copies of ``prompt`` (``model``: an
    ``og.Model``), ``rounds`` times after a warm one: tokens/s over the rounds' wall time (prefill included,
    as the clients see it), per-step ms and prefill ms; ``tokens``: row 0 of the first round."""
    import onnxruntime_genai as og

    if warm:
        og_round(og, model, prompt, batch, max_length, min(max_tokens, 8))
    prefill, steps, walls, first = [], [], [], None
    for _ in range(rounds):
        p, s, toks, w = og_round(og, model, prompt, batch, max_length, max_tokens)
        prefill.append(p * 1e3)
        steps += [x * 1e3 for x in s]
        walls.append(w)
        first = toks[0].tolist() if first is None else first
    total = batch * max_tokens * rounds
    return {"batch": batch, "rounds": rounds, "output_tokens": total, "wall_s": round(sum(walls), 4),
            "output_tokens_per_s": round(total / sum(walls), 2), "step_ms": spread(steps),
            "prefill_ms": spread(prefill), "tokens": [int(t) for t in first]}
