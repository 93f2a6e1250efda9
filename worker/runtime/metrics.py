"""What a run measured: step time, throughput, MFU, memory, loss."""

from __future__ import annotations

import resource
import statistics
import sys
from collections.abc import Sequence

import torch

from worker.runtime.plan import RuntimePlan


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated device memory; on CPU the process's peak resident set (includes the framework)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**30 if sys.platform == "darwin" else rss / 2**20  # bytes on macOS, KiB on Linux


def summarize(plan: RuntimePlan, step_times: Sequence[float], warmup: int, losses: Sequence[float],
              memory_gib_per_rank: Sequence[float], notes: Sequence[str]) -> dict[str, object]:
    """The run's ``metrics`` object (contract field names). Step time is the median of the steps after
    ``warmup`` (robust to a straggling step on a shared host)."""
    timed = list(step_times[warmup:]) or list(step_times)
    step = statistics.median(timed)
    tokens = plan.global_batch_size * plan.seq_length
    flops = plan.model.flops_per_token(plan.seq_length) * tokens
    return {
        "step_time_s": step,
        "step_time_mean_s": statistics.fmean(timed),
        "step_times_s": list(step_times),
        "tokens_per_s": tokens / step,
        "throughput_samples_per_s": plan.global_batch_size / step,
        "mfu": flops / (step * plan.world_size * plan.peak_flops_per_rank),
        "model_tflops_per_rank": flops / step / plan.world_size / 1e12,
        "peak_memory_gib_per_rank": list(memory_gib_per_rank),
        "peak_memory_gib": max(memory_gib_per_rank) if memory_gib_per_rank else 0.0,
        "loss": list(losses),
        "world_size": plan.world_size,
        "layout": plan.describe(),
        "notes": list(dict.fromkeys(notes)),
    }
