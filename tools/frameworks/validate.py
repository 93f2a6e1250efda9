#!/usr/bin/env python3
"""Parse an export with the training framework's own code and say what it understood.

Run with the frameworks venv's python (``tools/frameworks/setup.sh``):

    validate.py megatron|deepspeed|torchtitan|galvatron FILE --gpus N [--gpu-arch 8|9|10] [--num-layers L]
    validate.py FRAMEWORK --batch FILE... --gpus N ...      one JSON object a line, in order
    validate.py FRAMEWORK --serve                           JSON requests on stdin, one answer a line

Prints ``{"accepted": bool, "error": str | null, "read_back": {...}}``: ``read_back`` holds what the framework
parsed, under names shared by the frameworks (world_size, tp, pp, dp, cp, ep, virtual_pp, micro_batch_size,
global_batch_size, grad_accumulation, zero_stage, recompute, sequence_parallel, num_layers, hidden_size) and a
few of its own. Exit 0 whether the export is accepted or not; 2 for misuse. A ``--serve`` request is
``{"file": ..., "gpus": N, "gpu_arch": 9, "num_layers": L}``. See README.md beside this file for what each
validator runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import shlex
import sys
import tomllib
import traceback
import types
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# Megatron-LM's training code is not on PyPI: a read-only copy of megatron/training lies in shared/ (its README).
MEGATRON_LM = Path(os.environ.get("PARAPLAN_MEGATRON_LM", ROOT.parent / "shared" / "reference" / "megatron-lm"))
FRAMEWORKS = ("megatron", "deepspeed", "torchtitan", "galvatron")


class Refused(Exception):
    """The framework refused the export (its message)."""


@dataclass(frozen=True)
class Job:
    path: Path
    gpus: int
    gpu_arch: int = 9
    num_layers: int | None = None  # the model's layer count, for frameworks whose file does not carry it


# ------------------------------------------------------------------------------------------------ helpers
def command_line(text: str, entry: tuple[str, ...]) -> list[str]:
    """The arguments of a shell command line as a shell reads them (comments dropped, backslash-newline joined),
    after the training entry point (``pretrain_gpt.py``, ``-m torchtitan.train``) where one is written."""
    tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    for i, tok in enumerate(tokens):
        if tok.endswith(entry):
            return tokens[i + 1:]
    return tokens


def _fake_world(n: int) -> None:
    """A torch.distributed world of ``n`` ranks in this process (PyTorch's fake backend: no communication), so
    that the frameworks' own world-size and process-group code runs as on ``n`` GPUs."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() == n:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)


def _most(values: list[Any]) -> Any:
    """A per-layer value: the value itself where every layer has it, else the list."""
    return values[0] if len(set(values)) == 1 else values


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """Frameworks print their arguments and logs: keep them off stdout (the answer's channel)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield buf


# ------------------------------------------------------------------------------------------------ Megatron-LM
class Megatron:
    """megatron/training/arguments.py (Megatron-LM core_r0.19.0, from shared/) on megatron-core 0.19.2:
    ``parse_args()`` then ``validate_args(args, {})`` as pretrain_gpt.py runs them, then Megatron-Core's
    ``ConstantNumMicroBatchesCalculator`` (the number of micro-batches a step)."""

    def __init__(self) -> None:
        import typing

        import typing_extensions

        if not hasattr(typing, "override"):  # megatron/training imports typing.override (Python 3.12)
            typing.override = typing_extensions.override  # type: ignore[attr-defined]
        if not (MEGATRON_LM / "megatron" / "training" / "arguments.py").is_file():
            raise SystemExit(f"validate.py: Megatron-LM's training code not found at {MEGATRON_LM}")
        sys.path.insert(0, str(MEGATRON_LM))
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"  # Megatron requires it at launch with TP or CP > 1
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        with _quiet():
            import torch
            from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
            from megatron.training import arguments
        self.torch, self.arguments, self.calculator = torch, arguments, ConstantNumMicroBatchesCalculator

    def validate(self, job: Job) -> dict[str, Any]:
        argv = command_line(job.path.read_text(), ("pretrain_gpt.py", "pretrain_mamba.py", ".py"))
        # validate_args asks CUDA for the GPU's architecture: answer for the request's GPU
        self.arguments.get_device_arch_version = lambda: job.gpu_arch
        self.torch.cuda.get_device_capability = lambda *a, **k: (job.gpu_arch, 0)
        os.environ["WORLD_SIZE"], os.environ["RANK"] = str(job.gpus), "0"
        old_argv, sys.argv = sys.argv, ["pretrain_gpt.py", *argv]
        err = io.StringIO()
        try:
            with _quiet(), contextlib.redirect_stderr(err):
                try:
                    args = self.arguments.parse_args()
                except SystemExit:  # argparse: usage and "error: ..." on stderr
                    lines = [x for x in err.getvalue().splitlines() if "error:" in x]
                    raise Refused(lines[-1].split("error:", 1)[1].strip() if lines else err.getvalue()) from None
                self.arguments.validate_args(args, {})
                micro = self.calculator(args.global_batch_size, args.micro_batch_size, args.data_parallel_size,
                                        False, 0).get()
        finally:
            sys.argv = old_argv
        return self.read_back(args, micro)

    @staticmethod
    def read_back(args: Any, micro_batches: int) -> dict[str, Any]:
        if getattr(args, "use_megatron_fsdp", False):
            zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}.get(
                args.data_parallel_sharding_strategy)
        else:
            zero = 1 if args.use_distributed_optimizer else 0  # the distributed optimizer shards optimizer states
        return {
            "world_size": args.world_size, "tp": args.tensor_model_parallel_size,
            "pp": args.pipeline_model_parallel_size, "dp": args.data_parallel_size,
            "cp": args.context_parallel_size, "ep": args.expert_model_parallel_size,
            "etp": args.expert_tensor_parallel_size,
            "virtual_pp": args.virtual_pipeline_model_parallel_size or 1,
            "micro_batch_size": args.micro_batch_size, "global_batch_size": args.global_batch_size,
            "grad_accumulation": micro_batches, "zero_stage": zero,
            "distributed_optimizer": bool(args.use_distributed_optimizer),
            "recompute": args.recompute_granularity or "none", "recompute_method": args.recompute_method,
            "recompute_num_layers": args.recompute_num_layers,
            "sequence_parallel": bool(args.sequence_parallel),
            "num_layers": args.num_layers, "hidden_size": args.hidden_size,
            "num_attention_heads": args.num_attention_heads, "num_query_groups": args.num_query_groups,
            "ffn_hidden_size": args.ffn_hidden_size, "seq_length": args.seq_length,
            "first_stage_layers": args.decoder_first_pipeline_num_layers,
            "last_stage_layers": args.decoder_last_pipeline_num_layers,
            "num_experts": args.num_experts, "moe_layer_freq": args.moe_layer_freq,
            "bf16": bool(args.bf16),
        }


# ------------------------------------------------------------------------------------------------ DeepSpeed
class DeepSpeed:
    """``deepspeed.runtime.config.DeepSpeedConfig`` (DeepSpeed 0.19.8) on a world of ``--gpus`` ranks, with what
    ``deepspeed.initialize`` passes it: a PipelineModule's grid as ``mpu``
    (``PipeDataParallelTopology(num_pp=pipeline.stages, num_dp=world // stages)``, or
    ``PipeModelDataParallelTopology`` with ``num_mp = tensor_parallel.autotp_size``) where the config asks for
    pipeline stages; else the (data_parallel, sequence_parallel) mesh where the config gives both sizes; else
    nothing (then DeepSpeed takes the data-parallel world as all GPUs over ``sequence_parallel_size``: AutoTP's
    ``tensor_parallel.autotp_size`` does not enter the batch check unless the model code passes an ``mpu``).
    Then PipelineEngine's start-up check on ZeRO (pipe/engine.py)."""

    def __init__(self) -> None:
        with _quiet():
            # the shared-memory all-reduce kernel (a CPU speed-up) is JIT-compiled when the communication backend
            # starts (a minute of g++, and a lock file that a killed run leaves behind makes the next one wait
            # forever): configuration parsing never uses it. The module by name: `import deepspeed.comm.torch as m`
            # binds deepspeed.comm's attribute `torch`, which is the torch package it imported
            ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
            ds_torch_comm.build_shm_op = lambda: None
            import deepspeed.comm as ds_dist
            from deepspeed.runtime.config import DeepSpeedConfig
            from deepspeed.runtime.pipe.topology import (
                PipeDataParallelTopology,
                PipelineParallelGrid,
                PipeModelDataParallelTopology,
            )
            from deepspeed.runtime.tensor_parallel.init_utils import load_ds_config
            from deepspeed.runtime.zero.config import ZeroStageEnum
        self.dist, self.config_class = ds_dist, DeepSpeedConfig
        self.topology, self.grid, self.zero_enum = PipeDataParallelTopology, PipelineParallelGrid, ZeroStageEnum
        self.mp_topology, self.load = PipeModelDataParallelTopology, load_ds_config

    def validate(self, job: Job) -> dict[str, Any]:
        try:  # as deepspeed.initialize reads a config file: hjson, a duplicate key refused
            cfg = self.load(str(job.path))
        except Exception as e:
            raise Refused(f"{type(e).__name__}: {e}") from None
        if not isinstance(cfg, dict):
            raise Refused("a DeepSpeed config is a JSON object")
        with _quiet():
            _fake_world(job.gpus)
            if self.dist.cdb is None:
                self.dist.init_distributed(dist_backend="fake", auto_mpi_discovery=False)
            stages = (cfg.get("pipeline") or {}).get("stages", "auto")
            mpu = None
            autotp = (cfg.get("tensor_parallel") or {}).get("autotp_size") or 1
            if isinstance(stages, int) and stages > 1:
                # the model code is a PipelineModule(num_stages=stages), its topology with the config's TP degree
                if job.gpus % (stages * autotp):
                    raise Refused(f"{job.gpus} GPUs do not split into {stages} pipeline stages x TP {autotp}")
                topology = self.topology(num_pp=stages, num_dp=job.gpus // stages) if autotp == 1 else \
                    self.mp_topology(num_pp=stages, num_mp=autotp, num_dp=job.gpus // stages // autotp)
                mpu = self.grid(topology=topology)
            mesh = None
            if mpu is None and "sequence_parallel_size" in cfg and "data_parallel_size" in cfg:
                # deepspeed.initialize builds this mesh from the config itself
                mesh = self.dist.initialize_mesh_device((cfg["data_parallel_size"], cfg["sequence_parallel_size"]),
                                                        ("data_parallel", "sequence_parallel"))
            c = self.config_class(cfg, mpu=mpu, mesh_device=mesh)
            if mpu is not None and c.zero_optimization_stage >= self.zero_enum.gradients:
                # PipelineEngine.__init__ (deepspeed/runtime/pipe/engine.py)
                raise Refused("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
        pp = stages if mpu is not None else 1
        tp = c.tensor_parallel_config.autotp_size or 1
        sp = cfg.get("sequence_parallel_size", 1)
        ac = c.activation_checkpointing_config
        return {
            "world_size": job.gpus, "pp": pp, "tp": tp, "dp": int(c.world_size), "ulysses_sp": sp,
            "micro_batch_size": c.train_micro_batch_size_per_gpu, "global_batch_size": c.train_batch_size,
            "grad_accumulation": c.gradient_accumulation_steps, "zero_stage": int(c.zero_optimization_stage),
            "activation_checkpointing": {k: getattr(ac, k) for k in (
                "partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
                "number_checkpoints")} if "activation_checkpointing" in cfg else None,
            "bf16": bool(c.bfloat16_config.enabled),
        }


# ------------------------------------------------------------------------------------------------ torchtitan
class Torchtitan:
    """torchtitan 0.3.0: ``ConfigManager().parse_args(argv)`` (``--module``/``--config`` name a config function
    of the model's ``config_registry``; ``--section.key value`` and ``activation-checkpoint:MODE`` override it;
    tyro parses them and ``Trainer.Config.__post_init__`` checks them), then what ``Trainer.__init__`` checks
    before it touches a GPU: ``ParallelDims.from_config`` on ``--gpus`` ranks, the sequence-length divisor, the
    global batch over local batch x data-parallel degree (gradient accumulation), and the pipeline's model parts
    (``_get_pipeline_metadata`` / ``_generate_llm_fqn_per_model_part`` / ``_get_pp_rank_to_stage_indices_mapping``
    of torchtitan/distributed/pipeline_parallel.py). torchtitan 0.3.0 reads no TOML file: one is refused with
    the framework's own answer to it."""

    def __init__(self) -> None:
        with _quiet():
            from torchtitan.config import ConfigManager
            from torchtitan.distributed import ParallelDims
            from torchtitan.distributed import pipeline_parallel as pp
        self.manager, self.dims, self.pp = ConfigManager, ParallelDims, pp

    def validate(self, job: Job) -> dict[str, Any]:
        text = job.path.read_text()
        try:
            tomllib.loads(text)
            is_toml = any(line.strip().startswith("[") for line in text.splitlines())
        except tomllib.TOMLDecodeError:
            is_toml = False
        # torchtitan <= 0.2 ran `--job.config_file FILE.toml`; 0.3.0 has no such option: let it say so
        argv = ["--job.config_file", str(job.path)] if is_toml else command_line(text, ("torchtitan.train",
                                                                                          "train.py"))
        err = io.StringIO()
        with _quiet(), contextlib.redirect_stderr(err):
            try:
                config = self.manager().parse_args(argv)
            except SystemExit:  # tyro: a usage message on stderr
                raise Refused(_tyro_error(err.getvalue())) from None
            except (ValueError, ImportError, AssertionError) as e:
                raise Refused(("torchtitan 0.3.0 reads no TOML file: " if is_toml else "") + str(e)) from None
            return self.trainer_checks(config, job.gpus)

    def trainer_checks(self, config: Any, world: int) -> dict[str, Any]:
        p, t = config.parallelism, config.training
        try:
            dims = self.dims.from_config(p, world)
        except AssertionError as e:
            raise Refused(str(e)) from None
        # torchtitan/trainer.py, Trainer.__init__: sequence length and global batch
        divisor = (dims.tp if p.enable_sequence_parallel else 1) * (2 * dims.cp if dims.cp > 1 else 1)
        if t.seq_len % divisor:
            raise Refused(f"Training sequence length ({t.seq_len}) must be divisible by {divisor} for the "
                          "configured sequence/context parallelism.")
        batch_degree = dims.dp_replicate * dims.dp_shard
        global_batch = t.global_batch_size if t.global_batch_size >= 0 else t.local_batch_size * batch_degree
        if global_batch <= 0 or global_batch % (t.local_batch_size * batch_degree):
            raise Refused(f"global batch size must be multiple of local batch size times data-parallel degree "
                          f"({global_batch} % ({t.local_batch_size} * {batch_degree}) != 0)")
        model = config.model_spec.model if config.model_spec is not None else None
        layers = len(model.layers) if model is not None and hasattr(model, "layers") else None
        virtual_pp, stage_layers = 1, None
        if dims.pp > 1:
            if model is None:
                raise Refused("pipeline parallelism needs a model")
            try:
                num_stages, num_layers, w_in, w_out = self.pp._get_pipeline_metadata(dims, p, model)
                parts = p.module_fqns_per_model_part or self.pp._generate_llm_fqn_per_model_part(
                    num_stages, num_layers, w_in, w_out)
                for rank in range(dims.pp):
                    self.pp._get_pp_rank_to_stage_indices_mapping(rank, dims.pp, p.pipeline_parallel_schedule,
                                                                   len(parts))
            except (ValueError, AssertionError) as e:
                raise Refused(str(e)) from None
            virtual_pp = len(parts) // dims.pp
            stage_layers = [sum(1 for m in part if m.startswith("layers.")) for part in parts]
        micro = p.pipeline_parallel_microbatch_size if dims.pp > 1 else t.local_batch_size
        ac = config.activation_checkpoint
        recompute = "none" if ac is None else {"FullAC": "full", "SelectiveAC": "selective",
                                               "MemoryBudgetAC": "memory-budget"}.get(
            type(ac).__qualname__.split(".")[0], type(ac).__qualname__)
        return {
            "world_size": world, "tp": dims.tp, "pp": dims.pp, "dp": batch_degree, "cp": dims.cp, "ep": dims.ep,
            "dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "virtual_pp": virtual_pp,
            "micro_batch_size": micro, "local_batch_size": t.local_batch_size, "global_batch_size": global_batch,
            "grad_accumulation": global_batch // (t.local_batch_size * batch_degree),
            "pipeline_microbatches": t.local_batch_size // micro if dims.pp > 1 else None,
            "recompute": recompute, "sequence_parallel": bool(p.enable_sequence_parallel and dims.tp > 1),
            "fsdp_reshard_after_forward": p.fsdp_reshard_after_forward,
            "pipeline_schedule": p.pipeline_parallel_schedule if dims.pp > 1 else None,
            "stage_layers": stage_layers, "seq_len": t.seq_len,
            "num_layers": layers, "hidden_size": getattr(model, "dim", None),
            "model": None if config.model_spec is None else f"{config.model_spec.name}/{config.model_spec.flavor}",
            "compile": bool(config.compile.enable and "model" in config.compile.components),
        }


_RULE = "-─━╭╮╰╯┏┓┗┛ "


def _tyro_error(usage: str) -> str:
    """What a tyro error message says: the lines after its first rule (log lines before it, the rules, box
    edges and the help hint dropped)."""
    lines = [line.strip().strip("│┃").strip() for line in usage.splitlines()]
    rules = [i for i, x in enumerate(lines) if x.startswith(("╭", "┏")) or (len(x) > 3 and not x.strip(_RULE))]
    if not rules:
        return usage.strip()
    said = [x for x in lines[rules[0] + 1:] if x.strip(_RULE) and not x.startswith("For full helptext")]
    return " ".join(said) or usage.strip()


# ------------------------------------------------------------------------------------------------ Galvatron
class Galvatron:
    """hetu-galvatron 2.4.0 (PyPI): ``get_hybrid_parallel_configs_api`` (galvatron/core/runtime/
    hybrid_parallel_config.py: reads the ``galvatron_config_*.json`` through ``read_json_config`` and
    ``config2strategy``, with the arguments of Galvatron's own parser, ``galvatron_training_args``), then
    ``check_hp_config`` and ``hp_config_whole_model`` as ``construct_hybrid_parallel_model_api`` runs them, and
    ``gen_comm_groups`` (the TP/SP/DP groups) on a world of ``--gpus`` ranks. ``galvatron.core``'s package
    ``__init__`` imports the CUDA training runtime; only these modules are loaded (as the peer runner does). 2.4.0
    reads ``embed_sdp`` (Galvatron's HEAD reads ``vocab_sdp``): keys it does not read are listed in
    ``ignored_keys``."""

    READ = ("pp_deg", "tp_sizes_enc", "tp_consecutive_flags", "dp_types_enc", "use_sp", "vtp", "vsp", "global_bsz",
            "chunks", "checkpoint", "pp_division", "pipeline_type", "default_dp_type", "embed_sdp")

    def __init__(self) -> None:
        with _quiet():
            import galvatron

            base = Path(galvatron.__file__).parent
            for name in ("galvatron.core", "galvatron.core.runtime"):  # the packages without their __init__
                if name not in sys.modules:
                    pkg = types.ModuleType(name)
                    pkg.__path__ = [str(base.joinpath(*name.split(".")[1:]))]
                    sys.modules[name] = pkg
            from galvatron.core.runtime import hybrid_parallel_config as hpc
            from galvatron.core.runtime.arguments import galvatron_training_args
            from galvatron.core.runtime.comm_groups import gen_comm_groups
        self.hpc, self.training_args, self.gen_comm_groups = hpc, galvatron_training_args, gen_comm_groups

    def validate(self, job: Job) -> dict[str, Any]:
        try:
            config = json.loads(job.path.read_text())
        except json.JSONDecodeError as e:
            raise Refused(f"not JSON: {e}") from None
        if not isinstance(config, dict):
            raise Refused("a Galvatron config is a JSON object")
        parser = argparse.ArgumentParser()
        self.training_args(parser, use_megatron=False)
        args, _ = parser.parse_known_args(["--galvatron_config_path", str(job.path.resolve())])
        for key, value in (("local_rank", 0), ("distributed_checkpoint", False), ("vocab_tp", 1),
                           ("vocab_sp", 0), ("embed_sdp", 0), ("chunks", 1), ("pipeline_type", "gpipe"),
                           ("default_dp_type", "ddp"), ("mixed_precision", "bf16")):
            if not hasattr(args, key):
                setattr(args, key, value)
        layers = job.num_layers or len(str(config.get("tp_sizes_enc", "")).split(","))
        info = self.hpc.ModelInfo()
        info.set_layernums([layers])
        info.set_module_types(["embed", *["gpt_dec"] * layers, "norm", "cls"])
        # hp_config_whole_model reads the run's arguments through galvatron.core.get_args (Megatron's global args
        # in the training runtime): this run's
        sys.modules["galvatron.core"].get_args = lambda: args  # type: ignore[attr-defined]
        with _quiet():
            _fake_world(job.gpus)
            try:
                hp = self.hpc.get_hybrid_parallel_configs_api(None, args, lambda *_: info)
                self.hpc.check_hp_config(hp, [layers])
                whole = self.hpc.hp_config_whole_model(info.module_types(), hp, embed_sdp=args.embed_sdp,
                                                       embed_ckpt=0, vocab_tp=args.vocab_tp, vocab_sp=args.vocab_sp)
                self.gen_comm_groups(whole["tp_sizes_whole"], whole["sp_sizes_whole"], whole["pp_deg"],
                                     whole["tp_consec_whole"], show_rank=-1)
            except (AssertionError, KeyError, ValueError, TypeError, AttributeError, ZeroDivisionError) as e:
                raise Refused(f"{type(e).__name__}: {e}" if not isinstance(e, AssertionError) else
                              (str(e) or _assert_line(e))) from None
        return self.read_back(config, hp, args, job.gpus)

    def read_back(self, config: dict[str, Any], hp: dict[str, Any], args: Any, world: int) -> dict[str, Any]:
        pp, tps = hp["pp_deg"], hp["tp_sizes_enc"]
        default_zero = {"zero2": 2, "ddp": 0, "zero3": 3}.get(hp["default_dp_type"], hp["default_dp_type"])
        zero = [3 if d == 1 else default_zero for d in hp["dp_types_enc"]]
        sp = hp["use_sp"]
        dps = [world // pp // t for t in tps]
        chunks = args.chunks
        return {
            "world_size": world, "pp": pp, "tp": _most(tps), "dp": _most(dps),
            "ulysses_sp": _most([t if s else 1 for t, s in zip(tps, sp, strict=True)]),
            "global_batch_size": hp["global_train_batch_size"], "grad_accumulation": chunks,
            "micro_batch_size": _most([hp["global_train_batch_size"] // chunks // d for d in dps]),
            "zero_stage": _most(zero), "recompute": _most(["full" if c else "none"
                                                           for c in hp["checkpoint_flags_enc"]]),
            "stage_layers": hp["pp_division"], "num_layers": len(tps), "pipeline_type": args.pipeline_type,
            "vocab_tp": hp["vocab_tp"], "vocab_sp": hp["vocab_sp"], "embed_sdp": args.embed_sdp,
            "tp_consecutive": _most(hp["tp_consecutive_flags"]),
            "layer_counts": dict(Counter(f"tp{t} zero{z} {'ckpt' if c else 'nockpt'}{' ulysses' if s else ''}"
                                         for t, z, c, s in zip(tps, zero, hp["checkpoint_flags_enc"], sp,
                                                               strict=True))),
            "ignored_keys": sorted(k for k in config if k not in self.READ),
        }


def _assert_line(e: AssertionError) -> str:
    """A bare ``assert`` has no message: the failing line of Galvatron's source."""
    tb = traceback.extract_tb(e.__traceback__)
    return f"assertion failed: {tb[-1].line} ({Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else "assertion"


VALIDATORS: dict[str, Callable[[], Any]] = {
    "megatron": Megatron, "deepspeed": DeepSpeed, "torchtitan": Torchtitan, "galvatron": Galvatron}


def answer(validator: Any, job: Job) -> dict[str, Any]:
    """One export's verdict: accepted with what was read back, or refused with the framework's words."""
    try:
        return {"accepted": True, "error": None, "read_back": validator.validate(job)}
    except Refused as e:
        return {"accepted": False, "error": str(e), "read_back": None}
    except Exception as e:  # a framework's own check that raises something else (AssertionError, ValueError...)
        said = str(e) or (_assert_line(e) if isinstance(e, AssertionError) else "")
        return {"accepted": False, "error": f"{type(e).__name__}: {said}", "read_back": None}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("framework", choices=FRAMEWORKS)
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--gpus", type=int, help="GPUs the run starts on (the world size)")
    p.add_argument("--gpu-arch", type=int, default=9, choices=(8, 9, 10),
                   help="GPU architecture major version: 8 A100, 9 H100/H200, 10 B200 (Megatron checks it)")
    p.add_argument("--num-layers", type=int, help="the model's layers (Galvatron checks the file against it)")
    p.add_argument("--batch", action="store_true", help="several FILEs: one JSON object a line")
    p.add_argument("--serve", action="store_true", help="JSON requests on stdin, one answer a line")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    a = p.parse_intermixed_args(argv)
    if not a.serve:
        if not a.files or (len(a.files) > 1 and not a.batch):
            p.error("one FILE (several with --batch)")
        if not a.gpus or a.gpus < 1:
            p.error("--gpus N is required")
        missing = [str(f) for f in a.files if not f.is_file()]
        if missing:
            p.error(f"no such file: {', '.join(missing)}")
    out = os.fdopen(os.dup(1), "w")  # the answers' channel; anything else the frameworks print goes to stderr
    os.dup2(2, 1)
    validator = VALIDATORS[a.framework]()
    if a.serve:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                job = Job(Path(req["file"]), int(req["gpus"]), int(req.get("gpu_arch", 9)), req.get("num_layers"))
                reply = answer(validator, job)
            except (KeyError, ValueError, TypeError, OSError) as e:
                reply = {"accepted": False, "error": f"bad request: {e!r}", "read_back": None}
            out.write(json.dumps(reply, default=str) + "\n")
            out.flush()
        return 0
    for f in a.files:
        reply = answer(validator, Job(f, a.gpus, a.gpu_arch, a.num_layers))
        out.write(json.dumps(reply, default=str, indent=None if a.batch else 2) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
