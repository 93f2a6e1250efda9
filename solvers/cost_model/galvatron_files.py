"""Readers of Galvatron's profile and hardware JSON files (hetu-galvatron 2.4.0 layout).

Profiles (``profiles_dir``), for a model profiled under some name and precision:
- ``computation_profiling_<precision>_<name>.json``: forward time of one layer per sample (ms), keys
  ``layertype_0_bsz<B>_seq<S>`` (older files: ``layertype_0_bsz<B>``), and of the embedding / LM head
  (``layertype_other_...``).
- ``memory_profiling_<precision>_<name>.json``: per layer ``parameter_size`` (MB) and
  ``tp_activation_per_bsz_dict`` (MB per sample by TP degree, plus ``checkpoint``), under
  ``layertype_0`` (plain TP) or ``layertype_0_sp`` (Megatron sequence parallelism), each keyed by sequence
  length; and the embedding / head memory ``other_memory_pp_{off,on_first,on_last}[_sp]``.
Hardware (``hardware_dir``: a folder, or a list searched in order per file, e.g. extrapolated files first
and the measured folder for what they lack), for ``N`` nodes of ``G`` GPUs:
- ``allreduce_bandwidth_<N>nodes_<G>gpus_per_node.json``: bus bandwidth (MB/ms) of all-reduce groups by
  size and contiguity (``allreduce_size_<d>_consec_<0|1>``);
- ``p2p_bandwidth_<N>nodes_<G>gpus_per_node.json``: point-to-point bandwidth by pipeline degree;
- ``overlap_coefficient.json``: slow-down of computation overlapped with communication;
- ``sp_time_<N>nodes_<G>gpus_per_node.json`` (only for ``sp_space = "tp+sp"``): all-reduce / all-to-all
  times (ms) by group and message size.

Values are read as Galvatron's search engine reads them (which key wins where several match, the halving
of all-reduce times into all-gather / reduce-scatter times, the linear fits), so that the cost model built
on them reproduces Galvatron's numbers. Every problem raises SpecError naming the request field.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from solvers.errors import SpecError, shown
from solvers.json_file import json_kind, read_json_file

TimeMode = Literal["static", "batch"]

_PROFILES = ("cost_model", "profiles_dir")
_HARDWARE = ("cost_model", "hardware_dir")


@dataclass(frozen=True)
class LinearFit:
    """``y = slope * x + intercept`` (Galvatron fits collective times and batched layer times this way), never
    below zero: a line fitted to noisy or falling times goes negative at sizes it was not measured at (a fraction
    of a sample under TP, a message larger than any profiled), and a negative time gave a negative step time."""

    slope: float
    intercept: float

    def __call__(self, x: float) -> float:
        return max(0.0, self.slope * x + self.intercept)


def linear_fit(x: list[float], y: list[float]) -> LinearFit:
    # Least squares, the optimum scipy's curve_fit converges to for a linear model.
    slope, intercept = np.polyfit(np.asarray(x, dtype=float), np.asarray(y, dtype=float), 1)
    return LinearFit(float(slope), float(intercept))


@dataclass(frozen=True)
class OtherMemory:
    """Embedding + LM head memory of one pipeline position (MB), by vocabulary TP degree."""

    model_states: dict[int, float]
    activation: dict[int, float]  # per sample of the micro-batch


@dataclass(frozen=True)
class PerSampleTime:
    """Forward time (ms) of ``b`` samples as Galvatron derives it: a constant per-sample time (static
    mode: ``b * ms``) or a linear fit of the profiled batch times (batch mode: ``slope * b + intercept``)."""

    ms_per_sample: float | None = None
    fit: LinearFit | None = None

    def batch_ms(self, samples: float) -> float:
        if self.fit is not None:
            return self.fit(samples)
        assert self.ms_per_sample is not None
        return self.ms_per_sample * samples


@dataclass(frozen=True)
class GalvatronProfile:
    name: str
    precision: str
    seq_length: int
    sequence_parallel: bool  # which memory variant was read (``layertype_0_sp`` or ``layertype_0``)
    parameter_mb: float  # one layer, unsharded
    activation_mb_per_sample: dict[int, float]  # by TP degree
    checkpoint_activation_mb_per_sample: float
    other_pp_off: OtherMemory
    other_pp_first: OtherMemory
    other_pp_last: OtherMemory
    layer_time: PerSampleTime
    other_time: PerSampleTime


@dataclass(frozen=True)
class CollectiveTable:
    """Measured collective times of one group size: exact message sizes (bytes -> ms) and a linear fit in MB."""

    ms_by_bytes: dict[int, float]
    fit: LinearFit


@dataclass(frozen=True)
class GalvatronHardware:
    nodes: int
    gpus_per_node: int
    # ms per MB of all-reduce bus traffic: keys "<N>" (whole cluster), "<d>_0" / "<d>_1" (groups of d,
    # non-contiguous / contiguous ranks), "1" (no communication) — Galvatron's comm_coe_dict.
    comm_coe: dict[str, float]
    p2p_coe: dict[int, float]  # ms per MB by pipeline degree
    overlap_coe: float
    sp_allreduce: dict[int, CollectiveTable] = field(default_factory=dict)
    sp_all2all: dict[int, CollectiveTable] = field(default_factory=dict)

    def coe(self, size: int, consecutive: int | None = None) -> float:
        """Galvatron's coefficient lookup: the exact key "<size>" when present, else "<size>_<consec>"."""
        if consecutive is None and str(size) in self.comm_coe:
            return self.comm_coe[str(size)]
        key = f"{size}_{1 if consecutive is None else consecutive}"
        if key not in self.comm_coe:
            raise SpecError.at(_HARDWARE, f"no all-reduce bandwidth for a group of {size} GPUs "
                                          f"(have: {', '.join(sorted(self.comm_coe))})")
        return self.comm_coe[key]


# Galvatron's files hold measurements (ms, MB, GB/s). A value that is none of these, such as NaN, Infinity
# or 1e308 ms, priced every plan at inf, and the planner answered that no legal strategy exists.
_MAX_MEASURED = 1e12


def _measured(value: Any, loc: tuple[str, ...], what: str, *, positive: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise SpecError.at(loc, f"{what} is not a number: {shown(value)}") from None
    if not (math.isfinite(x) and (x > 0 if positive else x >= 0) and x <= _MAX_MEASURED):
        sign = "positive" if positive else "non-negative"
        raise SpecError.at(loc, f"{what} must be a {sign} number up to {_MAX_MEASURED:g}, got {shown(value)}")
    return x


def _object(value: Any, loc: tuple[str, ...], what: str) -> dict[str, Any]:
    """``value`` where it is a JSON object. A damaged file (a key holding null, a number or a list where
    Galvatron writes an object) raised TypeError / AttributeError from deep in a reader."""
    if not isinstance(value, dict):
        raise SpecError.at(loc, f"{what} is {json_kind(value)}, not a JSON object")
    return value


def _entry(d: Mapping[str, Any], key: str, loc: tuple[str, ...], what: str) -> Any:
    if key not in d:
        raise SpecError.at(loc, f"{what} lacks {key!r}")
    return d[key]


def _int_keys(d: Any, what: str) -> dict[int, float]:
    return {int(k): _measured(v, _PROFILES, f"{what}[{k!r}]")
            for k, v in _object(d, _PROFILES, what).items() if str(k).isdecimal()}


def _by_seq(value: Any, seq: int, what: str) -> Any:
    """Galvatron 2.4.0 keys profiles by sequence length; older files have no such level."""
    if not isinstance(value, dict):
        raise SpecError.at(_PROFILES, f"{what} is not an object")
    if any(k in value for k in ("parameter_size", "model_states")):
        return value
    if str(seq) not in value:
        have = ", ".join(sorted(value))
        raise SpecError.at(("training", "seq_length"), f"{what} has no profile for sequence length {seq} "
                                                      f"(profiled: {have})")
    return _object(value[str(seq)], _PROFILES, f"{what}[{str(seq)!r}]")


def _other_memory(mem: dict[str, Any], key: str, seq: int) -> OtherMemory:
    if key not in mem:
        raise SpecError.at(_PROFILES, f"memory profile lacks {key!r}")
    v = _by_seq(mem[key], seq, key)
    ms, act = _entry(v, "model_states", _PROFILES, key), _entry(v, "activation", _PROFILES, key)
    if not isinstance(ms, dict):  # old non-SP files: scalars, valid for vocabulary TP 1 only
        ms, act = {"1": ms}, {"1": act}
    return OtherMemory(_int_keys(ms, f"{key}.model_states"), _int_keys(act, f"{key}.activation"))


_BSZ_SEQ = re.compile(r"_bsz(\d+)(?:_seq(\d+))?$")


def _time_entries(times: dict[str, Any], prefix: str, seq: int) -> list[tuple[int, float]]:
    """(batch size, ms per sample) of the keys Galvatron matches by ``prefix``, in file order.

    Galvatron takes keys by prefix alone; we also drop keys of another sequence length so that a file
    profiled at several lengths cannot silently lend the wrong one.
    """
    out: list[tuple[int, float]] = []
    for k, v in times.items():
        if not k.startswith(prefix):
            continue
        m = _BSZ_SEQ.search(k)
        if m is None:
            continue
        if m.group(2) is not None and int(m.group(2)) != seq:
            continue
        if int(m.group(1)) == 0:
            raise SpecError.at(_PROFILES, f"computation profile {k!r} times a batch of 0 samples")
        out.append((int(m.group(1)), _measured(v, _PROFILES, f"computation profile {k!r}")))
    return out


def _per_sample_time(times: dict[str, Any], prefix: str, seq: int, mode: TimeMode,
                     static_bsz: int | None) -> PerSampleTime:
    entries = _time_entries(times, prefix, seq)
    if not entries:
        raise SpecError.at(_PROFILES, f"computation profile has no {prefix}* time for sequence length {seq}")
    if mode == "batch":
        # distinct sizes: keys of one size (old and new style, or several names) fit no line (LinAlgError at
        # size 0, an arbitrary line otherwise)
        sizes = len({b for b, _ in entries})
        if sizes < 8:
            raise SpecError.at(("cost_model", "time_profile_mode"),
                               f"batch mode fits {prefix}* over at least 8 batch sizes; the profile has {sizes}")
        return PerSampleTime(fit=linear_fit([b for b, _ in entries], [t * b for b, t in entries]))
    if static_bsz is None:
        return PerSampleTime(ms_per_sample=entries[0][1])  # Galvatron: the first matching key
    for b, t in entries:
        if b == static_bsz:
            return PerSampleTime(ms_per_sample=t)
    raise SpecError.at(("cost_model", "static_bsz"), f"no {prefix}* time profiled at batch size {static_bsz} "
                                                    f"(have {sorted(b for b, _ in entries)})")


def _profile_names(profiles_dir: str, precision: str) -> list[str]:
    try:
        files = os.listdir(profiles_dir)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise SpecError.at(_PROFILES, f"cannot list {profiles_dir}: {err}") from None
    pre_t, pre_m = f"computation_profiling_{precision}_", f"memory_profiling_{precision}_"
    names = {f[len(pre_t):-5] for f in files if f.startswith(pre_t) and f.endswith(".json")}
    return sorted(n for n in names if f"{pre_m}{n}.json" in files)


def _has_layer_profiles(profiles_dir: str, precision: str, name: str) -> bool:
    mem = read_json_file(os.path.join(profiles_dir, f"memory_profiling_{precision}_{name}.json"), _PROFILES)
    tim = read_json_file(os.path.join(profiles_dir, f"computation_profiling_{precision}_{name}.json"), _PROFILES)
    return (isinstance(mem, dict) and any(k.startswith("layertype_0") for k in mem)
            and isinstance(tim, dict) and any(k.startswith("layertype_0_") for k in tim))


def resolve_profile_name(profiles_dir: str, precision: str, name: str | None) -> str:
    """The profile to read: ``name`` if given, else the only pair of files with per-layer profiles."""
    if name is not None:
        return name
    usable = [n for n in _profile_names(profiles_dir, precision) if _has_layer_profiles(profiles_dir, precision, n)]
    if len(usable) == 1:
        return usable[0]
    if not usable:
        raise SpecError.at(_PROFILES, f"no computation_profiling_{precision}_*.json / memory_profiling_"
                                      f"{precision}_*.json pair with per-layer profiles in {profiles_dir}")
    raise SpecError.at(("cost_model", "profile_name"),
                       f"several profiles in {profiles_dir}; choose one of {', '.join(usable)}")


def read_profile(profiles_dir: str, *, precision: str, seq_length: int, sequence_parallel: bool,
                 name: str | None = None, time_mode: TimeMode = "static",
                 static_bsz: int | None = None) -> GalvatronProfile:
    name = resolve_profile_name(profiles_dir, precision, name)
    mem = _object(read_json_file(os.path.join(profiles_dir, f"memory_profiling_{precision}_{name}.json"), _PROFILES),
                  _PROFILES, f"memory profile {name}")
    tim = _object(read_json_file(os.path.join(profiles_dir, f"computation_profiling_{precision}_{name}.json"),
                             _PROFILES), _PROFILES, f"computation profile {name}")
    suffix = "_sp" if sequence_parallel else ""
    layer_key = f"layertype_0{suffix}"
    if layer_key not in mem:
        raise SpecError.at(("cost_model", "sequence_parallel"),
                           f"memory profile {name} has no {layer_key!r} (profiled with sequence parallelism "
                           f"{'off' if sequence_parallel else 'on'} only?)")
    layer = _by_seq(mem[layer_key], seq_length, layer_key)
    acts = _object(_entry(layer, "tp_activation_per_bsz_dict", _PROFILES, layer_key), _PROFILES,
                   f"{layer_key}.tp_activation_per_bsz_dict")
    if "checkpoint" not in acts:
        raise SpecError.at(_PROFILES, f"{layer_key} lacks the checkpoint activation size")
    return GalvatronProfile(
        name=name,
        precision=precision,
        seq_length=seq_length,
        sequence_parallel=sequence_parallel,
        parameter_mb=_measured(_entry(layer, "parameter_size", _PROFILES, layer_key), _PROFILES,
                               f"{layer_key}.parameter_size"),
        activation_mb_per_sample=_int_keys(acts, f"{layer_key}.tp_activation_per_bsz_dict"),
        checkpoint_activation_mb_per_sample=_measured(acts["checkpoint"], _PROFILES,
                                                      f"{layer_key}.tp_activation_per_bsz_dict.checkpoint"),
        other_pp_off=_other_memory(mem, f"other_memory_pp_off{suffix}", seq_length),
        other_pp_first=_other_memory(mem, f"other_memory_pp_on_first{suffix}", seq_length),
        other_pp_last=_other_memory(mem, f"other_memory_pp_on_last{suffix}", seq_length),
        layer_time=_per_sample_time(tim, "layertype_0_", seq_length, time_mode, static_bsz),
        other_time=_per_sample_time(tim, "layertype_other_", seq_length, time_mode, static_bsz),
    )


def _comm_coe(bandwidth: Any, num_gpus: int, path: str) -> dict[str, float]:
    """Galvatron's comm_coe_dict: the whole cluster contiguous, then halving group sizes both ways."""
    bandwidth = _object(bandwidth, _HARDWARE, path)
    def bw(size: int, consec: int) -> float:
        key = f"allreduce_size_{size}_consec_{consec}"
        if key not in bandwidth:
            raise SpecError.at(_HARDWARE, f"{path} lacks {key}")
        return _measured(bandwidth[key], _HARDWARE, f"{path} {key}", positive=True)

    coe: dict[str, float] = {}
    if num_gpus >= 2:
        coe[str(num_gpus)] = 1.0 / bw(num_gpus, 1)
    d = num_gpus // 2
    while d >= 2:
        coe[f"{d}_0"] = 1.0 / bw(d, 0)
        coe[f"{d}_1"] = 1.0 / bw(d, 1)
        d //= 2
    coe["1"] = 0.0
    return coe


_SP_TIME_KEY = re.compile(r"_size_(\d+)_(\d+)MB_time$")


def _collective_tables(sp_time: dict[str, Any], op: str) -> dict[int, CollectiveTable]:
    """Galvatron's remap_config: per group size, ms by message bytes and a linear fit over MB.

    All-reduce times are halved: a Megatron-SP layer's collectives are all-gathers and reduce-scatters,
    each half an all-reduce.
    """
    raw: dict[int, dict[int, float]] = {}
    for key, val in sp_time.items():
        if not key.startswith(op):
            continue
        m = _SP_TIME_KEY.search(key)
        if m is None:
            raise SpecError.at(_HARDWARE, f"sp_time key {key!r} is not {op}_size_<GPUs>_<MB>MB_time")
        world, mb = int(m.group(1)), int(m.group(2))
        ms = _measured(val, _HARDWARE, f"sp_time {key}")
        raw.setdefault(world, {})[mb * 1024 * 1024] = ms / (2 if op == "allreduce" else 1)
    out = {}
    for world, table in raw.items():
        if len(table) < 8:
            raise SpecError.at(_HARDWARE, f"sp_time has {len(table)} {op} sizes for {world} GPUs; at least 8 needed")
        fit = linear_fit([b // (1024 * 1024) for b in table], list(table.values()))
        out[world] = CollectiveTable(table, fit)
    return out


def _find(dirs: Sequence[str], name: str) -> str:
    """The first ``dirs/name`` that exists (else the first candidate, so the error names it)."""
    for d in dirs:
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return os.path.join(dirs[0], name)


def read_hardware(hardware_dir: str | Sequence[str], *, nodes: int, gpus_per_node: int,
                  need_sp_time: bool = False) -> GalvatronHardware:
    dirs = [hardware_dir] if isinstance(hardware_dir, str) else list(hardware_dir)
    if not dirs:
        raise SpecError.at(_HARDWARE, "no hardware folder given")
    shape = f"{nodes}nodes_{gpus_per_node}gpus_per_node"
    num_gpus = nodes * gpus_per_node
    ar_path = _find(dirs, f"allreduce_bandwidth_{shape}.json")
    p2p_path = _find(dirs, f"p2p_bandwidth_{shape}.json")
    ov_path = _find(dirs, "overlap_coefficient.json")
    comm = _comm_coe(read_json_file(ar_path, _HARDWARE), num_gpus, ar_path)
    p2p: dict[int, float] = {}
    for k, v in _object(read_json_file(p2p_path, _HARDWARE), _HARDWARE, p2p_path).items():
        if not k.startswith("pp_size_"):
            continue
        if not k[len("pp_size_"):].isdecimal():
            raise SpecError.at(_HARDWARE, f"{p2p_path} key {k!r} is not pp_size_<pipeline degree>")
        p2p[int(k[len("pp_size_"):])] = 1.0 / _measured(v, _HARDWARE, f"{p2p_path} {k}", positive=True)
    overlap = read_json_file(ov_path, _HARDWARE)
    if not isinstance(overlap, dict) or "overlap_coe" not in overlap:
        raise SpecError.at(_HARDWARE, f"{ov_path} lacks overlap_coe")
    sp_allreduce: dict[int, CollectiveTable] = {}
    sp_all2all: dict[int, CollectiveTable] = {}
    sp_path = _find(dirs, f"sp_time_{shape}.json")
    if need_sp_time or os.path.exists(sp_path):
        sp = _object(read_json_file(sp_path, _HARDWARE), _HARDWARE, sp_path)
        sp_allreduce, sp_all2all = _collective_tables(sp, "allreduce"), _collective_tables(sp, "all2all")
    overlap_coe = _measured(overlap["overlap_coe"], _HARDWARE, f"{ov_path} overlap_coe")
    return GalvatronHardware(nodes=nodes, gpus_per_node=gpus_per_node, comm_coe=comm, p2p_coe=p2p,
                             overlap_coe=overlap_coe, sp_allreduce=sp_allreduce, sp_all2all=sp_all2all)
