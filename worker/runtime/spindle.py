"""The Spindle runtime: one training iteration of a multi-task multi-modal model as a Spindle plan schedules it
(``solvers.run_spindle.SpindleProgram``: the plan's slices in start order).

Every rank walks the same list of slices, forward then in reverse. A slice's devices run its layers on their
share of the metaop's samples (data parallelism: contiguous rows, ``sample_range``). What a slice reads (the
metaop's previous slice, or its predecessors' last slices) is handed over row by row with
``torch.distributed.batch_isend_irecv`` where the row's device changes (``moves``), and kept where it does not;
the backward sends the gradients of those rows back the same way. Every rank holding a part of a module (an
embedding, a layer, a head) keeps a replica of it, initialised alike; the part's gradients are summed over
exactly those ranks, one bucketed all-reduce per group of ranks, started as soon as the backward has passed the
last slice that feeds it on this rank, as DDP overlaps its buckets with the rest of the backward (so tasks
sharing a module, and a rank that only generates with it, see the one update); each replica then takes the same
AdamW step: one optimizer step per iteration.

Models (from the plan's module shapes, ``ModuleRun``; the blocks are ``model.Block``): a causal module embeds
tokens (vocabulary ``VOCAB``) and ends in an LM head; a non-causal one embeds ``PATCH_DIM`` patch features and
ends in a projection to its successors' width. Roles (``MetaOpRun.role``): ``lm`` (next-token loss on its
task's text, its predecessors' outputs as a prefix), ``encoder``, ``rollout`` (greedy generation),
``score`` (the generated tokens' log-probabilities under a frozen or shared module) and ``update`` (a
REINFORCE-style policy loss: each sample's mean scorer log-probability as its reward, plus a squared
penalty towards the scorers' per-token log-probabilities). Every task loss is a mean over the task's whole
batch: a rank adds its rows' share. ``iteration`` runs it in a process group; ``reference_iteration`` runs the
same tasks one after another on one process (what the runtime must equal).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from solvers.run_spindle import MetaOpRun, ModuleRun, Part, SpindleProgram, StepRun, moves, sample_range
from worker.runtime.metrics import peak_memory_gib
from worker.runtime.model import Block, ModelConfig

VOCAB = 64
PATCH_DIM = 16
LR = 1e-3
Payload = dict[str, torch.Tensor]


class Stack(nn.Module):
    """One module: embedding, blocks keyed by layer index, final norm and head (parts a rank lacks are None /
    absent)."""

    def __init__(self, run: ModuleRun) -> None:
        super().__init__()
        cfg = dataclasses.replace(ModelConfig.from_spec(run.shape.model_spec()), vocab_size=VOCAB)
        h = cfg.hidden_size
        self.causal = cfg.causal
        self.embed: nn.Module | None = nn.Embedding(VOCAB, h) if cfg.causal else nn.Linear(PATCH_DIM, h)
        self.layers = nn.ModuleDict({str(i): Block(cfg, i) for i in range(cfg.num_layers)})
        self.norm: nn.Module | None = nn.RMSNorm(h, eps=cfg.norm_eps)
        out = VOCAB if cfg.causal else run.out_dim
        self.head: nn.Module | None = nn.Linear(h, out, bias=False) if out else None
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1 and "norm" in name:
                    p.fill_(1.0)
                elif p.dim() == 1:
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)

    def part(self, part: Part) -> list[nn.Module]:
        if part == "embed":
            return [m for m in (self.embed,) if m is not None]
        if part == "head":
            return [m for m in (self.norm, self.head) if m is not None]
        return [self.layers[str(part)]] if str(part) in self.layers else []

    def run_layers(self, h: torch.Tensor, start: int, count: int) -> torch.Tensor:
        for i in range(start, start + count):
            h = self.layers[str(i)](h)
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        assert self.norm is not None and self.head is not None
        return self.head(self.norm(h))


def build_stacks(program: SpindleProgram, seed: int) -> dict[str, Stack]:
    """Every module whole, identical on every rank for one seed (each from its own seed: building fewer
    modules on a rank does not change the others)."""
    out = {}
    for name, run in program.modules.items():
        torch.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        stack = Stack(run)
        if not run.trained:
            stack.requires_grad_(False)
        out[name] = stack
    return out


def task_data(op: MetaOpRun, step: int, seed: int) -> dict[str, torch.Tensor]:
    """A metaop's whole batch for ``step``: text tokens (``lm``), patch features (``encoder``), prompts
    (``rollout``); nothing for the others (they read their predecessors)."""
    g = torch.Generator().manual_seed(seed * 7919 + step * 104_729 + zlib.crc32(op.name.encode()))
    if op.role == "lm":
        return {"tokens": torch.randint(VOCAB, (op.batch, op.text_length + 1), generator=g)}
    if op.role == "encoder":
        return {"patches": torch.randn(op.batch, op.seq_length, PATCH_DIM, generator=g)}
    if op.role == "rollout":
        return {"tokens": torch.randint(VOCAB, (op.batch, op.prompt_length), generator=g)}
    return {}


# --- what a metaop computes on some of its rows (the runtime's slices and the reference share these) ---


def embed_input(stack: Stack, op: MetaOpRun, data: dict[str, torch.Tensor], reads: list[Payload]) -> torch.Tensor:
    assert stack.embed is not None
    if op.role == "encoder":
        return stack.embed(data["patches"])
    if op.role == "update":
        return stack.embed(reads[0]["tokens"][:, :-1])
    return torch.cat([r["h"] for r in reads] + [stack.embed(data["tokens"][:, :-1])], dim=1)


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, prompt: int) -> torch.Tensor:
    """Log-probabilities of the generated tokens (after ``prompt``) given the logits of the inputs
    ``tokens[:, :-1]``: (rows, generated)."""
    lp = F.log_softmax(logits[:, prompt - 1:].float(), dim=-1)
    return lp.gather(-1, tokens[:, prompt:, None]).squeeze(-1)


def finish(stack: Stack, op: MetaOpRun, h: torch.Tensor, data: dict[str, torch.Tensor],
           reads: list[Payload]) -> tuple[Payload, torch.Tensor | None]:
    """The metaop's head on its last layer's output: (what it hands its successors, its rows' share of the
    task loss, or None)."""
    if op.role == "encoder":
        return ({"h": stack.logits(h)} if stack.head is not None else {}), None
    logits = stack.logits(h)
    if op.role == "lm":
        labels = data["tokens"][:, 1:]
        ce = F.cross_entropy(logits[:, -op.text_length:].float().flatten(0, 1), labels.flatten(), reduction="sum")
        return {}, ce / (op.batch * op.text_length)
    assert op.role == "update"
    lp = token_logp(logits, reads[0]["tokens"], op.prompt_length)
    scores = torch.stack([r["logp"] for r in reads]).mean(0)  # (rows, generated)
    reward = scores.mean(1, keepdim=True)
    loss = (-reward * lp + 0.5 * (lp - scores) ** 2).sum()
    return {}, loss / (op.batch * op.decode_tokens)


@torch.no_grad()
def generate(stack: Stack, op: MetaOpRun, prompts: torch.Tensor) -> Payload:
    tokens = prompts
    for _ in range(op.decode_tokens):
        h = stack.run_layers(stack.embed(tokens), 0, len(stack.layers))  # type: ignore[misc]
        tokens = torch.cat([tokens, stack.logits(h[:, -1:]).argmax(-1)], dim=1)
    return {"tokens": tokens}


@torch.no_grad()
def score(stack: Stack, op: MetaOpRun, read: Payload) -> Payload:
    tokens = read["tokens"]
    h = stack.run_layers(stack.embed(tokens[:, :-1]), 0, len(stack.layers))  # type: ignore[misc]
    return {"tokens": tokens, "logp": token_logp(stack.logits(h), tokens, op.prompt_length)}


def payload_spec(program: SpindleProgram, step: StepRun) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Per row, the tensors a slice hands on: hidden states between slices of one metaop, else its output."""
    op = program.metaops[step.metaop]
    shape = program.modules[op.module].shape
    if not step.last:
        seq = {"lm": op.prefix_length + op.text_length, "encoder": op.seq_length,
               "update": op.prompt_length + op.decode_tokens - 1}[op.role]
        return {"h": ((seq, shape.hidden_size), torch.float32)}
    tokens = ((op.prompt_length + op.decode_tokens,), torch.int64)
    if op.role == "encoder":
        out = program.modules[op.module].out_dim
        return {"h": ((op.seq_length, out), torch.float32)} if out else {}
    if op.role == "rollout":
        return {"tokens": tokens}
    if op.role == "score":
        return {"tokens": tokens, "logp": ((op.decode_tokens,), torch.float32)}
    return {}


# --- the distributed iteration ---


def _exchange(sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]], backward: bool) -> None:
    """Post every send and receive of one hand-over together and wait for them (recvs fill their buffers).
    ``backward``: a hand-back of gradients (only the negative controls tell the two apart)."""
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer) for peer, t in sends]
    ops += [dist.P2POp(dist.irecv, t, peer) for peer, t in recvs]
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def sync_groups(program: SpindleProgram) -> dict[tuple[str, Part], tuple[int, ...]]:
    """Per trained module part, the ranks whose gradients are summed: all that hold it."""
    return {k: v for k, v in program.hosts().items() if program.modules[k[0]].trained}


@dataclass
class SpindleRunner:
    """One rank's share of a Spindle program: its module parts, groups and optimizer."""

    program: SpindleProgram
    device: torch.device
    seed: int = 0
    stacks: dict[str, Stack] = field(init=False)
    optimizer: torch.optim.Optimizer | None = field(init=False)
    groups: dict[tuple[int, ...], Any] = field(init=False)
    rank: int = field(init=False)

    def __post_init__(self) -> None:
        self.rank = dist.get_rank()
        hosts = self.program.hosts()
        stacks = build_stacks(self.program, self.seed)
        for name, stack in stacks.items():  # drop what this rank never runs
            for i in range(self.program.modules[name].shape.num_layers):
                if self.rank not in hosts.get((name, i), ()):
                    del stack.layers[str(i)]
            if self.rank not in hosts.get((name, "embed"), ()):
                stack.embed = None
            if self.rank not in hosts.get((name, "head"), ()):
                stack.norm, stack.head = None, None
        self.stacks = {n: s.to(self.device) for n, s in stacks.items()
                       if any(self.rank in r for (m, _), r in hosts.items() if m == n)}
        self.sync = sync_groups(self.program)
        self.groups = {}
        for ranks in sorted(set(hosts.values()) | set(self.sync.values())):  # every rank, the same order
            if len(ranks) > 1:
                self.groups[ranks] = dist.new_group(list(ranks))
        params = [p for s in self.stacks.values() for p in s.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0) if params else None
        self.buckets = self._sync_buckets()
        # trained parts only this rank holds: nothing to sum, but a gradient (zeros where it took no rows) all the same
        self.local_parts = [key for key, ranks in self.sync.items() if ranks == (self.rank,)]

    def _sync_buckets(self) -> list[tuple[tuple[int, ...], list[tuple[str, Part]], int]]:
        """This rank's gradient buckets, one per group of ranks holding the same parts (sorted by ranks, the same
        order on every rank): (ranks, parts, the index into ``program.steps`` of the slice whose backward
        completes them here; ``len(program.steps)`` where none of this rank's slices runs them: ready when the
        backward starts)."""
        parts: dict[tuple[int, ...], list[tuple[str, Part]]] = {}
        for key, ranks in self.sync.items():
            if self.rank in ranks and len(ranks) > 1:
                parts.setdefault(ranks, []).append(key)
        out = []
        for ranks, keys in sorted(parts.items()):
            runs = [i for i, step in enumerate(self.program.steps) if self._runs(step)
                    and any(m == self.program.metaops[step.metaop].module and p in self.program.parts(step)
                            for m, p in keys)]
            out.append((ranks, keys, min(runs, default=len(self.program.steps))))
        return out

    def _runs(self, step: StepRun) -> bool:
        a, b = self._rows(step)
        return self.rank in step.devices and a < b

    def _rows(self, step: StepRun) -> tuple[int, int]:
        return sample_range(self.program.metaops[step.metaop].batch, step.devices, self.rank)

    def _hand_over(self, src: StepRun, dst: StepRun, out: Payload | None) -> Payload:
        """Forward: the rows of ``src``'s output this rank holds in ``dst`` (received where their device changes)."""
        batch = self.program.metaops[dst.metaop].batch
        spec = payload_spec(self.program, src)
        a_src, _ = self._rows(src)
        a_dst, b_dst = self._rows(dst)
        sends: list[tuple[int, torch.Tensor]] = []
        recvs: list[tuple[int, torch.Tensor]] = []
        pieces: dict[str, list[torch.Tensor]] = {k: [] for k in spec}
        for frm, to, a, b in moves(batch, src.devices, dst.devices):
            for key, (shape, dtype) in spec.items():
                if frm == self.rank:
                    assert out is not None
                    rows = out[key][a - a_src:b - a_src].detach()
                    if to == self.rank:
                        pieces[key].append(rows)
                    else:
                        sends.append((to, rows))
                elif to == self.rank:
                    buf = torch.empty((b - a, *shape), dtype=dtype, device=self.device)
                    recvs.append((frm, buf))
                    pieces[key].append(buf)
        _exchange(sends, recvs, backward=False)
        if b_dst == a_dst:
            return {}
        trains = self.program.metaops[src.metaop].trains
        return {k: (torch.cat(v).requires_grad_() if trains and v[0].is_floating_point() else torch.cat(v))
                for k, v in pieces.items()}

    def _hand_back(self, src: StepRun, dst: StepRun, read: Payload | None, grads: dict[str, torch.Tensor]) -> None:
        """Backward of ``_hand_over``: the gradients of the rows ``dst`` read go back to where ``src`` made them
        (added into ``grads``, this rank's rows of ``src``'s output)."""
        batch = self.program.metaops[dst.metaop].batch
        spec = payload_spec(self.program, src)
        keys = [k for k, (_, dtype) in spec.items() if dtype.is_floating_point]
        a_src, b_src = self._rows(src)
        a_dst, _ = self._rows(dst)
        sends: list[tuple[int, torch.Tensor]] = []
        recvs: list[tuple[int, torch.Tensor, str, int]] = []
        for frm, to, a, b in moves(batch, src.devices, dst.devices):
            for key in keys:
                shape, dtype = spec[key]
                if to == self.rank:
                    assert read is not None
                    g = read[key].grad
                    rows = (torch.zeros((b - a, *shape), dtype=dtype, device=self.device) if g is None
                            else g[a - a_dst:b - a_dst])
                    if frm == self.rank:
                        self._add(grads, key, a - a_src, rows, b_src - a_src, spec[key])
                    else:
                        sends.append((frm, rows))
                elif frm == self.rank:
                    recvs.append((to, torch.empty((b - a, *shape), dtype=dtype, device=self.device), key, a))
        _exchange(sends, [(peer, buf) for peer, buf, _, _ in recvs], backward=True)
        for _, buf, key, a in recvs:
            self._add(grads, key, a - a_src, buf, b_src - a_src, spec[key])

    def _add(self, grads: dict[str, torch.Tensor], key: str, at: int, rows: torch.Tensor, total: int,
             spec: tuple[tuple[int, ...], torch.dtype]) -> None:
        if key not in grads:
            grads[key] = torch.zeros((total, *spec[0]), dtype=spec[1], device=self.device)
        grads[key][at:at + rows.shape[0]] += rows

    def iteration(self, step_index: int, before_step: Callable[[], None] | None = None) -> dict[str, float]:
        """One training iteration (``before_step`` is called once the gradients are synchronised, before the
        optimizer steps); every rank returns each task's loss."""
        program, me = self.program, self.rank
        outputs: dict[int, Payload] = {}  # this rank's rows of each slice's output
        reads: dict[tuple[int, int], Payload] = {}  # (slice, source slice): the rows it read
        losses: dict[int, torch.Tensor] = {}
        data: dict[str, dict[str, torch.Tensor]] = {}
        for step in program.steps:
            op = program.metaops[step.metaop]
            got = [self._hand_over(program.step(s), step, outputs.get(s)) for s in step.sources]
            for s, payload in zip(step.sources, got, strict=True):
                reads[(step.index, s)] = payload
            a, b = self._rows(step)
            if me not in step.devices or a == b:
                continue
            stack = self.stacks[op.module]
            if op.name not in data:
                data[op.name] = task_data(op, step_index, self.seed)
            rows = {k: v[a:b].to(self.device) for k, v in data[op.name].items()}
            if op.role == "rollout":
                outputs[step.index] = generate(stack, op, rows["tokens"])
                continue
            if op.role == "score":
                outputs[step.index] = score(stack, op, got[0])
                continue
            preds = got if step.first else got[1:]
            h = embed_input(stack, op, rows, preds) if step.first else got[0]["h"]
            h = stack.run_layers(h, step.layer_start, step.layers)
            if not step.last:
                outputs[step.index] = {"h": h}
                continue
            out, loss = finish(stack, op, h, rows, preds)
            outputs[step.index] = out
            if loss is not None:
                losses[step.index] = loss
        pending = list(self.buckets)
        launched: list[tuple[Any, torch.Tensor, list[nn.Parameter]]] = []
        for position in reversed(range(len(program.steps))):
            step = program.steps[position]
            op = program.metaops[step.metaop]
            launched += self._launch_ready(pending, position + 1)
            if not op.trains:
                continue
            grads: dict[str, torch.Tensor] = {}
            for consumer in program.steps:
                if step.index in consumer.sources:
                    self._hand_back(step, consumer, reads.get((consumer.index, step.index)), grads)
            tensors, seeds = [], []
            if step.index in losses:
                tensors.append(losses[step.index])
                seeds.append(torch.ones_like(losses[step.index]))
            out = outputs.get(step.index, {})
            for key, g in grads.items():
                if key in out and out[key].requires_grad:
                    tensors.append(out[key])
                    seeds.append(g)
            if tensors:
                torch.autograd.backward(tensors, seeds)
        launched += self._launch_ready(pending, -1)
        self._finish_sync(launched)
        if before_step is not None:
            before_step()
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        totals = torch.zeros(len(program.tasks), dtype=torch.float64, device=self.device)  # (NCCL: on the GPU)
        for index, loss in losses.items():
            totals[program.tasks.index(program.metaops[program.step(index).metaop].task)] += float(loss.detach())
        dist.all_reduce(totals)
        return dict(zip(program.tasks, totals.tolist(), strict=True))

    def parameters_of(self, key: tuple[str, Part]) -> Iterator[tuple[str, nn.Parameter]]:
        stack = self.stacks.get(key[0])
        if stack is None:
            return
        for module in stack.part(key[1]):
            yield from module.named_parameters()

    def _launch_ready(self, pending: list[tuple[tuple[int, ...], list[tuple[str, Part]], int]], position: int
                      ) -> list[tuple[Any, torch.Tensor, list[nn.Parameter]]]:
        """Start the all-reduce of each pending bucket whose gradients are final once the backward has reached
        ``position`` in ``program.steps`` (as DDP starts a bucket while the backward goes on), in the buckets'
        order: every rank starts its groups' collectives in the same order (NCCL needs it)."""
        out = []
        while pending and pending[0][2] >= position:
            ranks, keys, _ = pending.pop(0)
            params = self._grads_of(keys)
            flat = torch.cat([p.grad.flatten() for p in params])  # type: ignore[union-attr]
            out.append((dist.all_reduce(flat, group=self.groups[ranks], async_op=True), flat, params))
        return out

    def _grads_of(self, keys: list[tuple[str, Part]]) -> list[nn.Parameter]:
        """The parameters of ``keys`` on this rank, each with a gradient: zeros where a replica took no part in the
        backward (generation only, or no rows), so that every replica takes the same AdamW step."""
        params = []
        for key in keys:
            for _, p in self.parameters_of(key):
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                params.append(p)
        return params

    def _finish_sync(self, launched: list[tuple[Any, torch.Tensor, list[nn.Parameter]]]) -> None:
        """Wait for the gradient all-reduces and write the sums back: each trained part's gradients summed over
        the ranks holding it (zeros where a replica took no rows)."""
        self._grads_of(self.local_parts)
        for work, flat, params in launched:
            work.wait()
            at = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[at:at + n].view_as(p))  # type: ignore[union-attr]
                at += n

    def gradients(self) -> dict[str, float]:
        """Norms of this rank's parameters' gradients (valid between the backward and the step)."""
        out = {}
        for name, stack in self.stacks.items():
            for pname, p in stack.named_parameters():
                if p.grad is not None:
                    out[f"{name}.{pname}"] = float(p.grad.norm())
        return out


StepCallback = Callable[[int, float, float, dict[str, float]], None]  # step, loss, time, task losses


def run_spindle(program: SpindleProgram, steps: int, device: torch.device, seed: int = 0, warmup: int = 1,
                on_step: StepCallback | None = None) -> dict[str, object]:
    """Train ``steps`` iterations; every rank returns the metrics (the hybrid runtime's field names, a step
    being one iteration; ``loss`` the sum of the task losses, ``task_loss`` per task)."""
    runner = SpindleRunner(program, device, seed)
    times: list[float] = []
    task_loss: dict[str, list[float]] = {t: [] for t in program.tasks}
    total: list[float] = []
    dist.barrier()
    for step in range(steps):
        t0 = time.perf_counter()
        losses = runner.iteration(step)  # ends in an all-reduce: every rank has finished the iteration
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        for t, v in losses.items():
            task_loss[t].append(v)
        total.append(sum(losses.values()))
        if on_step is not None:
            on_step(step, total[-1], times[-1], losses)
    memory = [0.0] * dist.get_world_size()
    dist.all_gather_object(memory, peak_memory_gib(device))
    timed = times[min(warmup, max(len(times) - 1, 0)):] or times
    step_time = statistics.median(timed)
    return {
        "step_time_s": step_time,
        "step_time_mean_s": statistics.fmean(timed),
        "step_times_s": times,
        "predicted_step_time_s": program.predicted_iteration_time_s,
        "predicted_peak_memory_gib": program.predicted_peak_memory_gib,
        "throughput_samples_per_s": sum(op.batch for op in program.metaops.values() if op.trains) / step_time,
        "peak_memory_gib_per_rank": memory,
        "peak_memory_gib": max(memory),
        "loss": total,
        "task_loss": task_loss,
        "world_size": program.world_size,
        "layout": describe(program),
        "notes": list(program.notes),
    }


def describe(program: SpindleProgram) -> str:
    """``spindle-5slices-caption/vit@2,3+1,2,3-...``: each metaop's device blocks in order."""
    per: dict[str, list[str]] = {}
    for s in program.steps:
        per.setdefault(s.metaop, []).append(",".join(map(str, s.devices)))
    return f"spindle-{len(program.steps)}slices-" + "-".join(f"{m}@{'+'.join(d)}" for m, d in per.items())


# --- the reference: the tasks one after another on one process ---


def reference_iteration(program: SpindleProgram, stacks: dict[str, Stack], step_index: int,
                        seed: int = 0) -> dict[str, float]:
    """Each task's loss with its metaops run whole, in dependency order, on one process; the gradients of the
    summed losses are left on ``stacks``' parameters (no optimizer step)."""
    outputs: dict[str, Payload] = {}
    losses: dict[str, float] = {}
    for op in program.metaops.values():  # topological order
        stack = stacks[op.module]
        data = task_data(op, step_index, seed)
        reads = [outputs[p] for p in op.preds]
        if op.role == "rollout":
            outputs[op.name] = generate(stack, op, data["tokens"])
            continue
        if op.role == "score":
            outputs[op.name] = score(stack, op, reads[0])
            continue
        h = stack.run_layers(embed_input(stack, op, data, reads), 0, len(stack.layers))
        out, loss = finish(stack, op, h, data, reads)
        outputs[op.name] = out
        if loss is not None:
            loss.backward(retain_graph=True)
            losses[op.task] = losses.get(op.task, 0.0) + float(loss.detach())
    return {t: losses.get(t, 0.0) for t in program.tasks}
