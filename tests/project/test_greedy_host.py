"""bench/greedy_host.py without a model: its flags, the settings a target refuses (with the reason) and
the summary of the timed passes, on stand-in runners; and one smoke run on ``ref`` with the tiny W1."""
import json
import os
import sys
import types

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")
sys.path.insert(0, BENCH)

import greedy_host  # noqa: E402


def _runner(platform, reader):
    """A stand-in :class:`peer_systems.MgxStep`: ``dec.ctx.runtime.platform`` and ``dec._id_reader()``."""
    ctx = types.SimpleNamespace(runtime=types.SimpleNamespace(platform=platform))
    return types.SimpleNamespace(dec=types.SimpleNamespace(ctx=ctx, _id_reader=lambda: reader))


def test_tokens_default_to_what_the_tiny_cache_holds_and_bad_flags_exit():
    assert greedy_host.parse_args([]).tokens == greedy_host.TOKENS
    assert greedy_host.parse_args(["--tiny"]).tokens == greedy_host.TINY_TOKENS
    assert greedy_host.parse_args(["--tiny", "--tokens", "3"]).tokens == 3
    assert greedy_host.parse_args(["--settings", "poll,,nogc"]).settings == ["poll", "nogc"]
    for argv in (["--settings", "bogus"], ["--settings", ""], ["--settings", ","], ["--tokens", "0"],
                 ["--reps", "0"], ["--target", "cpu"]):
        with pytest.raises(SystemExit) as e:
            greedy_host.parse_args(argv)
        assert e.value.code == 2, argv


def test_ref_refuses_the_cuda_policies_and_poll_with_a_reason():
    from mgx_graph.llm.decoder_pipeline import _CopyReader

    ref = _runner("host", _CopyReader(None))
    for name in ("spin", "yield", "blocking"):
        assert "CUDA runtime" in greedy_host.refusal(name, ref) and "'host'" in greedy_host.refusal(name, ref)
    assert "copy" in greedy_host.refusal("poll", ref)
    for name in ("default", "pinned", "nogc"):
        assert greedy_host.refusal(name, ref) is None
    hip = _runner("hip", types.SimpleNamespace(poll=False))
    assert greedy_host.refusal("spin", hip) and greedy_host.refusal("poll", hip) is None
    cuda = _runner("cuda", types.SimpleNamespace(poll=False))
    assert all(greedy_host.refusal(n, cuda) is None for n in greedy_host.SETTINGS)


def test_poll_setting_turns_the_reader_s_poll_on_and_back():
    reader = types.SimpleNamespace(poll=False)
    with greedy_host.setting("poll", _runner("cuda", reader)):
        assert reader.poll is True
    assert reader.poll is False


def test_time_settings_summarizes_refused_failed_and_partly_failed_settings(monkeypatch):
    from mgx_graph.llm.decoder_pipeline import _CopyReader

    calls = []

    def measure(runner, prompt, tokens):
        calls.append(tokens)
        if len(calls) == 2:  # nogc's first rep
            raise RuntimeError("boom")
        return {"ms_per_token": 1.0 + len(calls), "host_us_per_token": 10.0, "first_tokens": [1, 2]}

    monkeypatch.setattr(greedy_host.ps, "measure", measure)
    args = types.SimpleNamespace(settings=["default", "poll", "nogc"], reps=2, tokens=3)
    got = greedy_host.time_settings(_runner("host", _CopyReader(None)), [0], args)
    assert list(got) == ["default", "poll", "nogc"] and calls == [3, 3, 3, 3]
    assert got["default"]["ms_per_token"] == 3.0 and got["default"]["same_tokens"] is True  # (2 + 4) / 2
    assert "errors" not in got["default"] and len(got["default"]["reps"]) == 2
    assert got["poll"] == {"error": greedy_host.refusal("poll", _runner("host", _CopyReader(None)))}
    assert got["nogc"]["errors"] == ["rep 0: RuntimeError: boom"] and len(got["nogc"]["reps"]) == 1


@pytest.mark.slow
def test_a_ref_smoke_run_times_what_it_can_and_names_what_it_refuses(tmp_path, model_cache, monkeypatch, capsys):
    pytest.importorskip("torch")  # the tiny W1 is exported from transformers
    pytest.importorskip("transformers")
    monkeypatch.setenv("MGX_GRAPH_CACHE", model_cache)
    # ref runs the float16 step in numpy (~0.1 s): the chat prompt (37 ids, fed one by one in each of the
    # three passes) is cut to its first 3 ids and the back-to-back timing to 3 runs; the script's path is
    # the same
    prompt_ids, b2b = greedy_host.pm.prompt_ids, greedy_host.back_to_back_us
    monkeypatch.setattr(greedy_host.pm, "prompt_ids", lambda work, info: prompt_ids(work, info)[:3])
    monkeypatch.setattr(greedy_host, "back_to_back_us", lambda runner: b2b(runner, calls=3))
    out = tmp_path / "gh.json"
    rc = greedy_host.main(["--target", "ref", "--tiny", "--tokens", "1", "--reps", "1",
                           "--settings", "default,spin,poll,nogc", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    s = doc["settings"]
    assert list(s) == ["default", "spin", "poll", "nogc"] and doc["tokens"] == 1
    assert s["default"]["same_tokens"] and s["nogc"]["same_tokens"] and s["nogc"]["ms_per_token"] > 0
    assert "CUDA runtime" in s["spin"]["error"] and "copy" in s["poll"]["error"]
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed[:4]] == ["default", "spin", "poll", "nogc"]
    assert printed[-1].startswith("back to back:")
