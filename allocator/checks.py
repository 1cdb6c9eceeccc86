"""Argument checks shared by the classes that hand Python values to the C ABI.

Owns: :func:`as_u64` (an integer argument as an unsigned 64-bit value), ``MAX_U64``, and
:func:`quote` (how an error message quotes what a caller passed, bounded in length),
:func:`space_name` (what a space may be called), and :func:`plain_bytes` (the bytes of a buffer
holding plain data, never Python object references or pointers).
Invariant: a bad value raises InvalidArgumentError naming the argument, before any call
into C; nothing here touches the native library, so every allocator module may use it.
"""

from __future__ import annotations

import operator
import re
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["as_u64", "MAX_U64", "quote", "space_name", "MAX_NAME_CHARS", "plain_bytes"]

MAX_U64 = (1 << 64) - 1
MAX_NAME_CHARS = 64
# A letter or digit, then letters, digits and . _ - : / @ +. No spaces (a name is one column
# of `vtalloc stats --pid`) and no '#', which only default names carry.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]*")


def as_u64(value: Any, name: str, *, positive: bool = False) -> int:
    """``value`` as an int in 0 .. 2**64-1 (1 .. with ``positive``); bools and non-integers are refused."""
    if type(value) is int and (1 if positive else 0) <= value <= MAX_U64:
        return value  # the common case, checked in one comparison (bools are not exactly int)
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an integer, not a bool")
    try:
        n = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, not {type(value).__name__}") from None
    if n < 0 or (positive and n == 0):
        raise InvalidArgumentError(f"{name} must be {'positive' if positive else 'non-negative'}, got {quote(n, 80)}")
    if n > MAX_U64:
        raise InvalidArgumentError(f"{name} {quote(n, 80)} does not fit in 64 bits")
    return n


def quote(value: object, limit: int) -> str:
    """``value`` for an error message: its repr if short, else its first ``limit`` characters
    (bytes for bytes) and its length, so a message never grows with what it quotes."""
    if isinstance(value, int) and value.bit_length() > 4 * limit:
        return f"<an integer of {value.bit_length()} bits>"  # repr() refuses ints past 4,300 digits
    if not isinstance(value, (str, bytes)):
        text = repr(value)
        return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
    if len(value) <= limit:
        return repr(value)
    unit = "characters" if isinstance(value, str) else "bytes"
    return f"{value[:limit]!r}... ({len(value)} {unit})"


def space_name(value: Any, what: str = "name") -> str:
    """``value`` as an address space's name: 1 .. MAX_NAME_CHARS characters, a letter or digit
    first, then letters, digits and ``. _ - : / @ +`` (e.g. ``encoder``, ``torch:cuda:0``)."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a str, not {type(value).__name__}")
    if not 1 <= len(value) <= MAX_NAME_CHARS:
        raise InvalidArgumentError(f"{what} must be 1 to {MAX_NAME_CHARS} characters, got {quote(value, 80)}"
                                   f" ({len(value)})")
    if not _NAME.fullmatch(value):
        raise InvalidArgumentError(f"{what} {quote(value, 80)}: use letters, digits and . _ - : / @ +, "
                                   "starting with a letter or digit")
    return value


# One item of plain data in the buffer protocol's struct syntax: numbers, booleans, chars,
# bytes and padding, in any byte order and count. Not 'O' (a Python object reference: numpy's
# object arrays), 'P' and '&' (pointers), nor 'T{...}' (structures, which may hold either).
_PLAIN_FORMAT = re.compile(r"[@=<>!]?\d*(?:[bBhHiIlLqQnNefdg?csx]|Z[fdg])")


def plain_bytes(data: Any, what: str = "data") -> memoryview:
    """``data``'s bytes as a flat, C-contiguous memoryview of unsigned bytes; InvalidArgumentError
    for what is not a buffer, not contiguous, or not plain data (object references, pointers,
    structures): copying those bytes would write raw object pointers."""
    try:
        view = memoryview(data)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be bytes-like, not {type(data).__name__}") from None
    if not _PLAIN_FORMAT.fullmatch(view.format):
        raise InvalidArgumentError(
            f"{what} must hold plain data (numbers or bytes), not items of format {quote(view.format, 40)} "
            f"({type(data).__name__}): object references, pointers and structures are refused; "
            "view plain structured data as bytes first")
    try:
        return view.cast("B")
    except TypeError:
        raise InvalidArgumentError(f"{what} must be a C-contiguous buffer") from None
