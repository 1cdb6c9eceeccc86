"""What every service command of ``vtalloc`` shares: its options, errors, session and output.

Owns: the shared options (``--socket``, ``--wide``, ``--timeout``, ``--backend``'s choices),
the error guard (an error becomes one line on stderr and an exit code: 1 runtime, 2 usage;
tracebacks with --debug), the observer session a read command opens, and the output helpers
(one JSON document per line; tables at the terminal's width or ``--wide``).
Invariants: nothing here knows a command; a command module takes what it needs from
:class:`CommandContext` and these options, so each command's options and help text are its
module's alone.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Optional

import typer
from rich.console import Console
from rich.text import Text

from vtalloc.allocator import backends
from vtalloc.allocator.errors import InvalidArgumentError, VtallocError

from .layout import natural_width

__all__ = ["Backend", "BACKEND_HELP", "PagesFormat", "CommandContext", "open_session", "emit_json", "socket_opt", "wide_opt",
           "timeout_opt", "EXIT_INTERRUPTED", "EXIT_BROKEN_PIPE", "error_line", "quiet_broken_pipe"]

# The shells' conventions for a process ended by a signal (128 + its number): Ctrl-C (SIGINT)
# and a reader that went away (SIGPIPE: Python raises BrokenPipeError instead of dying).
EXIT_INTERRUPTED = 128 + 2
EXIT_BROKEN_PIPE = 128 + 13


def error_line(message: str) -> Text:
    """"error: MESSAGE" with the label styled and the message as it is (never read as markup)."""
    return Text.assemble(("error:", "bold red"), " ", message)


def quiet_broken_pipe() -> NoReturn:
    """stdout's reader went away (`vtalloc ... | head`): exit 141 saying nothing, as a process
    killed by SIGPIPE does. stdout is pointed at /dev/null first, so the interpreter's last
    flush of what is still buffered cannot fail again on the way out."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY | os.O_NOFOLLOW)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    raise SystemExit(EXIT_BROKEN_PIPE)

# --backend's choices ("auto" and the core's registered backends): argument parsing refuses others (exit code 2).
Backend = enum.Enum("Backend", {b: b for b in backends.choices()}, type=str)  # type: ignore[misc]
# --backend's help, from the same registry.
BACKEND_HELP = (f"auto (a GPU backend if one is usable, else host) or one of: {', '.join(backends.names())} "
                "(`vtalloc info` says which run here).")


class PagesFormat(str, enum.Enum):
    table = "table"
    json = "json"
    torch = "torch"


_SOCKET_HELP = "The daemon's socket (unix:///path or a path). Default: $VTALLOC_SOCKET, else vtalloc.sock " \
               "in $XDG_RUNTIME_DIR/vtalloc, /run/vtalloc (root) or /tmp/vtalloc-<uid>. Clients use it only if " \
               "its directory, the sockets and the daemon are their own uid's, root's or a uid in " \
               "$VTALLOC_DAEMON_UIDS."

socket_opt = typer.Option(None, "--socket", envvar="VTALLOC_SOCKET", help=_SOCKET_HELP)
wide_opt = typer.Option(False, "--wide", help="One line per row, however wide (default: fit the terminal, "
                        "moving columns that do not fit to a further block of rows).")
timeout_opt = typer.Option(5.0, "--timeout", min=0.1, help="Seconds to wait for each answer from the daemon.")


@dataclass(frozen=True)
class CommandContext:
    """What the main app lends its commands: where to print and how to fail."""

    fail: Callable[[str, int], NoReturn]
    console: Console
    err_console: Console
    is_debug: Callable[[], bool]

    def guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Errors become one line on stderr and an exit code (tracebacks with --debug)."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (typer.Exit, typer.Abort, typer.BadParameter):
                raise
            except BrokenPipeError:
                quiet_broken_pipe()
            except InvalidArgumentError as e:
                if self.is_debug():
                    raise
                self.fail(str(e), 2)
            except (VtallocError, OSError) as e:
                if self.is_debug():
                    raise
                self.fail(str(e), 1)

        return wrapper

    def command(self, app: typer.Typer, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
        """``app.command(*args, **kwargs)`` over :meth:`guard`: a service command whose errors are guarded."""

        def decorate(fn: Callable[..., Any]) -> Any:
            return app.command(*args, **kwargs)(self.guard(fn))

        return decorate

    def show(self, tables: list[Any], wide: bool) -> None:
        """Print tables at the terminal's width (columns that do not fit go to further blocks),
        or with ``wide`` one block each, as wide as it needs."""
        out = self.console
        if wide:
            out = Console(width=max([self.console.width, *(natural_width(t) for t in tables)]), file=self.console.file,
                          force_terminal=self.console.is_terminal, no_color=self.console.no_color, markup=False)
        for n, t in enumerate(tables):
            if n:
                out.print()
            out.print(t)

    def width(self, wide: bool) -> Optional[int]:
        return None if wide else self.console.width


def open_session(socket: Optional[str], timeout: float):
    from .session import ServiceSession

    return ServiceSession(socket, kind="observer", timeout_s=timeout)


def emit_json(doc: dict[str, Any]) -> None:
    print(json.dumps(doc, separators=(",", ":")), flush=True)
