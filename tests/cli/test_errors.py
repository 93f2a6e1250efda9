"""``paraplan plan`` / ``paraplan estimate`` on requests the fuzzing found mishandled: one line on stderr that
names the field, exit 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def _run(tmp_path: Path, command: str, request: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "request.json"
    f.write_text(json.dumps(request))
    return subprocess.run([sys.executable, "-m", "paraplan_cli.main", command, "-f", str(f), "--json"],
                          capture_output=True, text=True, timeout=120)


def test_plan_with_an_interleaved_schedule_one_gpu_cannot_run(tmp_path: Path) -> None:
    req = {"kind": "hybrid", "model": {"preset": "gpt3-1.3b"}, "cluster": {"gpu": "A100-80GB", "nodes": 1,
                                                                          "gpus_per_node": 1},
           "training": {"global_batch_size": 8, "seq_length": 1024}, "constraints": {"schedule": "interleaved"}}
    out = _run(tmp_path, "plan", req)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: constraints.schedule: the interleaved schedule needs"), out.stderr


def test_estimate_with_a_kind_that_is_not_a_string(tmp_path: Path) -> None:
    req = {"kind": ["hybrid"], "model": {"preset": "gpt3-1.3b"}, "cluster": {"gpu": "A100-80GB"},
           "training": {"global_batch_size": 8}, "strategy": {"tp": 1}}
    for command in ("estimate", "plan"):
        out = _run(tmp_path, command, req)
        assert out.returncode == 2 and out.stderr.startswith("error: kind: unknown plan kind ['hybrid']"), out.stderr


def test_json_python_cannot_read(tmp_path: Path) -> None:
    """(A 5,000-digit number or 100,000 nested arrays raised out of json.loads: a traceback, exit 1.)"""
    f = tmp_path / "request.json"
    for text, reason in (('{"training": {"global_batch_size": ' + "9" * 5000 + "}}", "digits"),
                         ("[" * 100_000 + "]" * 100_000, "nested too deeply")):
        f.write_text(text)
        for command in ("estimate", "plan"):
            out = subprocess.run([sys.executable, "-m", "paraplan_cli.main", command, "-f", str(f), "--json"],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 2 and out.stderr.startswith(f"error: {f}: unreadable JSON"), out.stderr
            assert reason in out.stderr and "Traceback" not in out.stderr


def test_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    """(A byte 0xff raised UnicodeDecodeError out of the reader: a traceback, exit 1.)"""
    f = tmp_path / "request.json"
    f.write_bytes(b'{"model": "\xff"}')
    for command in (["estimate", "-f", str(f), "--json"], ["plan", "-f", str(f), "--json"], ["model", str(f)]):
        out = subprocess.run([sys.executable, "-m", "paraplan_cli.main", *command], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 2 and out.stderr.startswith(f"error: {f}: not UTF-8 text (byte 0xff at offset 11)")
        assert "Traceback" not in out.stderr


def test_model_names_each_field_it_cannot_import(tmp_path: Path) -> None:
    """``paraplan model`` printed "Input should be a valid integer" three times, naming no field."""
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                             "num_key_value_heads": 3}))
    out = subprocess.run([sys.executable, "-m", "paraplan_cli.main", "model", str(f)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"error: {f}: num_attention_heads (4) must be a multiple of num_kv_heads (3)")
    f.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                             "vocab_size": -5}))
    out = subprocess.run([sys.executable, "-m", "paraplan_cli.main", "model", str(f)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith(f"error: {f}: vocab_size: "), out.stderr


def test_json_on_stdout_stays_json_when_a_native_solver_prints(tmp_path: Path) -> None:
    """HiGHS prints its banner from C on file descriptor 1: 'plan --json' opened with "Running HiGHS ..."."""
    from tests.flexsp.test_plans import EXPLICIT

    out = _run(tmp_path, "plan", {**EXPLICIT, "solver": {"milp": "highs"}})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["estimate"]["step_time_s"] > 0
