"""Byte sizes the tests speak in (one definition for every test file).

Owns: MiB, and PAGE, the default page of the host and cuda backends (2 MiB).
"""

MiB = 1 << 20
PAGE = 2 * MiB
