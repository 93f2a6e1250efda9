"""Domain errors raised by the solvers; the service and CLI map them to 422 / exit code 2."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

SHOWN_CHARS = 80  # of a value quoted in a message (a 400-digit integer was quoted whole)


def shown(value: object) -> str:
    """A value the user sent, as JSON writes it (null, true, "x"): requests are JSON, Python's repr (None,
    True, 'x') would not be what they typed. Anything JSON cannot write falls back to repr."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        try:
            text = repr(value)
        except ValueError:  # an integer past Python's digit limit for str()
            return "a number too long to print"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + f"… ({len(text):,} characters)"


@dataclass
class FieldProblem:
    loc: tuple[str | int, ...]
    msg: str

    def as_dict(self) -> dict[str, object]:
        return {"loc": list(self.loc), "msg": self.msg}


@dataclass
class SpecError(ValueError):
    """Invalid input: every problem names the field (a path into the request) and the reason."""

    problems: list[FieldProblem] = field(default_factory=list)

    @classmethod
    def at(cls, loc: Sequence[str | int], msg: str) -> SpecError:
        return cls([FieldProblem(tuple(loc), msg)])

    def under(self, *prefix: str | int) -> SpecError:
        """The same problems, located under ``prefix``: the request's fields where a larger document holds it."""
        return SpecError([FieldProblem((*prefix, *p.loc), p.msg) for p in self.problems])

    def __str__(self) -> str:
        return "; ".join(f"{'.'.join(str(p) for p in pr.loc)}: {pr.msg}" for pr in self.problems)

    def as_detail(self) -> list[dict[str, object]]:
        return [p.as_dict() for p in self.problems]


class InfeasibleError(SpecError):
    """The input is valid but no plan satisfies it (e.g. memory); the message says what would be needed."""
