"""``python -m vtalloc.client``: the ``vtalloc`` command, for when the console script is not on PATH.

Owns: nothing but the hand-over to vtalloc.client.cli.main.
Invariants: the same exit codes and output as the ``vtalloc`` console script (it is the same function).
"""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
