"""vtalloc: a virtual-addressing GPU memory allocator for PyTorch (the top-level package).

Owns: the release version (``__version__``, the one place it is written: pyproject.toml reads
it from here) and nothing else. The code lives in the subpackages: ``vtalloc.allocator`` (the
allocator, its torch glue in ``vtalloc.allocator.torch``), ``vtalloc.server`` (the per-node
daemon) and ``vtalloc.client`` (its client library and the ``vtalloc`` command).
Invariants: importing ``vtalloc`` imports nothing else (no torch, no native library).
"""

__version__ = "0.1.0"
