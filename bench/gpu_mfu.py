"""MFU of a 1B-class Llama-style model (Llama-3.2-1B shape) in bf16 on one GPU, with the worker runtime's
model: one prepared script for a lent H200 (goal: MFU >= 45 %).

    .venv/bin/python bench/gpu_mfu.py                  # defaults: seq 4096, batch 2, 30 steps, torch.compile
    .venv/bin/python bench/gpu_mfu.py --no-compile --batch 4 --seq 2048

MFU = model FLOPs per step (6 x matmul parameters + 12 x layers x width x sequence, per token; no recompute)
/ (step time x the GPU's dense bf16 peak: the preset's, or --peak-tflops). Without CUDA it prints why and
exits 0, so ``make bench`` passes on CPU-only machines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from solvers.presets import GPU_PRESETS
from worker.runtime.model import ModelConfig, build_model, lm_loss

LLAMA_1B = ModelConfig(num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=8, head_dim=64,
                       ffn_hidden_size=8192, vocab_size=128256, rope_theta=500000.0)


def peak_tflops_for(name: str) -> float | None:
    key = name.lower()
    for preset, spec in GPU_PRESETS.items():
        if preset.replace("-", "") in key.replace("-", "").replace(" ", ""):
            return float(spec["peak_tflops"])
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--layers", type=int, default=LLAMA_1B.num_layers)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak (default: from the GPU preset)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_mfu: SKIPPED - no CUDA device here (torch "
              f"{torch.__version__}); run it on a machine with an NVIDIA GPU")
        return 0
    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    peak = args.peak_tflops or peak_tflops_for(name)
    if peak is None:
        print(f"gpu_mfu: unknown GPU {name!r}: pass --peak-tflops")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = ModelConfig(**{**LLAMA_1B.__dict__, "num_layers": args.layers})
    model = build_model(cfg, seed=0, device=device)
    params = sum(p.numel() for p in model.parameters())
    # fp32 master weights, bf16 compute (autocast): what mixed-precision training does.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    step_fn = torch.compile(model) if args.compile else model
    gen = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), device=device, generator=gen)
    x, y = tokens[:, :-1], tokens[:, 1:]
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lm_loss(step_fn(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
            losses.append(float(loss))
    step_s = statistics.median(times)
    flops = cfg.flops_per_token(args.seq) * args.batch * args.seq
    mfu = flops / step_s / (peak * 1e12)
    out = {"gpu": name, "params_b": params / 1e9, "layers": cfg.num_layers, "seq": args.seq, "batch": args.batch,
           "compile": args.compile, "step_time_s": step_s, "tokens_per_s": args.batch * args.seq / step_s,
           "model_tflops": flops / step_s / 1e12, "peak_tflops": peak, "mfu": mfu,
           "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30, "loss_last": losses[-1]}
    print(f"{'gpu':<10}{'params':>8}{'seq x batch':>13}{'step s':>9}{'tokens/s':>10}{'TFLOP/s':>9}{'MFU':>7}")
    print(f"{name[:10]:<10}{params / 1e9:>7.2f}B{args.seq:>8} x {args.batch:<2}{step_s:>9.4f}"
          f"{out['tokens_per_s']:>10.0f}{out['model_tflops']:>9.1f}{100 * mfu:>6.1f}%")
    print(f"goal MFU >= 45%: {'met' if mfu >= 0.45 else 'NOT met'}; peak memory {out['peak_memory_gib']:.1f} GiB")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
