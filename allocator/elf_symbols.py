"""The symbols a shared library or object file imports and defines, read straight from its ELF file.

Owns: reading the symbol tables of a 64-bit little-endian ELF file (no binutils needed), and the
two classes of C++ runtime symbols vtalloc's native code must not use: iostreams and the locale
(the core: none at all), and the formatting of numbers through a stream (the torch-native
binding, whose objects torch's headers give some string-only stream code it cannot avoid).
Invariants: reads only; a file that is not 64-bit little-endian ELF is a ValueError; names are
the mangled ones, without their @VERSION suffix where a test asks by pattern.

Why: a locale first touched from vtalloc's core crashed a later ``import torch`` (2026-11-22), and
a number inserted into a stream by the binding's own code crashed the process at its first
out-of-memory (2026-11-28); docs/design.md, "No iostreams in the core or the binding".
"""

from __future__ import annotations

import dataclasses
import re
import struct

__all__ = [
    "IOSTREAM_LOCALE_PATTERNS", "NUMBER_FORMATTING_PATTERNS", "Symbol", "symbols", "undefined_dynamic_symbols",
    "is_iostream_or_locale", "formats_numbers",
]

SHT_SYMTAB = 2
SHT_DYNSYM = 11
SHN_UNDEF = 0

# Mangled fragments of the C++ iostreams and locale machinery (libstdc++'s names).
IOSTREAM_LOCALE_PATTERNS = [
    r"St6locale", r"St8ios_base", r"St9basic_ios", r"St15basic_streambuf",
    r"St13basic_[io]stream", r"St14basic_iostream", r"St13basic_filebuf", r"St1[34]basic_[io]?fstream",
    r"St12__basic_file", r"basic_[io]?stringstream", r"basic_stringbuf", r"St7codecvt", r"St5ctype",
    r"St7num_(put|get)", r"St8numpunct", r"St7collate", r"St8messages", r"St10moneypunct", r"regex_traits",
    r"St21ios_base_library_init", r"^_ZNS[iod]", r"^_ZSt(4cout|4cerr|4clog|3cin|5wcout|5wcerr|4wcin)", r"RS[iod]",
]
_IOSTREAM_LOCALE = re.compile("|".join(f"(?:{p})" for p in IOSTREAM_LOCALE_PATTERNS))

# A number (or pointer, or bool) written into a stream: std::ostream::_M_insert<T>, the member
# operator<< for arithmetic types and pointers, and the num_put facet they look up. This is
# what c10::str / TORCH_CHECK pull in for a numeric argument, and what crashed.
NUMBER_FORMATTING_PATTERNS = [r"_ZNSo9_M_insertI", r"_ZNSolsE", r"St7num_put"]
_NUMBER_FORMATTING = re.compile("|".join(f"(?:{p})" for p in NUMBER_FORMATTING_PATTERNS))


@dataclasses.dataclass(frozen=True)
class Symbol:
    name: str      # mangled, with any @VERSION suffix the dynamic table gives
    defined: bool  # False: imported (undefined here)


def _bare(symbol: str) -> str:
    return symbol.split("@", 1)[0]


def is_iostream_or_locale(symbol: str) -> bool:
    """Whether a mangled symbol (with or without its @VERSION suffix) belongs to iostreams/locale."""
    return bool(_IOSTREAM_LOCALE.search(_bare(symbol)))


def formats_numbers(symbol: str) -> bool:
    """Whether a mangled symbol writes a number into a C++ stream (NUMBER_FORMATTING_PATTERNS)."""
    return bool(_NUMBER_FORMATTING.search(_bare(symbol)))


def symbols(path: str, *, table: str = "dynamic") -> list[Symbol]:
    """The named symbols of ``path``'s dynamic table (a shared library) or, with
    ``table="static"``, its full symbol table (an object file)."""
    wanted = {"dynamic": SHT_DYNSYM, "static": SHT_SYMTAB}[table]
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
    try:
        return _read(data, wanted)
    except (struct.error, IndexError, ValueError) as e:
        raise ValueError(f"{path}: a damaged ELF file ({e})") from None


def _read(data: bytes, wanted: int) -> list[Symbol]:
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out: list[Symbol] = []
    for _sh_name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != wanted or entsize == 0:
            continue
        strtab_offset = sections[link][4]
        for at in range(offset, offset + size, entsize):
            st_name, _st_info, _st_other, st_shndx = struct.unpack_from("<IBBH", data, at)
            if st_name == 0:
                continue
            end = data.index(b"\0", strtab_offset + st_name)
            out.append(Symbol(data[strtab_offset + st_name:end].decode(errors="replace"), st_shndx != SHN_UNDEF))
    return out


def undefined_dynamic_symbols(path: str) -> list[str]:
    """Names of the symbols a 64-bit little-endian ELF shared library imports."""
    return [s.name for s in symbols(path) if not s.defined]
