"""Plans whose exports the frameworks' own code must accept (#33): dense and GQA models, MoE, long sequences with
context parallelism, tight memory, pipelines with 1F1B, GPipe and interleaved schedules, odd GPU counts, 8 to 512
GPUs. Each is solved once a test session (``solved``); most plans mix per-layer strategies."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from solvers.documents import HybridResult


@dataclass(frozen=True)
class Plan:
    model: str
    gpu: str
    nodes: int
    gpus_per_node: int
    batch: int
    seq: int
    constraints: tuple[tuple[str, Any], ...] = ()

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def arch(self) -> int:
        return 8 if self.gpu.startswith("A100") else 10 if self.gpu.startswith("B200") else 9

    def request(self) -> dict[str, Any]:
        return {"kind": "hybrid", "model": {"preset": self.model},
                "cluster": {"gpu": self.gpu, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node},
                "training": {"global_batch_size": self.batch, "seq_length": self.seq},
                "constraints": dict(self.constraints)}


CORPUS: dict[str, Plan] = {
    "llama2-7b-2x8-a100": Plan("llama2-7b", "A100-80GB", 2, 8, 64, 2048),
    "llama2-13b-2x8-a100-40": Plan("llama2-13b", "A100-40GB", 2, 8, 64, 4096, (("max_cp", 1),)),
    "llama3-70b-4x8-h100": Plan("llama3-70b", "H100-SXM", 4, 8, 128, 4096, (("max_cp", 1),)),
    "llama2-7b-1x8-interleaved": Plan("llama2-7b", "A100-40GB", 1, 8, 64, 4096,
                                      (("max_cp", 1), ("schedule", "interleaved"))),
    "gpt3-1.3b-1x4": Plan("gpt3-1.3b", "A100-80GB", 1, 4, 32, 2048),
    "gpt3-6.7b-1x8": Plan("gpt3-6.7b", "A100-80GB", 1, 8, 64, 2048),
    "gpt3-13b-2x8-tight": Plan("gpt3-13b", "A100-40GB", 2, 8, 128, 2048, (("memory_limit_gib", 24),)),
    "llama3-8b-1x8-h100": Plan("llama3-8b", "H100-SXM", 1, 8, 64, 8192),
    "llama3-8b-2x8-cp": Plan("llama3-8b", "H100-SXM", 2, 8, 32, 32768),
    "llama3-70b-4x8-cp2": Plan("llama3-70b", "H100-SXM", 4, 8, 128, 8192),
    "llama2-13b-1x8-cp2": Plan("llama2-13b", "A100-80GB", 1, 8, 32, 8192),
    "qwen2-7b-1x8": Plan("qwen2-7b", "A100-80GB", 1, 8, 64, 4096),
    "qwen2-72b-8x8": Plan("qwen2-72b", "H100-SXM", 8, 8, 256, 4096),
    "llama2-70b-8x8-a100": Plan("llama2-70b", "A100-80GB", 8, 8, 512, 4096),
    "mixtral-8x7b-2x8": Plan("mixtral-8x7b", "H100-SXM", 2, 8, 64, 4096),
    "llama2-7b-1x6": Plan("llama2-7b", "A100-80GB", 1, 6, 48, 2048),
    "gpt3-2.7b-3x4": Plan("gpt3-2.7b", "A100-40GB", 3, 4, 96, 2048),
    "llama2-7b-2x8-pp-gpipe": Plan("llama2-7b", "A100-40GB", 2, 8, 64, 4096, (("max_cp", 1), ("schedule", "gpipe"))),
    "llama3-8b-4x8-interleaved": Plan("llama3-8b", "H100-SXM", 4, 8, 256, 8192,
                                      (("max_cp", 1), ("schedule", "interleaved"))),
    "gpt3-175b-16x8": Plan("gpt3-175b", "A100-80GB", 16, 8, 1536, 2048),
    "llama2-7b-1x8-16gb": Plan("llama2-7b", "A100-80GB", 1, 8, 64, 2048, (("memory_limit_gib", 16),)),
    "llama3-405b-64x8": Plan("llama3-405b", "H100-SXM", 64, 8, 2048, 8192),
}


@cache
def solved(name: str) -> HybridResult:
    """The plan's result document (solved once a session: the corpus takes about 12 s of CPU)."""
    from solvers.hybrid.api import solve

    return solve(CORPUS[name].request())
