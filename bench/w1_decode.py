"""W1: SmolLM2-135M-Instruct decode, batch 1, KV cache 256, on the GPU: eager vs graph_launch.

For fp16 and fp32 it compiles the decode step twice (graphs off / on) in one process and runs the same
token sequence through each: the chat-templated prompt (prefill, one token per step) followed by
greedy decoding for ``--tokens`` steps (end-of-sequence ignored so every run times the same number
of steps).  Per step it records the wall time (host enqueue + device + the argmax read-back), the
host time spent enqueueing the program, and the device time of the program (events on the queue).
Reported: median ms/token and tokens/s, launches per token, host us per replay, and the ratios
eager/graph, all from the same run.  ``--torch`` adds transformers' own eager decode on the same GPU.

    python bench/w1_decode.py --out bench/results/w1_h200.json [--tokens 128] [--torch]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402

import mgx_graph  # noqa: E402
from mgx_graph.llm.generation import Decoder  # noqa: E402

PROMPT = "What is the capital of France?"


def run_config(info, prompt_ids, fp16: bool, hip_graph: bool, tokens: int, skip: int, target: str = "gpu") -> dict:
    t0 = time.perf_counter()
    prog = mgx_graph.compile(str(info.onnx_path), target=target, hip_graph=hip_graph, fp16=fp16)
    compile_s = time.perf_counter() - t0
    dec = Decoder(prog)
    rt, q, xp = prog.context.runtime, prog.queue, prog.context.xp
    ev0, ev1 = rt.hipEventCreate(), rt.hipEventCreate()
    walls, hosts, devs, seq = [], [], [], []
    tok = prompt_ids[0]
    feed = list(prompt_ids[1:])
    with prog.context.on_queue(q):
        for step in range(len(prompt_ids) + tokens - 1):
            p = dec.params
            w0 = time.perf_counter()
            p["input_ids"].fill(int(tok))
            p["cache_position"].fill(dec.position)
            rt.hipEventRecord(ev0, q)
            h0 = time.perf_counter()
            outs = prog.run_async(p, q)
            h1 = time.perf_counter()
            rt.hipEventRecord(ev1, q)
            nxt = int(xp.argmax(outs[dec.logits_index].reshape(-1)))
            w1 = time.perf_counter()
            rt.hipEventSynchronize(ev1)
            dec.position += 1
            walls.append(w1 - w0)
            hosts.append(h1 - h0)
            devs.append(rt.hipEventElapsedTime(ev0, ev1) * 1e-3)
            generated = not feed  # this step fed the last prompt token or a generated one
            tok = feed.pop(0) if feed else nxt
            if generated:
                seq.append(nxt)
    st = prog.stats()
    prog.release()
    sl = slice(skip, None)
    med = lambda v: statistics.median(v[sl]) * 1e3  # noqa: E731
    ms = med(walls)
    return {"fp16": fp16, "hip_graph": hip_graph, "steps": len(walls), "timed_steps": len(walls[sl]),
            "compile_s": round(compile_s, 2), "ms_per_token": round(ms, 4), "tokens_per_s": round(1e3 / ms, 1),
            "ms_per_token_mean": round(statistics.fmean(walls[sl]) * 1e3, 4),
            "device_ms_per_step": round(med(devs), 4), "host_us_per_run_async": round(med(hosts) * 1e3, 1),
            "launches_per_token_program": st["launches_per_run"],
            "launches_per_token_total": st["launches_per_run"] + 3,
            "launches_per_run_eager": st["launches_per_run_eager"],
            "captures": st["captures"], "replays": st["replays"], "fallbacks": st["fallbacks"],
            "graph_nodes": [r["graph_nodes"] for r in st["regions"]],
            "first_tokens": seq[:12]}


def torch_baseline(info, prompt_ids, fp16: bool, tokens: int, skip: int) -> dict:
    import torch
    from mgx_graph.models.oracle import load_torch_model

    model = load_torch_model(info).to("cuda", dtype=torch.float16 if fp16 else torch.float32).eval()
    from transformers import DynamicCache

    walls = []
    with torch.no_grad():
        cache = DynamicCache()
        ids = torch.tensor([prompt_ids], device="cuda")
        for i in range(ids.shape[1] - 1):  # same prefill as mgx_graph: one token per step
            model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True)
        tok = ids[:, -1:]
        for _ in range(tokens):
            w0 = time.perf_counter()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            int(tok)
            walls.append(time.perf_counter() - w0)
    ms = statistics.median(walls[skip:]) * 1e3
    del model
    torch.cuda.empty_cache()
    return {"fp16": fp16, "framework": f"torch {torch.__version__} eager (transformers, DynamicCache)",
            "ms_per_token": round(ms, 4), "tokens_per_s": round(1e3 / ms, 1), "timed_steps": len(walls[skip:])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--skip", type=int, default=8, help="steps left out of the statistics (warmup, capture)")
    ap.add_argument("--torch", action="store_true", help="also time transformers' eager decode")
    ap.add_argument("--target", default="gpu", help="gpu (default); ref only to check the script on a CPU")
    ap.add_argument("--fp32-only", action="store_true")
    args = ap.parse_args(argv)
    from mgx_graph.models import build
    from mgx_graph.models.oracle import chat_prompt_ids

    if args.target == "gpu" and not mgx_graph.gpu_available():
        print("w1_decode: no usable GPU", file=sys.stderr)
        return 2
    info = build("smollm2", max_cache_len=256)
    ids = chat_prompt_ids(info, PROMPT)
    results = {"workload": "W1: SmolLM2-135M-Instruct decode, batch 1, KV cache 256", "prompt": PROMPT,
               "prompt_tokens": len(ids), "generated_steps": args.tokens, "configs": [], "torch": []}
    dtypes = (False,) if args.fp32_only else (True, False)
    for fp16 in dtypes:
        for hip_graph in (False, True):
            r = run_config(info, ids, fp16, hip_graph, args.tokens, args.skip, args.target)
            results["configs"].append(r)
            print(json.dumps(r), flush=True)
        if args.torch:
            t = torch_baseline(info, ids, fp16, args.tokens, args.skip)
            results["torch"].append(t)
            print(json.dumps(t), flush=True)
    ratios = {}
    for fp16 in dtypes:
        name = "fp16" if fp16 else "fp32"
        e = next(c for c in results["configs"] if c["fp16"] == fp16 and not c["hip_graph"])
        g = next(c for c in results["configs"] if c["fp16"] == fp16 and c["hip_graph"])
        ratios[name] = {"eager_over_graph_ms_per_token": round(e["ms_per_token"] / g["ms_per_token"], 2),
                        "graph_ms_is_at_most_a_fifth_of_eager": g["ms_per_token"] * 5 <= e["ms_per_token"],
                        "same_tokens_eager_and_graph": e["first_tokens"] == g["first_tokens"]}
        t = next((t for t in results["torch"] if t["fp16"] == fp16), None)
        if t:
            ratios[name]["torch_over_graph_ms_per_token"] = round(t["ms_per_token"] / g["ms_per_token"], 2)
            ratios[name]["torch_over_eager_ms_per_token"] = round(t["ms_per_token"] / e["ms_per_token"], 2)
    results["ratios"] = ratios
    results["target"] = args.target
    results["machine"] = machine_info()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    try:
        from plot_w1 import plot

        print("plot:", plot(args.out))
    except ImportError:
        print("plot: matplotlib is not installed; run bench/plot_w1.py where it is", file=sys.stderr)
    print(json.dumps(ratios, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
