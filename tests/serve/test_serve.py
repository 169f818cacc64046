"""``mgx-graph serve`` on a 2-layer SmolLM2 onnxruntime-genai folder (ref), driven by the real ``openai``
client: chat and completions, streamed and not, 16 concurrent streams against the same requests sent alone
and onnxruntime-genai's greedy decode, errors, a client that goes away, SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

og = pytest.importorskip("onnxruntime_genai")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

ROWS, MAX_LENGTH, NAME = 4, 64, "tiny"
PROMPTS = ["Hello", "The capital of France is", "One, two, three,", "Why is the sky blue?", "a b c d e f g",
           "Write a poem about the sea", "2 + 2 =", "My name is", "def add(a, b):", "The quick brown fox",
           "Paris is a city in", "Once upon a time, there was", "Water boils at", "I like to eat",
           "Translate to French: cat", "The best way to learn is"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def folder():
    from mgx_graph.models import build

    return str(build("smollm2-genai", progress=False, num_layers=2).directory)


@pytest.fixture(scope="module")
def server(folder):
    """A server in a thread of this process: ``(base url, service)``."""
    from mgx_graph.serve.server import build_service, make_server

    args = argparse.Namespace(model=folder, target="ref", max_length=MAX_LENGTH, max_rows=ROWS, hip_graph=False,
                              fp16=False, max_queue=32, served_model_name=NAME, max_tokens=None, timeout=None)
    service = build_service(args)
    port = free_port()
    srv = make_server(service, "127.0.0.1", port, grace=5, log_level="warning")
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 120
    while not srv.started:
        assert th.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", service
    srv.should_exit = True
    th.join(60)
    assert service.engine.stats()["rows_busy"] == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def tok(server):
    return server[1].llm.tokenizer


@pytest.fixture(scope="module")
def og_text(folder, tok):
    """``og_text(prompt ids, max_new)``: the text of onnxruntime-genai's greedy decode (its generator, CPU)."""
    from genai_oracle import og_greedy

    model = og.Model(folder)

    def run(ids, max_new):
        out = og_greedy(model, list(ids), max_new)
        return tok.decode(out, skip_special_tokens=True), len(out)
    return run


def chat_ids(tok, messages):
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def stream_completion(client, prompt: str, max_tokens: int):
    """``(text, finish_reason, usage)`` of a streamed greedy completion."""
    pieces, finish, usage = [], None, None
    for ch in client.completions.create(model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                        stream_options={"include_usage": True}):
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            pieces.append(c.text)
            finish = c.finish_reason or finish
    return "".join(pieces), finish, usage


def test_models_lists_the_served_name(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [NAME]


def test_chat_matches_onnxruntime_genai(client, tok, og_text):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name a fruit."}]
    ids = chat_ids(tok, messages)
    want, n = og_text(ids, 5)
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=5, temperature=0)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), n, len(ids) + n)
    pieces, finish = [], None
    for ch in client.chat.completions.create(model=NAME, messages=messages, max_tokens=5, temperature=0, stream=True):
        for c in ch.choices:
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(pieces) == want and finish == r.choices[0].finish_reason


def test_completion_streamed_and_not(client, tok, og_text):
    prompt = "The capital of France is"
    ids = tok(prompt)["input_ids"]
    want, n = og_text(ids, 6)
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0)
    assert r.choices[0].text == want and r.usage.completion_tokens == n and r.usage.prompt_tokens == len(ids)
    text, finish, usage = stream_completion(client, prompt, 6)
    assert text == want and finish == r.choices[0].finish_reason and usage.completion_tokens == n


def test_completion_of_several_prompts_and_token_ids(client, tok, og_text):
    """A list of prompts: one choice each, in order; a prompt of token ids is taken as it is."""
    prompts = ["Hello", "Water boils at"]
    r = client.completions.create(model=NAME, prompt=prompts, max_tokens=3, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    for c, p in zip(r.choices, prompts):
        assert c.text == og_text(tok(p)["input_ids"], 3)[0]
    by_ids = client.completions.create(model=NAME, prompt=tok(prompts[1])["input_ids"], max_tokens=3, temperature=0)
    assert by_ids.choices[0].text == r.choices[1].text
    several = client.completions.create(model=NAME, prompt=[tok(p)["input_ids"] for p in prompts], max_tokens=3,
                                        temperature=0)  # a list of token-id lists, as the OpenAI API takes
    assert [c.text for c in several.choices] == [c.text for c in r.choices]


def test_timeout_is_504(server):
    """A request past --timeout ends with the API's 504 error (its own service on the running engine)."""
    from mgx_graph.serve.app import Service, create_app

    svc = server[1]
    app = create_app(Service(svc.llm, svc.engine, NAME, max_tokens=8, timeout=1e-9))

    async def post():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.post("/v1/completions", json={"model": NAME, "prompt": "Hi", "max_tokens": 2})

    r = asyncio.run(post())
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"


def test_seeded_sampling_repeats(client):
    kw = dict(model=NAME, prompt="Once upon a time", max_tokens=5, temperature=0.9, top_p=0.95, seed=11)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_16_concurrent_streams_equal_each_sent_alone(server, client, tok, og_text):
    """16 streams over 4 rows, each with its own max_tokens so rows free at different steps and waiting
    requests join beside running ones: each text equals the same request sent alone, and onnxruntime-genai's
    greedy decode of it."""
    service = server[1]
    jobs = [(p, 2 + k % 5) for k, p in enumerate(PROMPTS)]
    alone = [stream_completion(client, p, n) for p, n in jobs]
    before = service.engine.stats()["prefills_beside_running"]
    with ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda job: stream_completion(client, *job), jobs))
    assert service.engine.stats()["prefills_beside_running"] > before
    for (p, n), a, t in zip(jobs, alone, together):
        assert t[:2] == a[:2], p
        assert t[2].completion_tokens == a[2].completion_tokens
    for (p, n), a in list(zip(jobs, alone))[:4]:
        assert a[0] == og_text(tok(p)["input_ids"], n)[0], p


@pytest.mark.parametrize("path, body, param", [
    ("chat/completions", {"model": NAME, "messages": []}, "messages"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "temperature": 5},
     "temperature"),
    ("completions", {"model": NAME, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("completions", {"model": NAME, "prompt": "hi", "max_tokens": MAX_LENGTH + 1}, "max_tokens"),
    ("completions", {"model": NAME, "prompt": "hi", "bogus": 1}, "bogus"),
    ("completions", {"model": NAME, "prompt": "hi", "n": 2}, "n"),
    ("completions", {"model": NAME, "prompt": "hi", "stop": [""]}, "stop"),
    ("completions", {"model": NAME, "prompt": "hi", "logprobs": 3}, "logprobs"),
    ("completions", {"prompt": "hi"}, "model"),
    ("completions", {"model": NAME, "prompt": ""}, "prompt"),
    ("completions", {"model": NAME, "prompt": [[1, 2], []]}, "prompt"),
    ("completions", {"model": NAME, "prompt": [[1, 2], "hi"]}, "prompt"),
    ("completions", {"model": NAME, "prompt": "hi", "max_tokens": True}, "max_tokens"),
    ("completions", {"model": NAME, "prompt": "hi", "max_tokens": "3"}, "max_tokens"),
    ("completions", {"model": NAME, "prompt": "hi", "stream": 1}, "stream"),
    ("completions", {"model": NAME, "prompt": "hi", "repetition_penalty": float("inf")}, "repetition_penalty"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "temperature": float("nan")},
     "temperature"),
])
def test_bad_fields_get_a_400_and_the_server_keeps_serving(server, client, path, body, param):
    r = httpx.post(f"{server[0]}/v1/{path}", content=json.dumps(body), headers={"content-type": "application/json"},
                   timeout=60)  # json.dumps writes inf and nan as Infinity and NaN, as Python's json reads them
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and err["message"]
    assert client.completions.create(model=NAME, prompt="Hi", max_tokens=1, temperature=0).choices[0].text is not None


def test_malformed_json_and_a_wrong_method_are_invalid_requests(server):
    url = server[0]
    r = httpx.post(f"{url}/v1/completions", content=b'{"model":', headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] is None and err["type"] == "invalid_request_error"
    assert err["message"].startswith("the body is not valid JSON (at character 9"), err
    r = httpx.get(f"{url}/v1/completions", timeout=60)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error", r.text


def test_openai_client_raises_bad_request_and_not_found(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], top_p=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="another-model", prompt="x", max_tokens=1)


def test_client_gone_mid_stream_frees_its_row(server, client):
    url, service = server
    cancelled = service.engine.stats()["finished"].get("cancelled", 0)
    body = {"model": NAME, "prompt": "Hi", "max_tokens": MAX_LENGTH - 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                break  # one piece read, then the connection closes
    deadline = time.monotonic() + 120
    while service.engine.stats()["finished"].get("cancelled", 0) == cancelled:
        assert time.monotonic() < deadline, service.engine.stats()
        time.sleep(0.1)
    st = service.engine.stats()
    assert st["rows_busy"] == 0 and st["finished"]["cancelled"] == cancelled + 1
    assert client.completions.create(model=NAME, prompt="Hi", max_tokens=2, temperature=0).usage.completion_tokens >= 1


def test_full_queue_is_429_and_shutting_down_503(server):
    """An engine that is not started keeps what it is given queued: one more than --max-queue is a 429;
    after drain() a request is a 503."""
    from mgx_graph.serve.app import Service
    from mgx_graph.serve.protocol import APIError, CompletionRequest
    from mgx_graph.serve.scheduler import Engine

    svc = server[1]
    engine = Engine(svc.llm.runner, svc.llm.tokenizer, svc.llm.eos_token_ids, max_queue=1)  # never started
    idle = Service(svc.llm, engine, NAME, max_tokens=8, timeout=None)
    body = CompletionRequest(model=NAME, prompt="Hi", max_tokens=2)

    async def submit():
        return idle.submit(body, [[1, 2]], asyncio.Queue())

    asyncio.run(submit())
    with pytest.raises(APIError) as full:
        asyncio.run(submit())
    assert full.value.status == 429 and full.value.body()["error"]["code"] == "queue_full"
    engine.drain()
    with pytest.raises(APIError) as down:
        asyncio.run(submit())
    assert down.value.status == 503


def test_sigterm_finishes_the_running_request_and_exits_0(folder, tmp_path):
    port = free_port()
    log = open(tmp_path / "server.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "mgx_graph", "serve", folder, "--target", "ref", "--port", str(port),
                             "--max-rows", "2", "--max-length", str(MAX_LENGTH), "--served-model-name", NAME],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, open(tmp_path / "server.log").read()
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {"model": NAME, "prompt": "Hello", "max_tokens": 6, "temperature": 0, "stream": True}
        finish = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if not finish:
                    proc.send_signal(signal.SIGTERM)  # mid-stream: the request still finishes
                finish.append(chunk["choices"][0]["finish_reason"])
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = open(tmp_path / "server.log").read()
    assert finish[-1] == "length", text
    assert "engine stopped: 0 request(s) cancelled, 0 row(s) busy" in text, text


def test_a_body_over_the_limit_is_413_unread_and_the_server_keeps_serving(server, client):
    url, service = server
    big = json.dumps({"model": NAME, "prompt": "hello " * 3_500_000, "max_tokens": 1}).encode()  # 21 MB
    assert len(big) > 20 << 20 and service.max_body_bytes < len(big)
    for content in (big, iter([big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20)])):  # declared, chunked
        r = httpx.post(f"{url}/v1/completions", content=content, headers={"content-type": "application/json"},
                       timeout=60)
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "request_too_large"
        assert f"at most {service.max_body_bytes} (--max-body-bytes)" in err["message"]
    assert httpx.get(f"{url}/health", timeout=60).status_code == 200
    assert client.completions.create(model=NAME, prompt="Hi", max_tokens=1, temperature=0).usage.completion_tokens == 1


def test_a_prompt_longer_than_the_context_is_refused_untokenized(server, monkeypatch):
    url, service = server
    calls = []
    real = service.llm.encode
    monkeypatch.setattr(service.llm, "encode", lambda p: calls.append(p) or real(p))
    text = "hello " * 200_000  # under the body limit, far over MAX_LENGTH tokens
    for path, body, param in (("completions", {"prompt": text}, "prompt"),
                              ("completions", {"prompt": [1] * 100_000}, "prompt"),
                              ("chat/completions", {"messages": [{"role": "user", "content": text}]}, "messages")):
        r = httpx.post(f"{url}/v1/{path}", json=dict(body, model=NAME, max_tokens=1), timeout=60)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == param, err
    assert calls == []
    r = httpx.post(f"{url}/v1/completions", json={"model": NAME, "prompt": "Hi", "max_tokens": 1}, timeout=60)
    assert r.status_code == 200 and calls == ["Hi"]


def test_tokenizing_does_not_block_the_event_loop(server, monkeypatch):
    """A prompt whose tokenizing is held until /health has answered: /health answers (it would wait forever
    if tokenizing ran on the event loop)."""
    url, service = server
    release, entered = threading.Event(), threading.Event()
    real = service.llm.encode

    def held(prompt):
        entered.set()
        assert release.wait(120)
        return real(prompt)

    monkeypatch.setattr(service.llm, "encode", held)
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(httpx.post, f"{url}/v1/completions", json={"model": NAME, "prompt": "Hi", "max_tokens": 1},
                          timeout=120)
        try:
            assert entered.wait(60)
            assert httpx.get(f"{url}/health", timeout=60).json() == {"status": "ok"}
        finally:
            release.set()
        assert fut.result().status_code == 200
