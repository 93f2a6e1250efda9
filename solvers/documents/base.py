"""What every plan document shares: a strict pydantic base and the schema version.

A document is what a solver produced, so it is validated strictly (``extra="forbid"``): a field a solver
adds without declaring it here fails the suite, instead of drifting away from the published schema. Fields a
solver did not set stay out of the JSON, as they were before documents were typed: serialise with
``exclude_unset=True`` (``to_json`` does). Version 1 documents (stored before documents carried ``kind`` and
``schema_version``) are the same fields without those two; ``solvers.documents.load_result`` reads them.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, model_validator

SCHEMA_VERSION = 2
"""2: documents name their ``kind`` and ``schema_version``; 1: the same fields without them."""


class Document(BaseModel):
    """A part of a result document: every field declared, none unknown."""

    model_config = ConfigDict(extra="forbid")

    def to_json(self) -> dict[str, Any]:
        """The JSON object as the contract shows it."""
        return self.model_dump(mode="json", exclude_unset=True)


class ResultDocument(Document):
    """A solver's whole result: it names its kind and the version of its schema."""

    kind: str
    schema_version: int = SCHEMA_VERSION

    @model_validator(mode="after")
    def _names_itself(self) -> Self:
        # counted as set, so that a document serialised without its defaults still says what it is
        self.__pydantic_fields_set__.update(("kind", "schema_version"))
        return self
