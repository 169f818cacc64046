"""``mgx-graph serve`` while it shuts down: once the engine stops accepting requests (SIGTERM drains it),
``/health`` and every new request get the OpenAI API's JSON error (503, type ``service_unavailable``, code
``shutting_down``) before their body is read or their prompt tokenized, ``/stats`` still answers, and an
error no handler expects is the API's JSON 500, never a plain-text page.

The server is the real app on uvicorn in a thread of this process (as in test_serve.py), over a stub engine
and tokenizer: what is checked is the HTTP layer, not generation (test_serve.py checks that against
onnxruntime-genai)."""
from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

NAME = "stub"
BODY = {"model": NAME, "prompt": "Hello", "max_tokens": 2}


class StubTokenizer:
    def get_vocab(self):
        return {"a": 0, "b": 1}


class StubLLM:
    """What :class:`~mgx_graph.serve.app.Service` reads of an LLM; counts the prompts it tokenizes."""

    def __init__(self):
        self.tokenizer, self.encoded, self.fail = StubTokenizer(), [], None

    def encode(self, text):
        if self.fail is not None:
            raise self.fail
        self.encoded.append(text)
        return [1, 2]

    def chat_ids(self, messages):
        return self.encode(messages[-1]["content"])


class StubEngine:
    """The engine's interface as the app uses it: a request is answered "ok" at once (finish "length")."""

    max_length = 64

    def __init__(self):
        self.accepting, self._thread, self.stopped = True, None, False

    def start(self):
        self._thread = threading.current_thread()
        return self

    def drain(self):
        self.accepting = False

    def stop(self, cancel=True, timeout=None):
        self.accepting, self.stopped = False, True

    def stats(self):
        return {"accepting": self.accepting, "rows_busy": 0}

    def submit(self, req):
        from mgx_graph.serve.scheduler import ShuttingDown

        if not self.accepting:
            raise ShuttingDown("the server is shutting down")
        req.tokens, req.text, req.finish_reason = [7] * req.max_new, "ok", "length"
        req.on_event("text", "ok")
        req.on_event("done", req)
        return req


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    """``(base url, service, uvicorn server)`` of the app over the stubs, running in a thread."""
    from mgx_graph.serve.app import Service
    from mgx_graph.serve.server import make_server

    service = Service(StubLLM(), StubEngine(), NAME, max_tokens=8, timeout=None)
    port = free_port()
    srv = make_server(service, "127.0.0.1", port, grace=5, log_level="critical")
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert th.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", service, srv
    srv.should_exit = True
    th.join(30)
    assert not th.is_alive() and service.engine.stopped


def assert_shutting_down(r):
    assert r.status_code == 503, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    err = body["error"]
    assert err["type"] == "service_unavailable" and err["code"] == "shutting_down" and err["param"] is None, body
    assert "shutting down" in err["message"], body
    return body


def test_health_and_new_requests_get_the_json_503_while_shutting_down(server):
    url, service, _ = server
    assert httpx.get(f"{url}/health", timeout=30).json() == {"status": "ok"}
    r = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok", r.text
    service.engine.drain()
    assert assert_shutting_down(httpx.get(f"{url}/health", timeout=30))["status"] == "shutting_down"
    tokenized = list(service.llm.encoded)
    requests = [("POST", "/v1/completions", BODY),
                ("POST", "/v1/completions", dict(BODY, stream=True)),
                ("POST", "/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "Hi"}]}),
                ("POST", "/v1/chat/completions", {"not": "a valid body"}),  # refused before it is read
                ("GET", "/v1/models", None)]
    for method, path, body in requests:
        assert_shutting_down(httpx.request(method, url + path, json=body, timeout=30))
    assert service.llm.encoded == tokenized  # no prompt was tokenized once draining
    r = httpx.get(f"{url}/stats", timeout=30)
    assert r.status_code == 200 and r.json()["accepting"] is False


def test_sigterm_drains_before_the_server_closes(server):
    """SIGTERM's handler drains the engine first: a request the loop still takes gets the JSON 503."""
    url, service, srv = server
    with httpx.Client(timeout=30) as client:  # one kept-alive connection
        assert client.get(f"{url}/health").status_code == 200
        srv.handle_exit(signal.SIGTERM, None)
        assert not service.engine.accepting
    deadline = time.monotonic() + 30
    while True:  # until uvicorn closes its socket, every answer is the JSON 503
        try:
            assert_shutting_down(httpx.post(f"{url}/v1/completions", json=BODY, timeout=5))
        except httpx.TransportError:
            break
        assert time.monotonic() < deadline, "the server did not close"
        time.sleep(0.05)


def test_an_unexpected_error_is_the_apis_json_500(server):
    url, service, _ = server
    service.llm.fail = RuntimeError("tokenizer exploded")
    r = httpx.post(f"{url}/v1/completions", json=BODY, timeout=30)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
    assert "RuntimeError" in r.json()["error"]["message"], r.text
    service.llm.fail = None
    assert httpx.post(f"{url}/v1/completions", json=BODY, timeout=30).status_code == 200


def test_openai_client_sees_the_shutting_down_code(server):
    openai = pytest.importorskip("openai")
    url, service, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)
    service.engine.drain()
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=NAME, prompt="Hi", max_tokens=1)
    assert e.value.status_code == 503 and e.value.code == "shutting_down", e.value
