"""Number formatting and request labels: junk in, a dash out; units chosen to stay readable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.ui import format as fmt
from service.ui.request_info import batch_label, cluster_label, headline, model_label


@pytest.mark.parametrize(("value", "text"), [
    (None, "—"), ("x", "—"), (float("nan"), "—"), (True, "—"), (0, "0 s"), (1.234e-4, "123 µs"),
    (0.0456, "45.6 ms"), (4.33, "4.33 s"), (7200, "120 min"), (36000, "10 h"),
])
def test_seconds(value: object, text: str) -> None:
    assert fmt.seconds(value) == text


def test_numbers_percent_gib_ratio() -> None:
    assert fmt.number(60400) == "60.4 k" and fmt.number(2.5e6) == "2.5 M" and fmt.number(512) == "512"
    assert fmt.percent(0.413) == "41.3%" and fmt.gib(33.14) == "33.1 GiB" and fmt.ratio(1.2) == "1.20×"
    assert fmt.gain(1.042) == "+4.2%" and fmt.gain(0.9) == "-10.0%" and fmt.gain(None) == fmt.DASH
    assert fmt.number(None) == fmt.percent("") == fmt.gib(float("inf")) == "—"


def test_age_accepts_datetimes_and_iso_strings() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert fmt.age(now - timedelta(seconds=30), now) == "30 s ago"
    assert fmt.age("2026-01-01T11:15:00Z", now) == "45 min ago"
    assert fmt.age("2026-01-01T11:00:00+00:00", now) == "1 h ago"
    assert fmt.age((now - timedelta(days=3)).replace(tzinfo=None), now) == "3 d ago"
    assert fmt.age("yesterday", now) == "—"


def test_request_labels() -> None:
    req = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": {"name": "H100-SXM"}, "nodes": 4, "gpus_per_node": 8},
           "training": {"global_batch_size": 512, "seq_length": 4096}}
    assert (model_label(req), cluster_label(req), batch_label(req)) == ("llama2-7b", "4×8 H100-SXM",
                                                                         "batch 512 × seq 4096")
    assert model_label({"workload": {"preset": "omni"}}) == "workload omni"
    assert model_label({"model": {"hf_config": {"model_type": "qwen3_moe"}}}) == "qwen3_moe (HF config)"
    assert model_label({"model": {"hf_config": {"_name_or_path": "Qwen/Qwen3-30B-A3B"}}}) == "Qwen/Qwen3-30B-A3B"
    assert batch_label({"batch": {"sequence_lengths": [100, 200]}}) == "2 sequences, 300 tokens"
    assert model_label({}) == cluster_label({"cluster": "junk"}) == "—"
    assert headline("spindle", {"iteration_time_s": 0.2})["step_time_s"] == 0.2
    assert headline("hybrid", None) == {"step_time_s": None, "throughput": None, "tokens_per_s": None, "mfu": None}
