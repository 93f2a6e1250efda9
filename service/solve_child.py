"""What runs inside a solver child process: resource limits, then ``solvers.api.solve``.

Messages to the parent over a pipe: ``("progress", fraction, message)``, then exactly one of
``("ok", result)``, ``("spec_error", message, problems)`` or ``("error", message)``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import resource
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError):  # not Linux: the CPU limit below still bounds an orphan
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def apply_limits(memory_mib: int, cpu_s: float) -> None:
    limit = memory_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cpu = int(cpu_s) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))


def run(conn: Connection, request: dict[str, Any], memory_mib: int, time_limit_s: float) -> None:
    _die_with_parent()
    apply_limits(memory_mib, time_limit_s)
    from solvers.api import solve
    from solvers.errors import SpecError

    last_time, last_message = 0.0, ""

    def progress(fraction: float, message: str) -> None:
        # Solvers may report in tight loops: pass on phase changes at once, plain fractions 10 times a second.
        nonlocal last_time, last_message
        now, text = time.monotonic(), str(message)[:256]
        if text != last_message or now - last_time >= 0.1 or fraction >= 1.0:
            last_time, last_message = now, text
            conn.send(("progress", float(fraction), text))

    try:
        result = solve(request, progress=progress).to_json()
        json.dumps(result, allow_nan=False)  # what is stored must be JSON
        conn.send(("ok", result))
    except SpecError as err:
        conn.send(("spec_error", str(err), err.as_detail()))
    except MemoryError:
        conn.send(("error", f"memory limit of {memory_mib} MiB exceeded"))
    except Exception as err:
        conn.send(("error", f"solver error: {type(err).__name__}: {err}"))
    finally:
        conn.close()
