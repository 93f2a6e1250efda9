"""Galvatron's plan file (``galvatron_config_*.json``) <-> ``PlanStrategy``.

Galvatron writes one comma-separated entry per layer: ``tp_sizes_enc`` (TP degree), ``dp_types_enc``
(1 = ZeRO-3 / FSDP, 0 = the global ``default_dp_type``: ``zero2`` or ``ddp``), ``use_sp`` (1 = Ulysses
sequence parallelism on the TP group), ``checkpoint`` (1 = full recomputation), ``tp_consecutive_flags``;
and per plan ``pp_deg``, ``pp_division`` (layers per stage), ``chunks`` (micro-batches), ``global_bsz``,
``pipeline_type`` (``pipedream_flush`` = 1F1B, ``gpipe``), ``vtp`` (vocabulary TP of the embedding and
LM head), ``embed_sdp`` (ZeRO-3 for them), ``vsp`` (1: those vtp GPUs split the sequence instead of the
vocabulary, ``EmbeddingStrategy.sp = "ulysses"``). Data-parallel degrees are implied: the stage's GPUs
divided by TP, so reading a file needs the GPU count.

Megatron sequence parallelism is a training flag in Galvatron, not part of the file; ``sequence_parallel``
says whether TP layers run with it (``sp = "megatron"``) or without (``sp = None``).

Export is lossy where Galvatron has no equivalent (stated in ``plan_to_galvatron_config``). Two keys are
paraplan's additions, ignored by Galvatron: ``num_gpus`` and ``sequence_parallel``, so that a file we
write reads back to the same plan.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from solvers.errors import FieldProblem, SpecError, shown
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, Recompute, Schedule, SpKind

Loc = tuple[str | int, ...]

_PIPELINES: dict[str, Schedule] = {"pipedream_flush": "1f1b", "gpipe": "gpipe"}


# ASCII digits only: Python's int() also takes other scripts' digits ('٢') and underscores ('2_0' is 20)
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)


def _integer(value: Any) -> int | None:
    """``value`` as Galvatron writes an integer (a JSON integer, an integral number, or its digits), else None.
    Booleans, fractions, null, lists and objects are not integers (int() would take some or raise TypeError)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER.fullmatch(value):
        return int(value)
    return None


def _ints(config: Mapping[str, Any], key: str, loc: Loc, default: list[int] | None = None) -> list[int]:
    if key not in config:
        if default is None:
            raise SpecError.at((*loc, key), "field required in a Galvatron config")
        return default
    value = config[key]
    entries = value if isinstance(value, list) else str(value).split(",") if isinstance(value, str) else [value]
    out = [_integer(v) for v in entries]
    if not entries or None in out:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise SpecError.at((*loc, key), f"expected comma-separated integers, got {shown}")
    return cast(list[int], out)


def _int(config: Mapping[str, Any], key: str, loc: Loc, default: int | None = None) -> int:
    values = _ints(config, key, loc, None if default is None else [default])
    if len(values) != 1:
        raise SpecError.at((*loc, key), f"expected one integer, got {shown(config[key])}")
    return values[0]


def _even_division(layers: int, pp: int) -> list[int]:
    """Galvatron's default partition: equal stages, the remainder on the last."""
    per = layers // pp
    return [per] * (pp - 1) + [layers - per * (pp - 1)]


def plan_from_galvatron_config(config: Mapping[str, Any], num_gpus: int | None = None, *,
                               sequence_parallel: bool | None = None, loc: Loc = ("strategy",)) -> PlanStrategy:
    """Read a Galvatron plan file's content. ``num_gpus``: the cluster's GPUs (default: the file's
    ``num_gpus``); ``sequence_parallel``: Megatron SP on TP layers (default: the file's, else on)."""
    if not isinstance(config, Mapping):
        raise SpecError.at(loc, "a Galvatron config must be a JSON object")
    written_for = _int(config, "num_gpus", loc) if "num_gpus" in config else None
    if written_for is not None and written_for < 1:
        raise SpecError.at((*loc, "num_gpus"), f"expected a positive GPU count, got {written_for}")
    if num_gpus is None:
        if written_for is None:
            raise SpecError.at((*loc, "num_gpus"), "the GPU count is needed to read a Galvatron config")
        num_gpus = written_for
    elif written_for is not None and written_for != num_gpus:
        # data-parallel degrees are implied by the GPU count: on another cluster the same file is another plan
        raise SpecError.at((*loc, "num_gpus"), f"this config was written for {written_for} GPUs; the cluster has "
                                               f"{num_gpus}")
    if sequence_parallel is None:
        sequence_parallel = config.get("sequence_parallel", True)
        if not isinstance(sequence_parallel, bool):  # bool("false") is True
            raise SpecError.at((*loc, "sequence_parallel"), f"expected true or false, got {shown(sequence_parallel)}")
    sp_flag = sequence_parallel
    pp = _int(config, "pp_deg", loc)
    tps = _ints(config, "tp_sizes_enc", loc)
    n = len(tps)
    per_layer = {
        "dp_types_enc": _ints(config, "dp_types_enc", loc),
        "use_sp": _ints(config, "use_sp", loc, [0] * n),
        "checkpoint": _ints(config, "checkpoint", loc, [0] * n),
        "tp_consecutive_flags": _ints(config, "tp_consecutive_flags", loc, [1] * n),
    }
    problems = [FieldProblem((*loc, k), f"has {len(v)} entries for {n} layers")
                for k, v in per_layer.items() if len(v) != n]
    # Galvatron's per-layer and embedding switches are 0 or 1; other values were read as one or the other
    # (use_sp 2 as off, checkpoint -1 as on), so a corrupt file gave a plan nobody wrote
    flags = {**per_layer, "vsp": [_int(config, "vsp", loc, 0)], "embed_sdp": [_int(config, "embed_sdp", loc, 0)]}
    problems += [FieldProblem((*loc, k), f"expected 0 or 1, got {bad[0]}")
                 for k, v in flags.items() if (bad := [x for x in v if x not in (0, 1)])]
    chunks = _int(config, "chunks", loc, 1)
    if chunks < 1:  # was read as 1 micro-batch
        problems.append(FieldProblem((*loc, "chunks"), f"the number of micro-batches must be at least 1, got {chunks}"))
    if pp < 1 or num_gpus % pp:
        problems.append(FieldProblem((*loc, "pp_deg"), f"pp_deg {pp} does not divide {num_gpus} GPUs"))
    if problems:
        raise SpecError(problems)
    division = _ints(config, "pp_division", loc, _even_division(n, pp))
    if len(division) != pp or sum(division) != n or min(division) < 1:
        raise SpecError.at((*loc, "pp_division"), f"{division} is not a partition of {n} layers into {pp} stages")
    default_dp = str(config.get("default_dp_type", "ddp"))
    if default_dp not in ("ddp", "zero2"):
        raise SpecError.at((*loc, "default_dp_type"), f"expected 'ddp' or 'zero2', got {shown(default_dp)}")
    default_zero = 2 if default_dp == "zero2" else 0
    pipeline = str(config.get("pipeline_type", "gpipe"))
    if pipeline not in _PIPELINES:
        raise SpecError.at((*loc, "pipeline_type"), f"expected one of {sorted(_PIPELINES)}, got {shown(pipeline)}")

    stage_gpus = num_gpus // pp
    layers: list[LayerStrategy] = []
    for i, tp in enumerate(tps):
        if tp < 1 or stage_gpus % tp:
            problems.append(FieldProblem((*loc, "tp_sizes_enc"), f"layer {i}: tp {tp} does not divide the "
                                                                  f"{stage_gpus} GPUs of a stage"))
            continue
        dp = stage_gpus // tp
        if per_layer["tp_consecutive_flags"][i] == 0 and tp > 1 and dp > 1:
            problems.append(FieldProblem((*loc, "tp_consecutive_flags"),
                                         f"layer {i}: non-contiguous TP groups are not supported"))
            continue
        ulysses = per_layer["use_sp"][i] == 1
        sp: SpKind = "ulysses" if ulysses else ("megatron" if sp_flag and tp > 1 else None)
        zero = (3 if per_layer["dp_types_enc"][i] == 1 else default_zero) if dp > 1 else 0
        recompute: Recompute = "full" if per_layer["checkpoint"][i] else "none"
        layers.append(LayerStrategy(tp=tp, dp=dp, sp=sp, zero=zero, recompute=recompute))
    vtp = _int(config, "vtp", loc, 1)
    if vtp < 1 or stage_gpus % vtp:
        problems.append(FieldProblem((*loc, "vtp"), f"vtp {vtp} does not divide the {stage_gpus} GPUs of a stage"))
    if problems:
        raise SpecError(problems)
    # Galvatron applies its ZeRO ratio to the embedding even when vtp fills the stage (dp 1), so the zero
    # stage is kept as the file implies.
    embed_zero = 3 if _int(config, "embed_sdp", loc, 0) else default_zero
    embed_sp: SpKind = "ulysses" if _int(config, "vsp", loc, 0) else None
    return PlanStrategy(
        pp=pp,
        micro_batches=chunks,
        layers=tuple(layers),
        stage_layers=tuple(division),
        schedule=_PIPELINES[pipeline],
        embedding=EmbeddingStrategy(tp=vtp, dp=stage_gpus // vtp, zero=embed_zero, sp=embed_sp),
    )


def plan_to_galvatron_config(plan: PlanStrategy, *, global_batch_size: int | None = None,
                             num_gpus: int | None = None) -> dict[str, Any]:
    """Galvatron's plan file for ``plan``.

    Lossy where Galvatron has no equivalent: selective recomputation becomes full (``checkpoint`` 1, which
    keeps the plan within its memory); ZeRO-1 becomes Galvatron's ZeRO-2 default; one ``default_dp_type``
    serves all non-ZeRO-3 layers, ``zero2`` when any of them (or the embedding) shards. Context and expert
    parallelism and interleaved schedules cannot be written (SpecError).
    """
    loc: Loc = ("strategy",)
    problems: list[FieldProblem] = []
    if plan.schedule == "interleaved" or plan.virtual_stages > 1:
        problems.append(FieldProblem((*loc, "schedule"), "Galvatron has GPipe and 1F1B schedules only"))
    # one problem for all such layers, at the first: one per layer made a line of thousands of characters
    unwritable = [i for i, s in enumerate(plan.layers) if s.cp != 1 or s.ep != 1]
    if unwritable:
        which = f"layer {unwritable[0]} uses" if len(unwritable) == 1 else \
            f"{len(unwritable)} of {len(plan.layers)} layers, from layer {unwritable[0]}, use"
        problems.append(FieldProblem((*loc, "layers", unwritable[0]),
                                     f"{which} context or expert parallelism, which Galvatron does not have"))
    if problems:
        raise SpecError(problems)
    sharded = [s.zero for s in plan.layers if s.dp > 1 and s.zero in (1, 2)]
    # ZeRO-1 over a single embedding replica is ZeRO-0 (as the Galvatron cost model prices it); written as zero2
    # it read back as ZeRO-2, to which Galvatron applies its ZeRO-2 ratio even unsharded
    emb = plan.embedding
    replicas = emb.dp * (emb.tp if emb.sp == "ulysses" else 1)
    zero2 = bool(sharded) or emb.zero == 2 or (emb.zero == 1 and replicas > 1)
    mp_sp = [s.sp == "megatron" for s in plan.layers if s.tp > 1 and s.sp != "ulysses"]

    def join(values: Sequence[int]) -> str:
        return ",".join(str(v) for v in values)

    config: dict[str, Any] = {
        "pp_deg": plan.pp,
        "tp_sizes_enc": join([s.tp for s in plan.layers]),
        "tp_consecutive_flags": join([1] * len(plan.layers)),
        "dp_types_enc": join([1 if (s.zero == 3 and s.dp > 1) else 0 for s in plan.layers]),
        "use_sp": join([1 if s.sp == "ulysses" else 0 for s in plan.layers]),
        "checkpoint": join([0 if s.recompute == "none" else 1 for s in plan.layers]),
        "chunks": plan.micro_batches,
        "pp_division": join(plan.stage_layers),
        "pipeline_type": "gpipe" if plan.schedule == "gpipe" else "pipedream_flush",
        "default_dp_type": "zero2" if zero2 else "ddp",
        "vtp": plan.embedding.tp,
        "vsp": 1 if plan.embedding.sp == "ulysses" else 0,
        "embed_sdp": 1 if plan.embedding.zero == 3 else 0,
        "sequence_parallel": any(mp_sp) if mp_sp else True,
    }
    if global_batch_size is not None:
        config["global_bsz"] = global_batch_size
    if num_gpus is not None:
        config["num_gpus"] = num_gpus
    return config


def read_galvatron_config(path: str, search_dirs: Sequence[str] = (),
                          loc: Loc = ("strategy", "path")) -> dict[str, Any]:
    """Load a plan file: ``path`` as given, else relative to each of ``search_dirs`` (e.g. profiles_dir)."""
    candidates = [path] + [os.path.join(d, path) for d in search_dirs if not os.path.isabs(path)]
    for p in candidates:
        if os.path.isfile(p):
            try:
                with open(p, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError) as err:
                raise SpecError.at(loc, f"cannot read {p}: {err}") from None
            if not isinstance(data, dict):
                raise SpecError.at(loc, f"{p} is not a JSON object")
            return data
    raise SpecError.at(loc, f"no such file: {path}" + (f" (also looked in {', '.join(search_dirs)})"
                                                       if search_dirs else ""))
