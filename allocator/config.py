"""Configuration of an address space: one frozen dataclass, parsed and validated here only.

Sizes are accepted as positive integers (bytes) or strings such as ``"64MiB"``, ``"1.5GiB"``,
``"512KB"`` (binary units KiB/MiB/GiB/TiB and bare K/M/G/T; decimal units KB/MB/GB/TB).
Environment variables ``VTALLOC_<FIELD>`` (e.g. ``VTALLOC_CAPACITY=8GiB``) and the one string
``VTALLOC_CONF=capacity:8GiB,page_size:2MiB`` are read by :meth:`Config.from_env` (keyword
arguments win, then single variables, then VTALLOC_CONF), never by ``Config()`` or
``AddressSpace()``. Unknown ``VTALLOC_*`` names are warned about (ConfigWarning), once each.

Invariants: every bad value raises InvalidArgumentError (never a bare ValueError, whatever the
input's length) whose message quotes at most a bounded prefix of it; ``capacity`` and
``reservation_size`` are at most ``MAX_SPACE_BYTES`` (2^46 bytes, the core's limit too), so a
Config that normalizes builds a space whose allocations can be served.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import re
from typing import TYPE_CHECKING, Any, Mapping

from . import backends
from .checks import MAX_U64, quote
from .errors import InvalidArgumentError

__all__ = ["Config", "parse_size", "format_size", "BACKENDS", "MAX_SPACE_BYTES", "ConfigWarning",  # noqa: F822
           "CONF_ENV", "known_env", "warn_unknown_env"]  # BACKENDS: the module's __getattr__, from the registry

EVICT_MODES = ("auto", "copy", "mapped")


def __getattr__(name: str) -> tuple[str, ...]:
    """``BACKENDS``: what ``backend=`` takes, "auto" and the core's registered backends, read from
    the registry when asked (allocator/backends.py): no backend is listed here."""
    if name == "BACKENDS":
        return backends.choices()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Driver cost models of the host backend (docs/cost-model.md): the GPU whose measured per-call
# costs and copy bandwidths a modeled clock charges.
COST_MODELS = ("h100", "h200")

# Binary units match in any case; decimal ones only as spelled here (kB and KB, MB, GB, TB).
_BINARY_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30,
                 "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40}
_DECIMAL_UNITS = {"kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
# Longer size strings are refused before any parsing (no size needs more: 2^64 has 20 digits),
# which keeps them below Python's int-string limit and the regex's work bounded.
_MAX_SIZE_CHARS = 64
# The most bytes a capacity or a reservation may name, and the largest allocation the core
# serves (kMaxSpaceBytes in csrc/vmm/page_geometry.hpp): 64 TiB.
MAX_SPACE_BYTES = 1 << 46
_LIMITED_FIELDS = ("capacity", "reservation_size", "extent_size")


def _quote(value: str) -> str:
    return quote(value, 40)


def parse_size(value: Any, *, name: str = "size") -> int:
    """Return ``value`` as a positive number of bytes, or raise InvalidArgumentError.

    Binary units KiB/MiB/GiB/TiB and bare K/M/G/T match in any case (``"64mib"``, ``"64m"``:
    64 x 2^20); decimal units only as SI writes them: kB/KB, MB, GB, TB (``"64MB"``: 64 x 10^6).
    ``"64mb"``, ``"64Mb"`` (MiB? MB? megabits?) are refused, the message giving both spellings.
    The exact bytes are returned: a space rounds its capacity down to whole pages itself
    (``AddressSpace.capacity_bytes`` is what it got; the CLI warns when that differs).
    """
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a number of bytes, not a bool")
    if isinstance(value, str):
        if len(value) > _MAX_SIZE_CHARS:
            raise InvalidArgumentError(f"{name}: {_quote(value)} is too long for a size (at most "
                                       f"{_MAX_SIZE_CHARS} characters; try '64MiB' or '2GiB')")
        m = _SIZE_RE.match(value)
        unit = m.group(2) if m else ""
        scale = _DECIMAL_UNITS.get(unit) or _BINARY_UNITS.get(unit.lower())
        if m and not scale and unit.lower() in ("kb", "mb", "gb", "tb"):  # "64mb": MiB? MB? megabits?
            x, p, e = m.group(1), unit[0].upper(), "KMGT".index(unit[0].upper()) + 1
            raise InvalidArgumentError(f"{name}: {_quote(value)} is ambiguous: write {x}{p}iB for {x} x 2^{10 * e} "
                                       f"bytes or {x}{p}B for {x} x 10^{3 * e} bytes")
        if not m or not scale:
            raise InvalidArgumentError(f"{name}: cannot parse {_quote(value)} as a size (try '64MiB' or '2GiB')")
        number = m.group(1)
        if "." in number:
            whole, frac = number.split(".")
            scaled = int(whole) * scale * 10 ** len(frac) + int(frac) * scale
            if scaled % 10 ** len(frac):
                raise InvalidArgumentError(f"{name}: {_quote(value)} is not a whole number of bytes")
            n = scaled // 10 ** len(frac)
        else:
            n = int(number) * scale
    else:
        try:
            n = operator.index(value)
        except TypeError:
            raise InvalidArgumentError(
                f"{name} must be an integer number of bytes or a string like '64MiB', not {type(value).__name__}"
            ) from None
    if n <= 0:
        raise InvalidArgumentError(f"{name} must be positive, got {n}")
    if n > MAX_U64:
        raise InvalidArgumentError(f"{name} of {n} bytes is beyond any address space")
    return n


def format_size(n: int) -> str:
    """Render bytes the way users read them: '64 MiB', '1.50 GiB', '512 B'."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            q = n / scale
            return f"{q:.0f} {unit}" if q == int(q) else f"{q:.2f} {unit}"
    return f"{n} B"


@dataclasses.dataclass(frozen=True)
class Config:
    """How an address space is built. ``None`` means "the backend's default"."""

    backend: str = "auto"                 # "auto" (a GPU backend if one is usable, else host) or a registered name (backends.names())
    device: int = 0                       # CUDA device ordinal
    capacity: int | None = None           # most bytes of physical pages held (cuda: free memory less a margin; host: 1 GiB)
    page_size: int | None = None          # bytes per physical page (default: the backend's granularity, 2 MiB on H100)
    small_threshold: int | None = None    # PyTorch's small pool in the statistics: allocations up to this (default 1 MiB)
    host_granularity: int | None = None   # host backend only: simulated driver granularity (default 2 MiB)
    host_capacity: int | None = None      # pinned host bytes for evicted pages (eviction engine)
    reservation_size: int | None = None   # virtual bytes per reservation (default 2 x capacity)
    evict_mode: str = "auto"              # "mapped": evicted pages stay mapped, backed by host memory
                                          # (CUDA >= 12.2 HOST_NUMA; host backend); "copy": pinned slots,
                                          # address unmapped while evicted; "auto": copy (the faster, measured)
    cost_model: str | None = None         # host backend only: charge each call what it costs on this GPU
                                          # on a modeled clock (docs/cost-model.md); None: no model
    extent_size: int | None = None        # largest physical handle under one large allocation: those of
                                          # >= min(32 MiB, extent_size) (in whole pages) get extents (docs/eviction.md);
                                          # default 256 MiB; the page size turns extents off

    _SIZE_FIELDS = ("capacity", "page_size", "small_threshold", "host_granularity", "host_capacity", "reservation_size",
                    "extent_size")

    if TYPE_CHECKING:  # what the constructor accepts: sizes as text too ("8GiB"); the fields hold ints
        def __init__(self, backend: str = "auto", device: int = 0, capacity: int | str | None = None,
                     page_size: int | str | None = None, small_threshold: int | str | None = None,
                     host_granularity: int | str | None = None, host_capacity: int | str | None = None,
                     reservation_size: int | str | None = None, evict_mode: str = "auto",
                     cost_model: str | None = None, extent_size: int | str | None = None) -> None: ...

    def __post_init__(self) -> None:
        choices = backends.choices()  # "auto" and the core's registered backends
        if self.backend not in choices:
            raise InvalidArgumentError(f"backend must be one of {', '.join(choices)}, got {self.backend!r}")
        if self.evict_mode not in EVICT_MODES:
            raise InvalidArgumentError(f"evict_mode must be one of {', '.join(EVICT_MODES)}, got {self.evict_mode!r}")
        if self.cost_model is not None:
            name = self.cost_model.lower() if isinstance(self.cost_model, str) else self.cost_model
            if name not in COST_MODELS:
                raise InvalidArgumentError(f"cost_model must be one of {', '.join(COST_MODELS)} or None, "
                                           f"got {self.cost_model!r}")
            if self.backend != "host":
                raise InvalidArgumentError(f"cost_model={name!r} models the driver on the host backend: it needs "
                                           f"backend='host', not {self.backend!r}")
            object.__setattr__(self, "cost_model", name)
        if isinstance(self.device, bool):
            raise InvalidArgumentError("device must be an integer ordinal")
        try:
            device = operator.index(self.device)
        except TypeError:
            raise InvalidArgumentError(f"device must be an integer ordinal, not {type(self.device).__name__}") from None
        if not 0 <= device < 1 << 20:
            raise InvalidArgumentError(f"device must be a non-negative ordinal, got {device}")
        object.__setattr__(self, "device", device)
        for name in self._SIZE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_size(value, name=name))
        for name in _LIMITED_FIELDS:
            value = getattr(self, name)
            if value is not None and value > MAX_SPACE_BYTES:
                raise InvalidArgumentError(
                    f"{name} of {value} bytes ({format_size(value)}) is above the limit of an address space, "
                    f"2^46 bytes (64 TiB)")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Config":
        """Read the environment, then apply keyword overrides: keyword arguments win over a
        single ``VTALLOC_<FIELD>`` variable, which wins over the same key in ``VTALLOC_CONF``
        (``key:value`` pairs joined by commas, as PYTORCH_CUDA_ALLOC_CONF), which wins over the
        defaults. A ``VTALLOC_*`` name vtalloc does not know is warned about (ConfigWarning), once."""
        environ = os.environ if environ is None else environ
        warn_unknown_env(environ)
        values = _parse_conf(environ.get(CONF_ENV, ""))
        for field in dataclasses.fields(cls):
            name = "VTALLOC_" + field.name.upper()
            raw = environ.get(name)
            if raw is not None and raw != "":
                values[field.name] = _env_value(field.name, raw, f"{field.name} ({name})")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise InvalidArgumentError(f"unknown vtalloc option(s): {', '.join(sorted(unknown))}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)


# -- the environment ----------------------------------------------------------------------------

CONF_ENV = "VTALLOC_CONF"
# Every VTALLOC_* variable vtalloc reads besides VTALLOC_<FIELD> of Config: a name outside
# this set and the fields' is a typo, warned about once by from_env().
OTHER_ENV = frozenset({
    CONF_ENV,
    "VTALLOC_SOCKET",         # the service's address (server/protocol/address.py)
    "VTALLOC_RUNTIME_DIR",    # where published stats and the socket live (allocator/publish.py)
    "VTALLOC_DAEMON_UIDS",    # uids a client trusts to run its daemon (server/protocol/rendezvous.py)
    "VTALLOC_QUOTA_MIN",      # a client's declared quota, sent in its hello (server/protocol/declared_quota.py)
    "VTALLOC_QUOTA_MAX",
    "VTALLOC_PUBLISH_STATS",  # publish every space's stats for `vtalloc stats --pid`
    "VTALLOC_LIBRARY",        # the native library to load (allocator/_native.py)
    "VTALLOC_SLOW_TESTS",     # the test suite's slow tests
    "VTALLOC_TORCH_BINDING",  # enable()'s binding: auto, native, pluggable (allocator/torch/binding_choice.py)
    "VTALLOC_CACHE_DIR",      # where the torch-native binding is built (allocator/torch/binding_build.py)
})


class ConfigWarning(UserWarning):
    """A ``VTALLOC_*`` environment variable that vtalloc does not read (a typo, most likely)."""


_warned: set[str] = set()


def known_env() -> frozenset[str]:
    return OTHER_ENV | {"VTALLOC_" + f.name.upper() for f in dataclasses.fields(Config)}


def warn_unknown_env(environ: Mapping[str, str]) -> list[str]:
    """Warn once per process about each ``VTALLOC_*`` name that vtalloc does not read; returns them."""
    import warnings

    known = known_env()
    unknown = sorted(n for n in environ if n.startswith("VTALLOC_") and n not in known and n not in _warned)
    for name in unknown:
        _warned.add(name)
        hint = _close_match(name, known) or f" (known: {', '.join(sorted(known))})"
        warnings.warn(f"{name} is not a vtalloc variable and is ignored{hint}", ConfigWarning, stacklevel=3)
    return unknown


def _env_value(field: str, raw: str, source: str) -> Any:
    """One variable's (or VTALLOC_CONF key's) value, typed; errors name ``source``."""
    if field == "device":
        try:
            return int(raw)
        except ValueError:
            raise InvalidArgumentError(f"{source} must be an integer, got {_quote(raw)}") from None
    if field in Config._SIZE_FIELDS:
        return parse_size(raw, name=source)
    return raw  # the choices (backend, evict_mode, cost_model): Config names the field and the choices


def _parse_conf(conf: str) -> dict[str, Any]:
    """``VTALLOC_CONF`` ("capacity:60GiB,page_size:2MiB"), keys named as Config's fields."""
    fields = {f.name for f in dataclasses.fields(Config)}
    values: dict[str, Any] = {}
    for item in conf.split(","):
        if not item.strip():
            continue
        key, sep, raw = item.partition(":")
        key, raw = key.strip(), raw.strip()
        if not sep or not raw:
            raise InvalidArgumentError(f"{CONF_ENV}: {_quote(item.strip())} is not key:value "
                                       "(e.g. VTALLOC_CONF=capacity:8GiB,page_size:2MiB)")
        if key not in fields:
            raise InvalidArgumentError(f"{CONF_ENV}: unknown key {_quote(key)}{_close_match(key, fields)}; "
                                       f"keys: {', '.join(sorted(fields))}")
        if key in values:
            raise InvalidArgumentError(f"{CONF_ENV}: key {key!r} is given twice")
        values[key] = _env_value(key, raw, f"{CONF_ENV} key {key!r}")
    return values


def _close_match(word: str, choices: Any) -> str:
    """" (did you mean 'X'?)" for the nearest of ``choices``, or ""."""
    import difflib

    close = difflib.get_close_matches(word, sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
