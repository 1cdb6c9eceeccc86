"""The JSON Schemas of the CLI's ``--json`` documents, as installed with the package.

Owns: finding the schema files (``vtalloc/client/_schemas/`` in a wheel, where setup.py copies
them; the repo's ``schemas/`` in an editable install) through importlib.resources, and reading
them: ``names()``, ``text(name)``, ``load(name)``, ``for_document(doc)``.
Invariants: read-only; an unknown name is InvalidArgumentError (a ValueError). Every schema's ``$id`` ends with its file
name, so a validator that resolves ``$ref``s by ``$id`` (the refs are relative file names)
finds the files this module lists.

Example: ``jsonschema.validate(doc, for_document(doc), registry=registry())`` with
``referencing.Registry`` built from :func:`resources_by_id` (``jsonschema`` is not a dependency).
"""

from __future__ import annotations

import json
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from vtalloc.allocator.errors import InvalidArgumentError

__all__ = ["directory", "names", "text", "load", "file_for", "for_document", "resources_by_id"]

_SUFFIX = ".schema.json"


def directory() -> Traversable:
    """The folder holding the ``*.schema.json`` files."""
    packaged = resources.files("vtalloc.client").joinpath("_schemas")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "schemas"  # an editable install: the repo's


def names() -> list[str]:
    """The schema files' names (``"stats.schema.json"``, ...), sorted."""
    return sorted(p.name for p in directory().iterdir() if p.name.endswith(_SUFFIX))


def text(name: str) -> str:
    """The schema file ``name`` (``"info.schema.json"`` or ``"info"``) as text."""
    name = name if name.endswith(_SUFFIX) else name + _SUFFIX
    if name not in names():
        raise InvalidArgumentError(f"no schema {name!r}; the schemas are {', '.join(names())}")
    return directory().joinpath(name).read_text(encoding="utf-8")


def load(name: str) -> dict[str, Any]:
    """The schema file ``name``, parsed."""
    loaded: dict[str, Any] = json.loads(text(name))
    return loaded


def file_for(schema: str) -> str:
    """The file of a document's ``"schema"`` key: ``vtalloc.proc-stats/v1`` -> ``proc-stats.schema.json``."""
    if not schema.startswith("vtalloc.") or "/" not in schema:
        raise InvalidArgumentError(f"{schema!r} is not a vtalloc document schema (vtalloc.<name>/v<N>)")
    return schema.split(".", 1)[1].split("/", 1)[0] + _SUFFIX


def for_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The schema a ``--json`` document names in its ``"schema"`` key."""
    return load(file_for(doc["schema"]))


def resources_by_id() -> dict[str, dict[str, Any]]:
    """Every schema keyed by its ``$id``: what a ``referencing.Registry`` is built from."""
    return {s["$id"]: s for s in (load(n) for n in names())}
