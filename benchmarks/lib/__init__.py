"""The shared code of the benchmark scripts (benchmarks/*.py import it as ``lib.<module>``).

Owns: nothing but the package. Each module is a library of one or more scripts, never run on its
own; benchmarks/README.md ("Library") lists them with what each holds.
Invariants: a script finds this package because benchmarks/ is first on sys.path (Python puts a
script's folder there; tests/helpers/benchmarks.py does the same); nothing here imports a script.
"""
