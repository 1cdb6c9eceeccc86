"""Where the trace check watches: module boundaries of the recorded forward, and windows between them.

Owns: the module boundaries of the recorded iteration (:class:`Boundaries`: global module
hooks, each call's entry and exit with the position of the next aten operation), and, in every
later iteration, the hooks on the few modules where the plan's windows open and close
(:class:`Windows`), which push and pop the trace check (``activation_check``) there.

Why windows are enough: what the check must prove for a recipe is about the calls it replays
(the same function, the same constants, the same tensors as arguments, its tensor made by its
last one), not about the operations between them; positions are only how the check finds the
recorded call to compare with. A window opens at a module boundary whose position the recorded
iteration noted, so its first operation gets that position; operations outside the windows run
without a Python call. A window whose positions do not line up with the recorded ones (the
model ran otherwise before it) compares other functions, and proves nothing in it.
Why module boundaries: a module hook runs between two operations. The pack hook runs inside
one (before the operation's kernel for its inputs, after it for its outputs), where a mode
pushed sees the rest of that kernel's inner calls and not the operation itself.
Invariants: a window is pushed only while its iteration's check is alive and popped only if it
is the innermost mode; the hooks do nothing outside the forward of the pager's own thread; the
hooks of a plan are removed when another plan is adopted or the pager is dropped.
"""

from __future__ import annotations

import collections
import threading
import warnings
import weakref
from typing import Any, Callable

import torch

__all__ = ["Boundaries", "Windows", "innermost_is"]

PRE, POST = 0, 1


class Boundaries:
    """In the recorded iteration: every module call's entry and exit, with the position of the
    next operation (``position()``). ``events``: (position, module (weak), PRE or POST, the
    how-many-th such hook of that module in the iteration)."""

    def __init__(self, position: Callable[[], int]) -> None:
        self.position = position
        self.events: list[tuple[int, Any, int, int]] = []
        self._count: collections.Counter = collections.Counter()
        self._thread = threading.get_ident()
        self._handles: list[Any] = []

    def __enter__(self) -> "Boundaries":
        from torch.nn.modules import module as m

        # A module torch.compile wrapped warns on every call while global hooks exist (they also
        # fire for its wrapper); these do nothing inside a compiled region and note the wrapper's
        # call like any other, so its warning is not the user's concern while they are on.
        self._quiet = warnings.catch_warnings()
        self._quiet.__enter__()
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks",
                                category=UserWarning)
        self._handles = [m.register_module_forward_pre_hook(lambda mod, args: self._note(mod, PRE)),
                         m.register_module_forward_hook(lambda mod, args, out: self._note(mod, POST))]
        return self

    def __exit__(self, *exc: Any) -> None:
        _remove(self._handles)
        self._quiet.__exit__(*exc)

    def _note(self, mod: Any, kind: int) -> None:
        if torch.compiler.is_compiling():
            return  # traced into a compiled graph: no boundary of the eager forward
        k = _nth(self._count, self._thread, mod, kind)
        if k >= 0:
            self.events.append((self.position(), weakref.ref(mod), kind, k))

    @property
    def edges(self) -> tuple[int, ...]:
        return tuple(sorted({e[0] for e in self.events}))


class Windows:
    """The plan's windows, as module hook calls that open and close them (``wins``: [open, close)
    positions from ``activation_costs.check_windows``; ``events``: the recorded iteration's).
    Its hooks stay on those modules while the plan stands (:meth:`remove` takes them off); they
    act only between :meth:`begin` and :meth:`end` of an iteration, on that iteration's thread."""

    def __init__(self, wins: list[tuple[int, int]], events: list[tuple[int, Any, int, int]], ops: int) -> None:
        first: dict[int, tuple[Any, int, int]] = {}
        for pos, ref, kind, k in events:
            first.setdefault(pos, (ref, kind, k))
        self.at_start = any(a == 0 for a, _ in wins)
        self.opens: dict[tuple[int, int, int], int] = {}
        self.closes: set[tuple[int, int, int]] = set()
        hooked: dict[tuple[int, int], Any] = {}
        for a, b in wins:
            for pos, into in ((a, "open"), (b, "close")):
                if (into == "open" and pos == 0) or (into == "close" and pos >= ops):
                    continue  # the context's entry and exit
                ref, kind, k = first[pos]
                mod = ref()
                if mod is None:
                    continue  # gone: the window stays open to the end of the forward (sound, dearer)
                hooked[(id(mod), kind)] = ref
                if into == "open":
                    self.opens[(id(mod), kind, k)] = pos
                else:
                    self.closes.add((id(mod), kind, k))
        self.check: Any = None
        self._thread = 0
        self._count: collections.Counter = collections.Counter()
        self._handles = []
        for (_, kind), ref in hooked.items():
            mod = ref()
            if mod is not None:
                hook = _Hook(weakref.ref(self), kind)
                self._handles.append(mod.register_forward_pre_hook(hook) if kind == PRE else mod.register_forward_hook(hook))

    def begin(self, check: Any) -> None:
        """An iteration starts with ``check`` on this thread."""
        self.check, self._thread = check, threading.get_ident()
        self._count.clear()

    def end(self) -> None:
        self.check = None

    def remove(self) -> None:
        """Take the hooks off (the plan changed, or the pager is dropped)."""
        self.check = None
        _remove(self._handles)

    def _hook(self, mod: Any, kind: int) -> None:
        k = _nth(self._count, self._thread, mod, kind)
        if k < 0:
            return
        at = (id(mod), kind, k)
        if at in self.closes:
            self.check.close()
        pos = self.opens.get(at)
        if pos is not None:
            self.check.open(pos)


class _Hook:
    """A window's module hook: it holds its windows weakly, and a model pickled with it on
    (``torch.save(model)``) gets an inert one."""

    def __init__(self, windows: Any, kind: int) -> None:
        self.windows, self.kind = windows, kind

    def __call__(self, mod: Any, *args: Any) -> None:
        w = self.windows()
        if w is not None and w.check is not None and not torch.compiler.is_compiling():
            w._hook(mod, self.kind)

    def __reduce__(self) -> tuple:
        return (_inert, ())


class _Inert:
    def __call__(self, *args: Any) -> None:
        return None


def _inert() -> _Inert:
    return _Inert()


def _nth(count: collections.Counter, thread: int, mod: Any, kind: int) -> int:
    """Which call of ``mod``'s ``kind`` hook this is in the iteration (from 0); -1 on another thread."""
    if threading.get_ident() != thread:
        return -1
    key = (id(mod), kind)
    k = count[key]
    count[key] = k + 1
    return k


def _remove(handles: list) -> None:
    while handles:
        handles.pop().remove()


def innermost_is(mode: Any) -> bool:
    """Whether ``mode`` is the innermost dispatch mode now."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode() is mode

