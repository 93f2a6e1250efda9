"""Parallel strategies: what a plan decides, per layer and per pipeline.

Conventions (fixed by ``../shared/contract/plan-api.md``, extended here):
- Each layer runs on the ``N / pp`` GPUs of its pipeline stage, split as ``tp * cp * dp`` (MoE layers may
  use ``ep`` inside ``dp``: experts sharded over ``ep`` ranks of the data-parallel group).
- ``tp`` is the size of the layer's tensor group. With ``sp = "megatron"`` it is Megatron tensor
  parallelism with sequence parallelism on that group; with ``sp = None`` plain Megatron TP; with
  ``sp = "ulysses"`` the same group instead runs DeepSpeed-Ulysses sequence parallelism (weights are
  replicated in it, the sequence is split, all-to-all around attention) — Galvatron's convention.
- ``cp`` is ring-attention context parallelism (sequence split, KV exchanged in a ring).
- MoE layers re-read their ranks for the experts as ``etp * ep * expert-dp`` (expert TP innermost); see
  ``solvers.cost_model.moe``. ``lsh`` compresses their all-to-alls (LSH-MoE, approximate).
- A micro-batch is ``global_batch_size / micro_batches`` samples for the whole stage; a layer with data
  parallel degree ``dp`` processes ``that / dp`` samples per rank (so ``dp`` may differ per layer).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, get_args

SpKind = Literal["megatron", "ulysses"] | None
Recompute = Literal["none", "selective", "full"]
Schedule = Literal["gpipe", "1f1b", "interleaved"]
SP_KINDS: tuple[SpKind, ...] = (None, "megatron", "ulysses")
RECOMPUTE_MODES: tuple[Recompute, ...] = get_args(Recompute)
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)


@dataclass(frozen=True, slots=True)
class LayerStrategy:
    tp: int = 1
    dp: int = 1
    cp: int = 1
    sp: SpKind = None
    zero: int = 0
    recompute: Recompute = "none"
    ep: int = 1
    # MoE layers only (parallel folding: the layer's tp*cp*dp ranks re-read as etp * ep * expert-dp):
    etp: int | None = None  # expert tensor parallelism; None = as the layer's MLP (tp; 1 under Ulysses)
    lsh: bool = False  # LSH-MoE compression of the all-to-alls (approximate)

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp

    @property
    def expert_tp(self) -> int:
        if self.etp is not None:
            return self.etp
        return 1 if self.sp == "ulysses" else self.tp

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key, default in (("ep", 1), ("etp", None), ("lsh", False)):
            if d[key] == default:
                d.pop(key)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerStrategy:
        known = {k: d[k] for k in ("tp", "dp", "cp", "sp", "zero", "recompute", "ep", "etp", "lsh") if k in d}
        return cls(**known)


@dataclass(frozen=True, slots=True)
class EmbeddingStrategy:
    """Strategy of the embedding and LM head (vocabulary-parallel over tp, replicated over dp).

    ``sp = "ulysses"``: the tp group splits the sequence instead of the vocabulary (weights replicated in
    it), as Galvatron's vocabulary sequence parallelism (``vsp``).
    """

    tp: int = 1
    dp: int = 1
    zero: int = 0
    sp: SpKind = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.sp is None:
            d.pop("sp")
        return d


@dataclass(frozen=True)
class PlanStrategy:
    pp: int
    micro_batches: int
    layers: tuple[LayerStrategy, ...]
    stage_layers: tuple[int, ...]
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    embedding: EmbeddingStrategy = field(default_factory=EmbeddingStrategy)

    def __post_init__(self) -> None:
        if len(self.stage_layers) != self.pp:
            raise ValueError(f"stage_layers has {len(self.stage_layers)} entries for pp={self.pp}")
        if sum(self.stage_layers) != len(self.layers):
            raise ValueError(f"stage_layers sum to {sum(self.stage_layers)} but there are {len(self.layers)} layers")

    def stage_of_layer(self) -> list[int]:
        out: list[int] = []
        for s, n in enumerate(self.stage_layers):
            out.extend([s] * n)
        return out

    def with_layers(self, layers: tuple[LayerStrategy, ...]) -> PlanStrategy:
        return replace(self, layers=layers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pp": self.pp,
            "micro_batches": self.micro_batches,
            "schedule": self.schedule,
            "virtual_stages": self.virtual_stages,
            "stage_layers": list(self.stage_layers),
            "layers": [layer.to_dict() for layer in self.layers],
            "embedding": self.embedding.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlanStrategy:
        layers = tuple(LayerStrategy.from_dict(x) for x in d["layers"])
        return cls(
            pp=int(d["pp"]),
            micro_batches=int(d["micro_batches"]),
            layers=layers,
            stage_layers=tuple(int(x) for x in d["stage_layers"]),
            schedule=d.get("schedule", "1f1b"),
            virtual_stages=int(d.get("virtual_stages", 1)),
            embedding=EmbeddingStrategy(**d.get("embedding", {})),
        )
