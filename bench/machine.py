"""Details of the machine a benchmark ran on (written next to every result)."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess


def machine_info(ctx=None) -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": _cpu(),
        "cpu_count": os.cpu_count(),
    }
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        if out:
            info["gpu"] = out
    except Exception:
        pass
    for mod in ("numpy", "onnx", "cupy", "torch", "transformers", "nvmath", "onnxruntime", "matplotlib"):
        try:
            info[f"{mod}_version"] = __import__(mod).__version__
        except Exception:
            pass
    try:
        import onnxruntime

        info["onnxruntime_providers"] = list(onnxruntime.get_available_providers())
    except Exception:
        pass
    try:
        import mgx_graph

        info["mgx_graph_version"] = mgx_graph.__version__
    except Exception:
        pass
    if ctx is not None:
        info["context"] = ctx.describe()
    return info


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
