"""NativeHandle: the lifetime of one native object held through ctypes.

Owns: context-manager use (``with`` closes) and the last step of the lifetime: when the
Python object is collected, the native object is closed (a no-op if ``close()`` ran: native
close is idempotent) and then destroyed. Subclasses set ``_handle``/``_lib`` and name their
native close and destroy functions, and call ``_own()`` once the handle is theirs.

Invariants: one Python object per native handle: copy, deepcopy and pickle raise
NotCopyableError (``Unique``), never a second owner that would close the handle twice. The
handle belongs to the process that created it: in a forked child ``_forked()`` is true, the
subclass's methods raise ClosedError, and neither ``close()`` nor collection touches the native
object (the child's copy of it is dropped with the child; the parent's pages, mappings and
descriptors are never closed, freed or written in the parent's name).
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

from .errors import InternalError, NotCopyableError


class Unique:
    """Refuses copy.copy, copy.deepcopy and pickle with NotCopyableError: for objects that own
    a native handle, a socket or a session, where a copy would be a second owner."""

    def _refuse_copy(self, what: str) -> NoReturn:
        raise NotCopyableError(f"a {type(self).__name__} owns a native resource and cannot be {what}; "
                               "create a new one instead")

    def __copy__(self) -> NoReturn:
        self._refuse_copy("copied")

    def __deepcopy__(self, memo: Any) -> NoReturn:
        self._refuse_copy("deep-copied")

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        self._refuse_copy("pickled")

    def __reduce__(self) -> NoReturn:
        self._refuse_copy("pickled")

    def __getstate__(self) -> NoReturn:
        self._refuse_copy("pickled")


class NativeHandle(Unique):
    _CLOSE_FN: str = ""    # e.g. "vta_space_close"
    _DESTROY_FN: str = ""  # e.g. "vta_space_destroy"
    _handle: int | None = None
    _lib: Any = None
    _owner_pid: int = 0    # the process whose handle it is (0: none yet)

    def _own(self, handle: int | None) -> None:
        if not handle:  # the create call succeeded: the core always returns a handle then
            raise InternalError(f"{type(self).__name__}: the core returned no handle")
        self._owner_pid = os.getpid()
        self._handle = handle

    def _forked(self) -> bool:
        """True in a child forked after the handle was made: the handle is the parent's."""
        return self._owner_pid != 0 and self._owner_pid != os.getpid()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None and not self._forked():
            try:
                getattr(self._lib, self._CLOSE_FN)(handle)
            finally:
                getattr(self._lib, self._DESTROY_FN)(handle)
