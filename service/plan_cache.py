"""In-process cache of finished plans, for the hot read paths (GET a plan, resubmit a solved request).

Safe without invalidation because what it holds never changes: a plan in a terminal state is final, and a
succeeded plan keeps its content hash for good (only failed or cancelled plans give theirs up). Each
replica has its own; a miss falls through to the database.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from pydantic import TypeAdapter

from service.schemas import PlanOut
from solvers.documents import TERMINAL

_PLAN_OUT: TypeAdapter[Any] = TypeAdapter(PlanOut)


def encode_plan(view: dict[str, Any]) -> bytes:
    """The plan's JSON body. ``view`` sets every field of the plan; what is left unset is inside its documents
    (fields a solver did not set), and stays out of the JSON as it stays out of the stored document."""
    return _PLAN_OUT.dump_json(_PLAN_OUT.validate_python(view), exclude_unset=True)


class PlanCache:
    def __init__(self, max_plans: int = 2048) -> None:
        self.max_plans = max_plans
        self._lock = threading.Lock()
        self._bodies: OrderedDict[str, bytes] = OrderedDict()
        self._by_hash: dict[str, str] = {}

    def body(self, plan_id: str) -> bytes | None:
        with self._lock:
            found = self._bodies.get(plan_id)
            if found is not None:
                self._bodies.move_to_end(plan_id)
            return found

    def plan_for_hash(self, digest: str) -> str | None:
        with self._lock:
            return self._by_hash.get(digest)

    def remember(self, view: dict[str, Any]) -> bytes:
        """The JSON body of ``view``, kept when the plan is terminal."""
        body = encode_plan(view)
        if view["status"] not in TERMINAL:
            return body
        with self._lock:
            self._bodies[view["id"]] = body
            self._bodies.move_to_end(view["id"])
            if view["status"] == "succeeded" and view.get("content_hash"):
                self._by_hash[view["content_hash"]] = view["id"]
            while len(self._bodies) > self.max_plans:
                evicted, _ = self._bodies.popitem(last=False)
                self._by_hash = {h: p for h, p in self._by_hash.items() if p != evicted}
        return body
