"""A quota a client declares for itself: ``VTALLOC_QUOTA_MIN`` / ``VTALLOC_QUOTA_MAX``, sent in its hello.

Owns: the two environment variables (a pod sets them in its spec, as HAMi's device plugin reads
limits from env), how the client library reads them (:func:`declared_from_env`: sizes as
``vtalloc serve --quota`` writes them, ``0`` allowed; a malformed one is an
InvalidArgumentError naming the variable, raised before anything is sent) and how the hello
carries them (``"quota": {"min": N|null, "max": N|null}``), which the daemon checks again
(:func:`declared_from_hello`: the peer is not trusted to have used this library).
Invariants: a declaration only ever *lowers* the quota the operator set (ledger.py applies it
as ``min(declared, operator's)``, per field); each value is an integer 0 .. 2**64-1 and a
declared minimum is never above a declared maximum.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from vtalloc.allocator.config import parse_size
from vtalloc.allocator.errors import InvalidArgumentError

__all__ = ["QUOTA_MIN_ENV", "QUOTA_MAX_ENV", "Declared", "declared_from_env", "declared_from_hello", "hello_field"]

QUOTA_MIN_ENV = "VTALLOC_QUOTA_MIN"
QUOTA_MAX_ENV = "VTALLOC_QUOTA_MAX"
_LIMIT = 1 << 64

Declared = tuple[Optional[int], Optional[int]]   # (min bytes, max bytes); None: not declared


def _size(text: str, name: str) -> int:
    text = text.strip()
    if text in ("0", "0B", "0b"):
        return 0
    n = parse_size(text, name=f"${name}")
    if n >= _LIMIT:
        raise InvalidArgumentError(f"${name}: {n} bytes does not fit in 64 bits")
    return n


def _check(lo: int | None, hi: int | None, where: str) -> Declared:
    if lo is not None and hi is not None and lo > hi:
        raise InvalidArgumentError(f"{where}: the declared minimum ({lo} bytes) is above the declared maximum "
                                   f"({hi} bytes)")
    return lo, hi


def declared_from_env(env: Mapping[str, str] | None = None) -> Declared | None:
    """The quota this process declares, from ``$VTALLOC_QUOTA_MIN`` / ``$VTALLOC_QUOTA_MAX``
    (None when neither is set; an empty value counts as unset)."""
    env = os.environ if env is None else env
    lo_text, hi_text = env.get(QUOTA_MIN_ENV, "").strip(), env.get(QUOTA_MAX_ENV, "").strip()
    if not lo_text and not hi_text:
        return None
    lo = _size(lo_text, QUOTA_MIN_ENV) if lo_text else None
    hi = _size(hi_text, QUOTA_MAX_ENV) if hi_text else None
    return _check(lo, hi, f"${QUOTA_MIN_ENV}/${QUOTA_MAX_ENV}")


def hello_field(declared: Declared | None) -> dict[str, Any]:
    """What a hello carries for ``declared`` (nothing when None)."""
    if declared is None:
        return {}
    return {"quota": {"min": declared[0], "max": declared[1]}}


def declared_from_hello(hello: Mapping[str, Any]) -> Declared | None:
    """The declaration a hello carries, checked (InvalidArgumentError for anything malformed)."""
    if "quota" not in hello:
        return None
    q = hello["quota"]
    if not isinstance(q, dict) or set(q) - {"min", "max"}:
        raise InvalidArgumentError("hello: 'quota' must be an object with 'min' and/or 'max'")
    values = []
    for key in ("min", "max"):
        v = q.get(key)
        if v is not None and (type(v) is not int or not 0 <= v < _LIMIT):
            raise InvalidArgumentError(f"hello: quota {key} must be an integer 0 .. 2**64-1 or null")
        values.append(v)
    if values == [None, None]:
        return None
    return _check(values[0], values[1], "hello")
