"""``mgx_graph.serve.ray_app``: replicas of ``mgx-graph serve`` as a Ray Serve deployment, on a 2-layer SmolLM2
onnxruntime-genai folder (ref). The app a replica builds answers as ``mgx-graph serve`` does (greedy text equal
to onnxruntime-genai's); with Ray installed, two replicas behind Ray Serve's proxy answer the same. The tests
that need Ray skip without it (the ``ray`` extra)."""
from __future__ import annotations

import importlib.util
import socket

import pytest

og = pytest.importorskip("onnxruntime_genai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from mgx_graph.errors import ParameterError  # noqa: E402
from mgx_graph.serve import ray_app  # noqa: E402

NAME = "tiny"
FLAGS = f"--target ref --max-rows 2 --max-length 64 --served-model-name {NAME}"
PROMPTS = ["The capital of France is", "Water boils at", "One, two, three,"]
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (the ray extra)")


@pytest.fixture(scope="module")
def folder():
    from mgx_graph.models import build

    return str(build("smollm2-genai", progress=False, num_layers=2).directory)


@pytest.fixture(scope="module")
def greedy(folder):
    """``greedy(prompt, n)``: the text of onnxruntime-genai's greedy decode of the prompt's tokens (CPU)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = og.Model(folder)

    def run(prompt: str, n: int) -> str:
        ids = tok(prompt)["input_ids"]
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + n, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens([ids])
        out = []
        while not gen.is_done():
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return tok.decode(out, skip_special_tokens=True)
    return run


def completion(post, prompt: str, n: int = 6) -> str:
    r = post("/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": n, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_flags_are_mgx_graph_serve_flags_checked_before_anything_is_deployed(folder):
    args = ray_app.serve_args(folder, FLAGS)
    assert (args.model, args.target, args.max_rows, args.max_length, args.served_model_name) == \
        (folder, "ref", 2, 64, NAME)
    assert ray_app.serve_args(folder, ["--max-rows", "3"]).max_rows == 3  # a list of words too
    with pytest.raises(ParameterError, match=r"--max-rows: expected an int >= 1, got '0'"):
        ray_app.serve_args(folder, "--max-rows 0")
    with pytest.raises(ParameterError, match=r"unrecognized arguments: --replicas"):
        ray_app.serve_args(folder, "--replicas 2")


def test_the_app_a_replica_builds_answers_as_onnxruntime_genai(folder, greedy):
    """What Ray Serve calls in each replica, run here with FastAPI's test client (its lifespan included)."""
    from fastapi.testclient import TestClient

    build = ray_app.asgi_app_builder(ray_app.serve_args(folder, FLAGS))
    with TestClient(build()) as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [NAME]
        for p in PROMPTS:
            assert completion(client.post, p) == greedy(p, 6)
        assert client.get("/health").json() == {"status": "ok"}


@needs_ray
def test_app_builder_arguments():
    with pytest.raises(ParameterError, match="model=FOLDER is required"):
        ray_app.app_builder({"num_replicas": "2"})
    with pytest.raises(ParameterError, match=r"unknown arguments \['replicas'\]"):
        ray_app.app_builder({"model": ".", "replicas": "2"})
    with pytest.raises(ParameterError, match="num_replicas: expected an int >= 1"):
        ray_app.app_builder({"model": ".", "num_replicas": "0"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_ray
@pytest.mark.slow
def test_two_replicas_behind_ray_serve_answer_as_onnxruntime_genai(folder, greedy):
    import ray
    from ray import serve

    port = _free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = ray_app.deployment(folder, FLAGS, num_replicas=2, ray_actor_options={"num_cpus": 0.5})
        serve.run(app, name="mgx", route_prefix="/")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
            assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [NAME]
            for p in PROMPTS * 2:  # spread over both replicas
                assert completion(client.post, p) == greedy(p, 6)
        status = serve.status().applications["mgx"]
        assert status.status == "RUNNING"
        assert sum(d.replica_states.get("RUNNING", 0) for d in status.deployments.values()) == 2
    finally:
        serve.shutdown()
        ray.shutdown()
