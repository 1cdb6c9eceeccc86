"""The dynamic symbols a shared library imports, read straight from its ELF file.

No binutils needed: the tests that hold the core to "no iostreams, no locale" must run on any
machine that can build it, and must not skip where `nm` is missing.
"""

from __future__ import annotations

import re
import struct

SHT_DYNSYM = 11
SHN_UNDEF = 0

# Mangled fragments of the C++ iostreams and locale machinery (libstdc++'s names). The core
# must import none of them: a locale first touched from the core can crash a later
# `import torch` (docs/design.md, "No iostreams in the core").
IOSTREAM_LOCALE_PATTERNS = [
    r"St6locale", r"St8ios_base", r"St9basic_ios", r"St15basic_streambuf",
    r"St13basic_[io]stream", r"St14basic_iostream", r"St13basic_filebuf", r"St1[34]basic_[io]?fstream",
    r"St12__basic_file", r"basic_[io]?stringstream", r"basic_stringbuf", r"St7codecvt", r"St5ctype",
    r"St7num_(put|get)", r"St8numpunct", r"St7collate", r"St8messages", r"St10moneypunct", r"regex_traits",
    r"St21ios_base_library_init", r"^_ZNS[iod]", r"^_ZSt(4cout|4cerr|4clog|3cin|5wcout|5wcerr|4wcin)", r"RS[iod]",
]
_IOSTREAM_LOCALE = re.compile("|".join(f"(?:{p})" for p in IOSTREAM_LOCALE_PATTERNS))


def is_iostream_or_locale(symbol: str) -> bool:
    """Whether a mangled symbol (with or without its @VERSION suffix) belongs to iostreams/locale."""
    return bool(_IOSTREAM_LOCALE.search(symbol.split("@", 1)[0]))


def undefined_dynamic_symbols(path: str) -> list[str]:
    """Names of the symbols a 64-bit little-endian ELF shared library imports."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: list[str] = []
    for sh_name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if sh_type != SHT_DYNSYM:
            continue
        strtab_offset = sections[link][4]
        for at in range(offset, offset + size, entsize):
            st_name, _st_info, _st_other, st_shndx = struct.unpack_from("<IBBH", data, at)
            if st_shndx != SHN_UNDEF or st_name == 0:
                continue
            end = data.index(b"\0", strtab_offset + st_name)
            names.append(data[strtab_offset + st_name:end].decode())
    return names
