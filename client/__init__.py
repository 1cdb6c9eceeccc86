"""vtalloc.client: the command line (``vtalloc``) and the client library of the service.

Layer: the library (session.py, lease.py, lease_threads.py, service_space.py, pressure.py,
render.py, plot.py, demos) reaches the daemon only through the wire (vtalloc.server.protocol,
vtalloc.server.proto); only the CLI (cli.py, commands_*.py) imports the daemon, to run
``vtalloc serve``. ``from vtalloc.client import ServiceAddressSpace`` builds a space whose
pages are leased from the daemon; importing this package alone imports neither gRPC nor torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServiceAddressSpace", "ServiceSession"]


def __getattr__(name: str) -> Any:
    if name == "ServiceAddressSpace":
        from .service_space import ServiceAddressSpace

        return ServiceAddressSpace
    if name == "ServiceSession":
        from .session import ServiceSession

        return ServiceSession
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
