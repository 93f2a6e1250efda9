"""Canonical JSON and the content hash that identifies a request."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(doc: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal documents give equal strings."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_hash(doc: Any) -> str:
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()
