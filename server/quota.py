"""Quotas and principals: who a session counts against, and how much that principal may hold.

Owns: the :class:`Quota` record, principal naming (``uid:<n>`` by default, or a configured
name that one or more uids map to) and the parsing of quota flags (``NAME=MIN:MAX``).
Also a pod's principal (``pod:<pod UID>``, ``vtalloc serve --principal-by pod``:
principals.py) and a quota lowered by what a client declared (:meth:`Quota.lowered`).
Invariants: ``0 <= min_bytes <= max_bytes``; a principal name is ``uid:<digits>``,
``pod:<pod UID>`` or 1-64 characters of ``[A-Za-z0-9_.-]`` (so it is safe in logs, metrics
labels and JSON); a lowered quota is never above the one it lowers, in either field.
Nothing here knows about sessions or pages in flight; see ledger.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vtalloc.allocator.config import parse_size
from vtalloc.allocator.errors import InvalidArgumentError

from .principals import POD_UID_RE
from .protocol.errors import echo

__all__ = [
    "Quota", "PrincipalMap", "check_principal", "parse_quota", "parse_named_quota", "parse_principal_map", "uid_principal",
    "pod_principal",
]

# fullmatch, never match with "$": "$" also matches before a trailing newline ('uid:1\n' was a principal)
_NAME_RE = re.compile(rf"uid:[0-9]{{1,10}}|pod:{POD_UID_RE}|[A-Za-z0-9_.-]{{1,64}}")


@dataclass(frozen=True)
class Quota:
    principal: str   # "" for the default quota
    min_bytes: int   # guaranteed: never asked to evict below it
    max_bytes: int   # hard: a lease past it fails at once

    def __post_init__(self) -> None:
        if not 0 <= self.min_bytes <= self.max_bytes:
            raise InvalidArgumentError(
                f"quota of {self.principal or 'the default'}: need 0 <= min ({self.min_bytes}) <= max ({self.max_bytes})")
        if self.max_bytes >= 1 << 64:
            raise InvalidArgumentError("quota maximum does not fit in 64 bits")

    def keepable(self, capacity_bytes: int) -> "Quota":
        """This quota, if a node of ``capacity_bytes`` can keep its minimum; else InvalidArgumentError."""
        if self.min_bytes > capacity_bytes:
            raise InvalidArgumentError(
                f"the {'default quota' if not self.principal else 'quota of ' + self.principal}'s minimum "
                f"({self.min_bytes} bytes) is more than the node's capacity ({capacity_bytes} bytes): a guarantee "
                "the node cannot keep")
        return self

    def for_principal(self, principal: str) -> "Quota":
        return Quota(principal, self.min_bytes, self.max_bytes)

    def lowered(self, min_bytes: int | None, max_bytes: int | None) -> "Quota":
        """This quota with each field lowered to a declared value (None: not declared); never raised."""
        hi = self.max_bytes if max_bytes is None else min(self.max_bytes, max_bytes)
        lo = self.min_bytes if min_bytes is None else min(self.min_bytes, min_bytes)
        return Quota(self.principal, min(lo, hi), hi)


def uid_principal(uid: int) -> str:
    return f"uid:{uid}"


def pod_principal(pod_uid: str) -> str:
    return f"pod:{pod_uid}"


def check_principal(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidArgumentError(
            f"principal {echo(name)} is not 'uid:<n>', 'pod:<pod UID>' or a name of 1-64 letters, digits, '_', '.', "
            "'-'")
    return name


def _parse_bytes(text: str, what: str) -> int:
    text = text.strip()
    if text in ("0", "0B", "0b"):
        return 0
    return parse_size(text, name=what)


def parse_quota(text: str, *, principal: str = "") -> Quota:
    """``MIN:MAX`` (sizes like ``2GiB``; ``0`` allowed for MIN) as a Quota."""
    if text.count(":") != 1:
        raise InvalidArgumentError(f"quota {text!r}: expected MIN:MAX, e.g. 1GiB:8GiB")
    lo, hi = text.split(":")
    return Quota(principal, _parse_bytes(lo, "quota minimum"), _parse_bytes(hi, "quota maximum"))


def parse_named_quota(text: str) -> Quota:
    """``PRINCIPAL=MIN:MAX`` as a Quota."""
    name, sep, rest = text.partition("=")
    if not sep:
        raise InvalidArgumentError(f"quota {text!r}: expected PRINCIPAL=MIN:MAX, e.g. uid:1000=1GiB:8GiB")
    return parse_quota(rest, principal=check_principal(name.strip()))


@dataclass(frozen=True)
class PrincipalMap:
    """Which configured principal a uid counts against (uids not listed: ``uid:<n>``)."""

    names: tuple[tuple[int, str], ...] = ()

    def principal_for(self, uid: int) -> str:
        for u, name in self.names:
            if u == uid:
                return name
        return uid_principal(uid)


def parse_principal_map(items: list[str] | tuple[str, ...]) -> PrincipalMap:
    """``NAME=UID[,UID...]`` items as a PrincipalMap; a uid may map to one name only."""
    pairs: dict[int, str] = {}
    for item in items:
        name, sep, uids = item.partition("=")
        if not sep or not uids.strip():
            raise InvalidArgumentError(f"principal {item!r}: expected NAME=UID[,UID...], e.g. team-a=1000,1001")
        name = check_principal(name.strip())
        if name.startswith(("uid:", "pod:")):
            raise InvalidArgumentError(f"principal {item!r}: a configured name may not start with 'uid:' or 'pod:'")
        for part in uids.split(","):
            try:
                uid = int(part)
            except ValueError:
                raise InvalidArgumentError(f"principal {item!r}: {part!r} is not a uid") from None
            if uid < 0 or uid >= 1 << 32:
                raise InvalidArgumentError(f"principal {item!r}: uid {uid} out of range")
            if pairs.get(uid, name) != name:
                raise InvalidArgumentError(f"uid {uid} is mapped to both {pairs[uid]!r} and {name!r}")
            pairs[uid] = name
    return PrincipalMap(tuple(sorted(pairs.items())))
