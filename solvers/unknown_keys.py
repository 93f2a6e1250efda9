"""What an unknown key in a request is told: where it is, and the known key it was most likely meant to be.

Every request model refuses keys it does not declare (pydantic ``extra="forbid"``); a misspelt key that was
ignored planned as if it had not been given (``"constraint": {"memory_limit_gib": 20}`` planned at 71.5 GiB).
The known keys at an error's location are read from the model's own fields, so that a field added to any
model is known here without a list to keep in step.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from solvers.errors import FieldProblem

Loc = Sequence[str | int]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold at its top (through Optional, unions and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = get_origin(annotation)
    if origin is Annotated:
        return _models_in(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(annotation) for m in _models_in(arg)]
    return []


def _containers_in(annotation: Any) -> list[Any]:
    """The item annotations of the lists and dicts an annotation may hold (a loc steps into them by index/key)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _containers_in(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [c for arg in get_args(annotation) for c in _containers_in(arg)]
    if origin in (list, tuple, set, frozenset):
        return [get_args(annotation)[0]] if get_args(annotation) else []
    if origin is dict:
        return [get_args(annotation)[1]] if len(get_args(annotation)) == 2 else []
    return []


def _step(annotations: Iterable[Any], part: str | int) -> list[Any]:
    out: list[Any] = []
    for ann in annotations:
        for model in _models_in(ann):
            if isinstance(part, str) and part in model.model_fields:
                out.append(model.model_fields[part].annotation)
            elif part == model.__name__:  # pydantic names the union member it tried
                out.append(model)
        out += _containers_in(ann)
    return out


def known_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """The keys the object at ``loc`` (a path of keys and indices from ``model``) may have; [] when unknown."""
    annotations: list[Any] = [model]
    for part in loc:
        annotations = _step(annotations, part)
    # (INPUT_KEYS: keys a model's before-validator reads, e.g. "preset", besides its fields)
    return sorted({k for ann in annotations for m in _models_in(ann)
                   for k in (*m.model_fields, *getattr(m, "INPUT_KEYS", ()))})


def closest(key: str, known: Sequence[str]) -> str | None:
    """The known key ``key`` most likely misspells (difflib's ratio, at least 0.6), if any."""
    lowered = {k.lower(): k for k in known}
    if key.lower() in lowered:  # a case slip ("Constraints") is always meant
        return lowered[key.lower()]
    match = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[match[0]] if match else None


def unknown_key_message(key: str | int, known: Sequence[str], where: str) -> str:
    """``unknown key "constraint" in the request; did you mean "constraints"? (known: ...)``."""
    text = f'unknown key "{key}" in {where}'
    guess = closest(str(key), known) if known else None
    if guess is not None:
        text += f'; did you mean "{guess}"?'
    if known:
        text += f" (known: {', '.join(known)})"
    return text


def where(loc: Loc) -> str:
    """The object a path points into, as the message names it."""
    return "the request" if not loc else ".".join(str(p) for p in loc)


def unknown_key_problems(given: Iterable[str | int], known: Iterable[str], loc: Loc) -> list[FieldProblem]:
    """A problem at ``loc + (key,)`` for each given key not known (for objects read as plain dicts)."""
    names = sorted(known)
    return [FieldProblem((*loc, key), unknown_key_message(key, names, where(loc)))
            for key in given if key not in names]
