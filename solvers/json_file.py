"""Reading a JSON file a request names (a profile, Galvatron's files, a plan file): every way it can fail is a
SpecError at the field that named it, never a traceback or a read without end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from solvers.errors import SpecError


def json_kind(value: Any) -> str:
    """What a JSON value is, as an error names it where another kind belongs ("an array", "null", ...)."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def read_json_file(path: str | Path, loc: tuple[str | int, ...]) -> Any:
    """The JSON document in ``path``; the field ``loc`` is blamed for a file that cannot be read as JSON."""
    if "\0" in str(path):  # the OS refuses such a name with ValueError
        raise SpecError.at(loc, f"not a file name: {str(path)!r}")
    p = Path(path)
    if p.exists() and not p.is_file():  # a device such as /dev/zero is read without end, a FIFO blocks
        raise SpecError.at(loc, f"cannot read {p}: not a regular file")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except OSError as err:
        raise SpecError.at(loc, f"cannot read {p}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise SpecError.at(loc, f"{p} is not valid JSON: {err.msg}") from None
    except UnicodeDecodeError:
        raise SpecError.at(loc, f"{p} is not valid JSON: not UTF-8 text") from None
    except RecursionError:
        raise SpecError.at(loc, f"{p} is not valid JSON: nested too deeply") from None
