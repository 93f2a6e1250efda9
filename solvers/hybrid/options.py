"""The hybrid planner's options: its resolutions, limits and which of its steps run."""

from __future__ import annotations

from dataclasses import dataclass

from solvers.hybrid import stage_table


@dataclass
class PlannerOptions:
    memory_bins: int = 512  # resolution of the DP's memory axis (bins across the whole budget)
    min_memory_bins: int = 128  # the coarsest resolution deep models with mixed layer kinds fall back to
    memory_unit_bytes: float | None = None  # fixed bin size instead (exact when memory is a multiple)
    exhaustive_partition_limit: int = 1000
    time_limit_s: float | None = None
    use_bounds: bool = True
    peak_levels: int = 4  # transient-memory levels enumerated exactly per stage (more are rounded up)
    # Pareto-optimal embedding/LM-head strategies tried per configuration: 4 missed the best plan on 6 of 72 sweep
    # requests (by up to 1.1 %, shallow stacks with large vocabularies); 8 found what 16 and 64 find, same CPU time
    embedding_variants: int = 8
    dp_work_limit: float = 2e5  # identical-layer stages: the DP only when this cheap (else the two-type table)
    # the chosen plan's dichotomic search over time weights: rounds of one new weight per hull gap per stage
    refine_rounds: int = 8
    rival_refine_rounds: int = 1  # the same, local rounds only, for configurations that may overtake it
    swap_moves: int = 64  # the chosen plan's single-layer changes under a non-linear pipeline formula (0: none)
    swap_pairs: bool = True  # ... and, where no single change helps, changes of two layers of a stage at once
    polish_factor: int = 4  # mixed layer kinds: the chosen configuration re-solved with this many times finer bins
    # the layer DP: numpy over memory bins, or Pareto fronts on exact memory. Measured (bench/hybrid.py --layer-dp):
    # bins are as fast or faster everywhere and 5.7x faster on a 64-layer mixed stack, whose fronts grow to ~16,000
    # points; exact memory gained at most 0.37 % (stacks of identical layers: none, the two-strategy table is exact)
    layer_dp: stage_table.LayerDP = "binned"
    # the certificate's refined bounds: groups of a stage's largest transient buffer told apart (1: the least reserved
    # for all), and stages of up to this many identical layers also by whole candidates
    bound_transient_levels: int = 8
    bound_whole_layers: int = 7
    # ... up to this many where the certificate's gap still exceeds ``deep_bound_gap`` (a third pass)
    bound_whole_layers_deep: int = 16
    deep_bound_gap: float = 0.01
    # ... where also a stage mixing layouts pays its least re-layout in the bound by whole candidates (the deep pass
    # only: asking every refined stage its transitions doubled mixtral-8x22b's certificate on 102,400 GPUs)
    bound_layout_switch: bool = False
    # ... and for a single stage (pp = 1), whose one relaxation is cheap: gpt3-1.3b on 16 A100-40GB at seq 8192 (one
    # stage of 24 layers under memory) 1.76 % at 8 groups, 0.76 % at 64, at no measurable certificate CPU
    bound_single_stage_levels: int = 64
