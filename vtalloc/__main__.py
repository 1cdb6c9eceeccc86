"""``python -m vtalloc``: the ``vtalloc`` command, for when the console script is not on PATH.

Owns: nothing but the hand-over to vtalloc.client.cli.main (as ``python -m vtalloc.client``).
Invariants: the same exit codes and output as the ``vtalloc`` console script (it is the same function).
"""

from vtalloc.client.cli import main

if __name__ == "__main__":
    main()
