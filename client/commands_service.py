"""The service commands of ``vtalloc``: serve, stats, top, pages, plot, quota, evict, health.

Owns: the order in which they are registered on the main app (``register(app, ...)``,
client/cli.py). Each command (or pair) is a module of its own with its options and the loop
around its call: commands_serve, commands_stats (stats, top), commands_pages (pages, plot),
commands_quota, commands_evict, commands_health; what they share (options, the error guard,
the session, output) is commands_common. The RPCs are in session.py, the output in render.py,
the picture in plot.py.
Invariants: exit codes 0 ok, 1 runtime error (no daemon, permission, RPC failure), 2 usage
error (bad option values, also when the daemon reports INVALID_ARGUMENT for them). Read
commands take ``--json`` (schemas in render.py); ``--watch``/``top`` print one JSON document
per line.
"""

from __future__ import annotations

from typing import Callable, NoReturn

import typer
from rich.console import Console

from . import commands_evict, commands_health, commands_pages, commands_quota, commands_serve, commands_stats
from .commands_common import Backend, CommandContext

__all__ = ["register", "Backend"]


def register(app: typer.Typer, *, fail: Callable[[str, int], NoReturn], console: Console,
             err_console: Console, is_debug: Callable[[], bool]) -> None:
    """Add the service commands to ``app``, in the order ``--help`` lists them."""
    ctx = CommandContext(fail, console, err_console, is_debug)
    for command in (commands_serve, commands_stats, commands_pages, commands_quota, commands_evict, commands_health):
        command.register(app, ctx)
