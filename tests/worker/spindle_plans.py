"""Spindle plans for the runtime tests, made by the real planner (``solvers.api.solve``) on a CPU "cluster" of 4
devices: tiny module shapes of the multi-modal and RL workloads the planner's presets describe."""

from __future__ import annotations

import copy
import functools
from typing import Any

from solvers.api import solve

VIT: dict[str, Any] = {"name": "vit", "num_layers": 6, "hidden_size": 32, "num_attention_heads": 4,
                       "ffn_hidden_size": 64, "seq_length": 8}
LLM: dict[str, Any] = {"name": "llm", "num_layers": 4, "hidden_size": 48, "num_attention_heads": 4,
                       "ffn_hidden_size": 96, "seq_length": 16, "causal": True, "mlp": "swiglu"}
POLICY: dict[str, Any] = {"name": "policy", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
                          "num_kv_heads": 2, "ffn_hidden_size": 64, "seq_length": 12, "causal": True, "mlp": "swiglu"}
CLUSTER: dict[str, Any] = {"gpu": "cpu", "nodes": 1, "gpus_per_node": 4}


def captioning_request(caption_batch: int = 30, text_batch: int = 6) -> dict[str, Any]:
    """``qwen-vl`` scaled down: a vision encoder feeding a decoder (image captioning) and the same decoder alone
    (text LM): two tasks sharing the decoder. At 30 / 6 samples the planner splits both the encoder and the
    text LM over two device blocks and shares a device between them."""
    return {"kind": "spindle", "cluster": CLUSTER, "training": {"precision": "fp32"},
            "workload": {"metaops": [
                {"name": "caption/vit", "task": "caption", "batch_size": caption_batch, "module": VIT},
                {"name": "caption/llm", "task": "caption", "batch_size": caption_batch, "module": LLM},
                {"name": "text/llm", "task": "text", "batch_size": text_batch, "module": LLM}],
                "edges": [["caption/vit", "caption/llm"]]},
            "options": {"exact": False}}


def rl_request(group: int = 8) -> dict[str, Any]:
    """``unigrpo`` scaled down (text rollout only): the policy generates, a reward model and a frozen reference
    score the samples, the policy is updated on them (synchronous: the update waits for the scores)."""
    ops = [
        {"name": "rollout/text", "task": "rollout", "batch_size": group, "module": {**POLICY, "seq_length": 8},
         "mode": "decode", "decode_tokens": 4},
        {"name": "reward/score", "task": "reward", "batch_size": group, "module": {**POLICY, "name": "reward-model"},
         "mode": "forward"},
        {"name": "reference/logp", "task": "reference", "batch_size": group,
         "module": {**POLICY, "name": "reference"}, "mode": "forward"},
        {"name": "update/policy", "task": "update", "batch_size": group, "module": POLICY}]
    edges = [["rollout/text", "reward/score"], ["rollout/text", "reference/logp"], ["reward/score", "update/policy"],
             ["reference/logp", "update/policy"]]
    return {"kind": "spindle", "cluster": CLUSTER, "training": {"precision": "fp32"},
            "workload": {"metaops": ops, "edges": edges}, "options": {"exact": False}}


@functools.cache
def _planned(which: str) -> dict[str, Any]:
    request = captioning_request() if which == "captioning" else rl_request()
    return {"kind": "spindle", "request": request, "result": solve(request).model_dump(mode="json")}


def planned(which: str) -> dict[str, Any]:
    """The plan document (``{"kind", "request", "result"}``) of ``captioning`` or ``rl``."""
    return copy.deepcopy(_planned(which))
