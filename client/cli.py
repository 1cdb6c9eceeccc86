"""The `vtalloc` command line.

Owns: argument parsing and rendering only; the work is done by the library layers below.
Exit codes (EXIT_CODES, also in --help and docs/service.md), the same for every command:
0 ok; 1 runtime failure (no daemon or GPU, an RPC or a check failed, `health` not serving);
2 usage error (an unknown command or option, or a bad value: a size, a backend, a quota,
also when the daemon answers INVALID_ARGUMENT; InvalidArgumentError is one); 130 interrupted.
Errors go to stderr through `fail()`; `--debug` (before or after the command) shows tracebacks.
Output: every console prints text as it is (markup=False: a path or name with "[...]" is never
read as rich markup); styles come from Text objects built here. Signals (docs/service.md, "Exit
codes"): Ctrl-C exits 130 from every command; a closed pipe (`vtalloc ... | head`) exits 141, as
a process killed by SIGPIPE, quietly.
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup
from rich.table import Table
from rich.text import Text

from vtalloc.allocator import (BackendUnavailableError, InvalidArgumentError, VtallocError, backend_available,
                               format_size)
from vtalloc.allocator.config import parse_size

from .commands_common import BACKEND_HELP, EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, error_line, quiet_broken_pipe
from .commands_service import Backend
from .commands_service import register as _register_service_commands
from .render import rounding_note

# click's usage errors: recent typer versions raise those of the copy of click they vendor
# (typer.TyperException), older ones click's own; click may be installed either way (another
# package pulls it in), so both are usage errors.
def _click_exception() -> type[Exception] | None:
    try:
        from click import ClickException
    except ImportError:  # pragma: no cover - depends on what else is installed
        return None
    return ClickException


_USAGE_ERRORS: tuple[type[Exception], ...] = tuple(
    cls for cls in (getattr(typer, "TyperException", None), _click_exception()) if cls is not None
)

EXIT_CODES = {0: "ok", 1: "runtime failure (no daemon or GPU, a failed call or check, health not serving)",
              2: "usage error (unknown command or option, bad value)", EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
              EXIT_BROKEN_PIPE: "the reader of stdout went away (a closed pipe), quietly"}
# Options of the whole program that may also be written after the command (`vtalloc stats --debug`).
GLOBAL_FLAGS = ("--debug",)


class _Group(TyperGroup):
    """Moves the global flags written after the command to before it, where click reads them."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        hoisted = [a for a in args[:end] if a in GLOBAL_FLAGS]
        rest = [a for a in args[:end] if a not in GLOBAL_FLAGS]
        return super().parse_args(ctx, hoisted + rest + args[end:])


app = typer.Typer(
    name="vtalloc",
    cls=_Group,
    help="A paged virtual-address GPU memory allocator for PyTorch: demo, inspect, serve.",
    epilog="Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + ".",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: rich's option table cut long option names ("--max-concurrent-rp…")
    # and long words at 80 columns; click wraps the help and never cuts a name.
    rich_markup_mode=None,
)
console = Console(markup=False)
err_console = Console(stderr=True, markup=False)
_state = {"debug": False}


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(error_line(message))
    raise typer.Exit(code)


def _version() -> str:
    from vtalloc import __version__

    return __version__


def _print_version(value: bool) -> None:
    if value:
        print(f"vtalloc {_version()}")
        raise typer.Exit(0)


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors (also after the command)."),
    version: bool = typer.Option(False, "--version", is_eager=True, expose_value=True, callback=_print_version,
                                 help="Print vtalloc's version and exit."),
) -> None:
    _state["debug"] = debug


def _pipe_safe(fn: Any) -> Any:
    """A closed stdout inside a command exits quietly with 141 (click would exit 1)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            quiet_broken_pipe()

    return wrapper


@app.command()
@_pipe_safe
def info(json_out: bool = typer.Option(False, "--json", help="Print JSON (schema vtalloc.info/v1).")) -> None:
    """Which backends can run here, and why not."""
    from dataclasses import asdict

    from vtalloc.allocator import backends
    from vtalloc.allocator.device_info import device_info

    rows: dict[str, dict[str, Any]] = {}
    for b in backends.auto_order():  # the core's registry, in the order "auto" tries them
        ok, why = backend_available(b.name)
        rows[b.name] = {"available": ok, "reason": why, "capabilities": b.capabilities()}
    try:
        driver: dict | None = asdict(device_info(0))
    except BackendUnavailableError:
        driver = None  # the backend rows say why
    if json_out:
        print(json.dumps({"schema": "vtalloc.info/v1", "backends": rows, "cuda_device_0": driver}))
        return
    t = Table("backend", "available", "reason")
    for name, r in rows.items():
        t.add_row(name, "yes" if r["available"] else "no", r["reason"])
    console.print(t)
    if driver:
        console.print(f"cuda device 0: {driver['name']}, driver {driver['driver_version']}, "
                      f"{format_size(driver['free_bytes'])} free of {format_size(driver['total_bytes'])}, "
                      f"VMM {'yes' if driver['vmm_supported'] else 'no'}, host-located VMM pages (mapped eviction) "
                      f"{'yes' if driver['host_numa_vmm_supported'] else 'no'}")


@app.command()
@_pipe_safe
def demo(
    backend: Backend = typer.Option("auto", help=BACKEND_HELP),
    capacity: str = typer.Option(
        "64MiB", help="Capacity of the demo address space (and of the host space the CPU training uses); "
        "rounded down to whole pages."
    ),
    device: int = typer.Option(0, help="CUDA device ordinal (defragmentation part)."),
    train: bool = typer.Option(
        True, "--train/--no-train",
        help="Also train a small MLP with vtalloc: on a GPU as torch's allocator (default capacity), "
        "else on CPU tensors over a host space.",
    ),
    steps: int = typer.Option(10, min=1, max=10_000, help="Training steps."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (schema vtalloc.demo/v1)."),
) -> None:
    """Show defragmentation by page remapping, then train a small model with vtalloc's memory."""
    from .demo import describe, run_defrag_demo

    backend_name = backend.value
    report = run_defrag_demo(backend=backend_name, capacity=capacity, device=device)
    note = rounding_note("--capacity", capacity, parse_size(capacity), report.capacity_bytes, report.page_bytes)
    if note:
        err_console.print(note, highlight=False, soft_wrap=True)
    trained = None
    if train:
        from .train_demo import run_train_demo

        trained = run_train_demo(backend=backend_name, steps=steps, capacity=capacity)
    if json_out:
        from dataclasses import asdict

        doc = {"schema": "vtalloc.demo/v1", "defrag": asdict(report)}
        if trained is not None:
            doc["train"] = asdict(trained)
        print(json.dumps(doc))
    else:
        console.rule(Text("vtalloc demo: defragmentation by remapping pages", style="bold"))
        for line in describe(report):
            console.print(line)
        t = Table("stat", "before the big allocation", "after")
        for key in ("mapped_bytes", "active_bytes", "cached_bytes", "pages_mapped", "num_page_reclaims"):
            b, a = report.stats_before[key], report.stats_after[key]
            fmt = format_size if "bytes" in key else str
            t.add_row(key, fmt(b), fmt(a))
        console.print(t)
        if trained is not None:
            from .train_demo import PAGE_STAT_KEYS, describe_train

            console.rule(Text("vtalloc demo: training with vtalloc's memory", style="bold"))
            for line in describe_train(trained):
                console.print(line)
            t = Table("page stat", "after training")
            for key in PAGE_STAT_KEYS:
                v = trained.stats[key]
                t.add_row(key, format_size(v) if "bytes" in key else str(v))
            console.print(t)
    if not report.survivors_intact:
        fail("surviving allocations were corrupted")
    if trained is not None and not trained.identical_to_reference:
        fail(f"training with vtalloc diverged from {trained.reference}")


# The service's commands (serve, stats, top, pages, plot, quota, evict, health) live in their own module.
_register_service_commands(app, fail=fail, console=console, err_console=err_console, is_debug=lambda: _state["debug"])


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point: maps vtalloc errors to exit code 1 and a one-line message,
    Ctrl-C to 130 and a closed stdout to a quiet 141 (EXIT_CODES)."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # what is still buffered: a closed pipe shows here, not at the interpreter's exit
    except BrokenPipeError:
        quiet_broken_pipe()
    sys.exit(code)


def _run(argv: Optional[list[str]]) -> int:
    try:
        # Outside standalone mode click *returns* the code of a typer.Exit raised by a command.
        code = app(args=argv, standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise
    except Exception as e:  # click usage errors carry their own exit code (2)
        if isinstance(e, _USAGE_ERRORS):
            usage: Any = e  # click's ClickException (vendored or not)
            usage.show()
            return usage.exit_code
        if _state["debug"]:
            raise
        if isinstance(e, InvalidArgumentError):  # a bad value given on the command line
            err_console.print(error_line(str(e)))
            return 2
        if isinstance(e, (VtallocError, OSError)):
            err_console.print(error_line(str(e)))
            if isinstance(e, BackendUnavailableError):
                err_console.print("hint: `vtalloc info` lists the backends usable here; `--backend host` needs no GPU")
            return 1
        raise
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    main()
