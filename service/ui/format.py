"""Human formatting of the numbers the dashboard shows (Jinja filters).

Every formatter accepts ``None`` or junk and returns an em dash: plans from older solvers or failed jobs
lack fields, and a page must render anyway.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

DASH = "—"


def as_float(value: Any) -> float | None:
    """A finite float, or None for anything that is not a usable number."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def seconds(value: Any) -> str:
    """Durations from microseconds to hours, with the unit that keeps 3 significant digits readable."""
    f = as_float(value)
    if f is None:
        return DASH
    a = abs(f)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{f * 1e6:.3g} µs"
    if a < 1:
        return f"{f * 1e3:.3g} ms"
    if a < 600:
        return f"{f:.3g} s"
    if a < 3 * 3600:
        return f"{f / 60:.3g} min"
    return f"{f / 3600:.3g} h"


def number(value: Any, digits: int = 3) -> str:
    """A count or rate with thousands separators or k/M suffixes."""
    f = as_float(value)
    if f is None:
        return DASH
    a = abs(f)
    if a >= 1e9:
        return f"{f / 1e9:.{digits}g} G"
    if a >= 1e6:
        return f"{f / 1e6:.{digits}g} M"
    if a >= 1e4:
        return f"{f / 1e3:.{digits}g} k"
    if a >= 100:
        return f"{f:,.0f}"
    return f"{f:.{digits}g}"


def percent(value: Any) -> str:
    f = as_float(value)
    return DASH if f is None else f"{100 * f:.1f}%"


def gib(value: Any) -> str:
    f = as_float(value)
    return DASH if f is None else f"{f:.1f} GiB"


def ratio(value: Any) -> str:
    """A speed-up such as 1.23×."""
    f = as_float(value)
    return DASH if f is None else f"{f:.2f}×"


def gain(value: Any) -> str:
    """A speed-up as a signed percentage (1.042 -> +4.2%): gains of a few percent stay distinguishable."""
    f = as_float(value)
    return DASH if f is None else f"{100 * (f - 1):+.1f}%"


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def age(value: Any, now: datetime | None = None) -> str:
    """How long ago a timestamp was: '42 s', '5 min', '3 h', '2 d'."""
    then = parse_time(value)
    if then is None:
        return DASH
    delta = ((now or datetime.now(UTC)) - then).total_seconds()
    if delta < 0:
        delta = 0
    if delta < 60:
        return f"{delta:.0f} s ago"
    if delta < 3600:
        return f"{delta / 60:.0f} min ago"
    if delta < 86400:
        return f"{delta / 3600:.0f} h ago"
    return f"{delta / 86400:.0f} d ago"


FILTERS = {"seconds": seconds, "number": number, "percent": percent, "gib": gib, "ratio": ratio, "gain": gain,
           "age": age}
