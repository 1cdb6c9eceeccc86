"""The JSON Schemas of the CLI's documents (schemas/*.schema.json) and validation against them.

Owns: loading the schemas (relative ``$ref``s between them resolve to files of schemas/, as a
file-based validator resolves them) and ``validate(doc, name)``.
Invariants: a document is checked against the schema its own ``"schema"`` key names (the ready
line of ``vtalloc serve``, which has none, by name), so a renamed version cannot slip through.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

__all__ = ["SCHEMA_DIR", "schema_files", "load", "validate", "file_for"]

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"


def schema_files() -> list[Path]:
    return sorted(SCHEMA_DIR.glob("*.schema.json"))


def load(name: str) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / name).read_text())


def file_for(schema_id: str) -> str:
    """``vtalloc.proc-stats/v1`` -> ``proc-stats.schema.json``."""
    return schema_id.split(".", 1)[1].split("/", 1)[0] + ".schema.json"


def _retrieve(uri: str) -> Resource:
    return Resource.from_contents(load(Path(uri).name))


@lru_cache(maxsize=None)
def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(load(name), registry=Registry(retrieve=_retrieve))


def validate(doc: dict[str, Any], name: str | None = None) -> None:
    """Raise jsonschema.ValidationError unless ``doc`` matches its schema (``name``, else the
    file its ``"schema"`` key names)."""
    _validator(name or file_for(doc["schema"])).validate(doc)
