"""No ``mgx-graph`` command prints a traceback for a bad argument, file or folder.

Every subcommand (read from the argparse parser, so a new one is covered) runs over a table of bad
models (missing file, folder, non-UTF-8 file, garbage .onnx / .mxr, empty file, unknown name, LLM
folders with broken configs) and every numeric flag over bad numbers: the exit status is 1 or 2 and
stderr holds exactly one ``mgx-graph: error:`` line and no traceback.  The real entry point runs in a
few subprocess cases; ``--debug`` / ``MGX_GRAPH_DEBUG=1`` bring the traceback back.  Also perf's
launches per run of a saved program with graphs, against the program's own count of a plain run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import mgx_graph
from mgx_graph.cli import main as cli
from mgx_graph.cli.main import build_parser, main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ERROR = "mgx-graph: error: "


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(rc, err, where) -> str:
    """The one error line of a failed command (asserting the rules of the module docstring)."""
    assert rc in (1, 2), (where, rc, err)
    assert "Traceback" not in err, (where, err)
    lines = [ln for ln in err.splitlines() if ln.startswith(ERROR)]
    others = [ln for ln in err.splitlines() if " error: " in ln and not ln.startswith(ERROR)]
    assert len(lines) == 1 and not others, (where, err)
    return lines[0]


def subcommands() -> dict:
    ap = build_parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def needed_flags(parser) -> list:
    """Flags a command needs to get as far as reading its model (a prompt for generate)."""
    return ["--prompt", "1"] if "--prompt" in parser._option_string_actions else []


def sym_model():
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", ins,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


GENAI = {"model": {"context_length": 64, "eos_token_id": "abc", "vocab_size": 32,
                   "decoder": {"filename": "model.onnx", "head_size": 4, "num_hidden_layers": 1,
                               "num_key_value_heads": 1,
                               "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                          "past_key_names": "pk.%d", "past_value_names": "pv.%d"},
                               "outputs": {"logits": "logits", "present_key_names": "k.%d",
                                           "present_value_names": "v.%d"}}}}


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """``{case: path or name}``: the bad models."""
    d = tmp_path_factory.mktemp("bad")
    onnx.save(sym_model(), str(d / "good.onnx"))
    (d / "folder").mkdir()
    (d / "latin1.txt").write_bytes("caf\xe9 \xff\n".encode("latin-1"))
    (d / "garbage.onnx").write_bytes(b"\x08\x96\x01garbage" * 5)
    (d / "garbage.mxr").write_bytes(b"PK\x03\x04 not really a zip")
    with zipfile.ZipFile(d / "broken.mxr", "w") as zf:
        zf.writestr("program.json", "{not json")
    (d / "empty.onnx").write_bytes(b"")
    cases = {"missing": d / "nope.onnx", "missing_mxr": d / "nope.mxr", "folder": d / "folder",
             "non_utf8": d / "latin1.txt", "garbage_onnx": d / "garbage.onnx", "garbage_mxr": d / "garbage.mxr",
             "broken_mxr": d / "broken.mxr", "empty": d / "empty.onnx", "unknown_name": "no-such-model"}
    for name, files in {
        "genai_bad_eos": {"genai_config.json": json.dumps(GENAI).encode(), "model.onnx": b""},
        "genai_non_utf8": {"genai_config.json": b'{"model": "\xff"}'},
        "genai_outside": {"genai_config.json": json.dumps(
            {"model": {**GENAI["model"], "eos_token_id": 1,
                       "decoder": {**GENAI["model"]["decoder"], "filename": "../good.onnx"}}}).encode()},
        "genai_bad_tokenizer": {"genai_config.json": json.dumps({"model": {**GENAI["model"], "eos_token_id": 1}})
                                .encode(), "model.onnx": b"", "tokenizer.json": b"{\"model\": {\"type\": 5"},
        "optimum_list": {"config.json": b"[]", "model.onnx": onnx.load(str(d / "good.onnx")).SerializeToString()},
        "optimum_vocab": {"config.json": b'{"vocab_size": "lots"}', "model.onnx": b"garbage"},
        "model_json_bad": {"model.json": b'{"name": 3}', "model.onnx": b""},
        "config_only": {"config.json": b"{}"},
    }.items():
        folder = d / name
        folder.mkdir()
        for f, data in files.items():
            (folder / f).write_bytes(data)
        cases[name] = folder
    cases["good"] = d / "good.onnx"
    return cases


BAD_MODELS = ["missing", "missing_mxr", "folder", "non_utf8", "garbage_onnx", "garbage_mxr", "broken_mxr", "empty",
              "unknown_name", "genai_bad_eos", "genai_non_utf8", "genai_outside", "genai_bad_tokenizer",
              "optimum_list", "optimum_vocab", "model_json_bad", "config_only"]


@pytest.mark.parametrize("case", BAD_MODELS)
def test_every_command_reports_a_bad_model_in_one_line(bad, case, capsys):
    for name, parser in subcommands().items():
        rc, out, err = run_cli(capsys, name, bad[case], *needed_flags(parser), "--target", "ref")
        one_error(rc, err, (name, case))


def test_llm_folder_errors_name_the_file_and_the_field(bad, capsys):
    rc, _, err = run_cli(capsys, "generate", bad["genai_bad_eos"], "--prompt", "1")
    line = one_error(rc, err, "eos")
    assert "genai_config.json: field 'model.eos_token_id'" in line and "got 'abc'" in line, line
    rc, _, err = run_cli(capsys, "generate", bad["optimum_list"], "--prompt", "1")
    assert "config.json (an optimum-style model config): expected a JSON object, got []" in one_error(rc, err, "[]")
    rc, _, err = run_cli(capsys, "generate", bad["genai_bad_tokenizer"], "--prompt", "hi")
    assert "tokenizer.json (a tokenizer file): not valid JSON" in one_error(rc, err, "tokenizer"), err
    rc, _, err = run_cli(capsys, "generate", bad["genai_outside"], "--prompt", "1")
    line = one_error(rc, err, "outside")
    assert "field 'model.decoder.filename': expected a path inside" in line and "'../good.onnx'" in line, line


def _numeric_flags(parser) -> list:
    """The options of ``parser`` that take a number (their type one of mgx_graph.cli.errors' checks)."""
    from mgx_graph.cli.errors import float_in, int_at_least

    kinds = {type(int_at_least(0)), type(float_in(0.0))}
    return [a for a in parser._actions if a.option_strings and type(a.type) in kinds and a.nargs is None]


def test_no_flag_takes_an_unchecked_int_or_float():
    for name, parser in subcommands().items():
        for a in parser._actions:
            assert a.type not in (int, float), (name, a.option_strings)
        assert name != "perf" or _numeric_flags(parser), "perf's -n must be checked where it is parsed"


@pytest.mark.parametrize("value", ["abc", "-7", "1e999", "nan", ""])
def test_every_numeric_flag_refuses_bad_numbers(bad, value, capsys):
    seen = 0
    for name, parser in subcommands().items():
        for action in _numeric_flags(parser):
            flag = action.option_strings[-1]
            rc, _, err = run_cli(capsys, name, bad["good"], *needed_flags(parser), f"{flag}={value}")
            line = one_error(rc, err, (name, flag, value))
            assert rc == 2 and f"{name}: argument " in line and flag in line and repr(value) in line, line
            seen += 1
    assert seen >= 12


@pytest.mark.parametrize("flag", ["--max-length", "--max-new-tokens"])
def test_generate_counts_of_zero_are_errors_not_the_default(flag, capsys):
    rc, _, err = run_cli(capsys, "generate", "gpt2", "--prompt", "1", flag, "0")  # refused before any build
    assert rc == 2 and f"argument {flag}: expected an int >= 1, got '0'" in one_error(rc, err, flag)


def test_bad_output_paths_and_flag_files(bad, tmp_path, capsys):
    good, file_ = bad["good"], bad["non_utf8"]
    cases = [
        (["compile", good, "-o", bad["folder"]], "-o/--output " + str(bad["folder"]) + ": is a folder"),
        (["compile", good, "-o", file_ / "p.mxr"], f"{file_} is not a folder"),
        (["compile", good, "-o", tmp_path / "no" / "p.mxr"], "does not exist"),
        (["run", good, "--output-dir", file_], "is a file, not a folder"),
        (["run", good, "--output-dir", file_ / "sub"], "--output-dir"),
        (["generate", "gpt2", "--batch-prompts", file_], "is not UTF-8 text"),
        (["generate", "gpt2", "--batch-prompts", bad["folder"]], "--batch-prompts: cannot read"),
        (["generate", "gpt2", "--batch-prompts", bad["missing"]], "--batch-prompts: cannot read"),
        (["run", good, "--input-dim", "@x", "a"], "--input-dim"),
        (["run", good, "--input", "x=" + str(bad["missing"])], "x"),
        (["run", good, "--input", "nonsense"], "--input"),
        (["perf", good, "-n", "0"], "expected an int >= 1, got '0'"),
    ]
    for argv, says in cases:
        rc, _, err = run_cli(capsys, *argv)
        line = one_error(rc, err, argv)
        assert says in line, (argv, line)
    assert not (file_ / "sub").exists() and not os.path.exists(tmp_path / "no")


def test_batch_prompts_must_be_a_bounded_regular_file(tmp_path, capsys, monkeypatch):
    from mgx_graph.cli import generate

    fifo = tmp_path / "prompts.fifo"
    os.mkfifo(fifo)  # opening it for read would wait for a writer
    rc, _, err = run_cli(capsys, "generate", "gpt2", "--batch-prompts", fifo)
    assert f"--batch-prompts: cannot read {fifo}: not a regular file" in one_error(rc, err, "fifo")
    rc, _, err = run_cli(capsys, "generate", "gpt2", "--batch-prompts", "/dev/zero")
    assert "--batch-prompts: cannot read /dev/zero: not a regular file" in one_error(rc, err, "/dev/zero")
    big = tmp_path / "big.txt"
    big.write_text("1 2\n" * 100)
    monkeypatch.setattr(generate, "MAX_BATCH_PROMPTS_BYTES", 64)
    rc, _, err = run_cli(capsys, "generate", "gpt2", "--batch-prompts", big)
    assert f"--batch-prompts: {big} has 400 bytes, more than the 64 read here" in one_error(rc, err, "big")


@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
def test_serve_port_out_of_range_is_a_flag_error_before_loading(bad, port, capsys):
    rc, _, err = run_cli(capsys, "serve", bad["missing"], f"--port={port}")
    line = one_error(rc, err, port)
    assert rc == 2 and f"argument --port: expected an int in 0..65535, got '{port}'" in line, line


def test_the_commands_summary_lists_every_command(capsys):
    assert main(["--help"]) == 0
    summary = capsys.readouterr().out.split("positional arguments:")[0]
    for name in subcommands():
        assert f"\n  {name} " in summary, (name, summary)


def test_interrupt_and_internal_errors(bad, monkeypatch, capsys):
    def boom(exc):
        def session(*a, **k):
            raise exc
        monkeypatch.setattr(cli, "_Session", session)

    boom(KeyboardInterrupt())
    rc, _, err = run_cli(capsys, "run", bad["good"])
    assert rc == 130 and one_error(1, err, "ctrl-c") == ERROR + "interrupted"
    boom(TypeError("unexpected"))
    rc, _, err = run_cli(capsys, "run", bad["good"])
    assert "internal error: TypeError: unexpected (run with --debug" in one_error(rc, err, "internal")
    rc, _, err = run_cli(capsys, "--debug", "run", bad["good"])
    assert rc == 1 and "Traceback" in err and err.rstrip().splitlines()[-1].startswith(ERROR)
    monkeypatch.setenv("MGX_GRAPH_DEBUG", "1")
    rc, _, err = run_cli(capsys, "run", bad["good"])
    assert rc == 1 and "Traceback" in err


def _entry(*argv, env=None):
    e = dict(os.environ, **(env or {}))
    e.pop("MGX_GRAPH_DEBUG", None) if env is None else None
    return subprocess.run([sys.executable, "-m", "mgx_graph", *map(str, argv)], capture_output=True, text=True,
                          cwd=ROOT, env=e, timeout=300)


def test_the_real_entry_point(bad):
    r = _entry("run", bad["garbage_onnx"])
    one_error(r.returncode, r.stderr, "subprocess")
    assert r.returncode == 1 and "not a valid ONNX protobuf" in r.stderr
    r = _entry("generate", "gpt2", "--max-length", "0", "--prompt", "1")
    one_error(r.returncode, r.stderr, "argparse")
    assert r.returncode == 2
    r = _entry("run", bad["garbage_onnx"], env={"MGX_GRAPH_DEBUG": "1"})
    assert r.returncode == 1 and "Traceback" in r.stderr and "ParseError" in r.stderr


def _chain_model():
    """MatMul and Softmax alternating (they do not fuse): one graph region of 6 launches."""
    nodes, prev = [], "x"
    for i in range(6):
        nodes.append(helper.make_node("MatMul", [prev, "x"], [f"t{i}"]) if i % 2 == 0 else
                     helper.make_node("Softmax", [prev], [f"t{i}"]))
        prev = f"t{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4, 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_perf_counts_the_launches_of_a_run_not_of_the_profiled_runs(tmp_path, capsys):
    """A saved program compiled with graphs: perf's launches per run is what the program's stats say
    after plain runs of it (1 graph launch), whatever -n is."""
    onnx.save(_chain_model(), str(tmp_path / "chain.onnx"))
    saved = tmp_path / "chain.mxr"
    rc, _, err = run_cli(capsys, "compile", tmp_path / "chain.onnx", "--target", "ref", "--hip-graph", "-o", saved)
    assert rc == 0, err
    plain = mgx_graph.load(str(saved))
    for _ in range(4):  # warmup, warmup, capture, replay
        plain.run({"x": np.ones((4, 4), np.float32)})
    want = plain.stats()["launches_per_run"]
    assert len(plain.stats()["regions"]) == 1
    for n in (3, 7):
        rc, out, err = run_cli(capsys, "perf", saved, "-n", n, "--no-progress", "--json")
        assert rc == 0, err
        assert json.loads(out)["launches_per_run"] == want, (n, out)


def test_profiled_runs_leave_the_programs_launch_count_as_a_run_leaves_it():
    """``stats()["launches_per_run"]`` after the per-step profile that perf makes equals what a plain run gives
    (it once kept adding the graph launches of every profiled run)."""
    prog = mgx_graph.compile(_chain_model(), target="ref", hip_graph=True)
    x = np.ones((4, 4), np.float32)
    for _ in range(4):  # warmup, warmup, capture, replay
        prog.run({"x": x})
    want = prog.stats()["launches_per_run"]
    assert len(prog.stats()["regions"]) == 1
    for _ in range(3):
        prog.executor.profile_steps({"x": x}, device=False)
        assert prog.stats()["launches_per_run"] == want
