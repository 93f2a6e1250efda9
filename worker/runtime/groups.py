"""Process groups shared by every plan one process builds.

Each plan's device meshes ask ``torch.distributed.new_group`` for a group per mesh dimension (``parallelize.Meshes``),
and every gloo group brings threads of its own to each rank: two worker threads and a transport loop that wakes
every 10 ms whether or not the group is used. A process that builds one plan, as the daemon's does, holds a few.
The closed loop builds its 21 plans in one launch: each of its 4 CPU ranks held 364 threads (121 groups' worth),
37 of them runnable at a sample while the plans ran, on a 2-core host (load average 60-80) — so a plan's measured
time also depended on how many other plans the launch had built. Over 4 ranks there are only 15 distinct sets of
ranks: while ``shared_process_groups`` is open, a group asked for again over the same ranks (and backend) is the
one made the first time. Every rank asks for the same groups in the same order, so every rank hits or misses the
cache alike, as ``new_group`` (collective over the world) requires.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist
import torch.distributed.device_mesh as device_mesh

GroupKey = tuple[tuple[int, ...], str | None]  # (ranks, backend)

_open: dict[GroupKey, Any] | None = None  # the groups of the outermost open ``shared_process_groups``


@contextmanager
def shared_process_groups() -> Iterator[dict[GroupKey, Any]]:
    """While open, ``new_group`` (also as the device meshes call it) returns the group made first over the same ranks
    and backend. Yields the groups made (for a caller that counts them). Opened again inside, it shares the outer
    one's groups (the profiler opens it around each pass, the closed loop around all its passes and plans). The
    groups belong to the process-group world they were made in: open it within one."""
    global _open
    if _open is not None:
        yield _open
        return
    made, made_for_meshes = dist.new_group, device_mesh.new_group
    groups: dict[GroupKey, Any] = {}

    def shared(ranks: list[int] | None = None, *args: Any, **kwargs: Any) -> Any:
        # (new_group's parameters: ranks, timeout, backend, ...; the meshes pass them by name)
        backend = kwargs.get("backend", args[1] if len(args) > 1 else None)
        key = (tuple(sorted(ranks)) if ranks is not None else tuple(range(dist.get_world_size())), backend)
        if key not in groups:
            groups[key] = made(ranks, *args, **kwargs)
        return groups[key]

    dist.new_group = device_mesh.new_group = shared
    _open = groups
    try:
        yield groups
    finally:
        dist.new_group, device_mesh.new_group = made, made_for_meshes
        _open = None
