"""NativeHandle: the lifetime of one native object held through ctypes.

Owns: context-manager use (``with`` closes) and the last step of the lifetime: when the
Python object is collected, the native object is closed (a no-op if ``close()`` ran: native
close is idempotent) and then destroyed. Subclasses set ``_handle``/``_lib`` and name their
native close and destroy functions.
"""

from __future__ import annotations

from typing import Any


class NativeHandle:
    _CLOSE_FN: str = ""    # e.g. "vta_space_close"
    _DESTROY_FN: str = ""  # e.g. "vta_space_destroy"
    _handle: int | None = None
    _lib: Any = None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            try:
                getattr(self._lib, self._CLOSE_FN)(handle)
            finally:
                getattr(self._lib, self._DESTROY_FN)(handle)
