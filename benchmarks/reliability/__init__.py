"""The reliability campaigns of benchmarks/soak.py (issue 11): hostile inputs per interface,
fault injection at every backend call site, SIGKILL of clients and daemon, concurrency.

Owns: nothing but the package. Each module runs one campaign and returns a JSON-able dict.
"""
