"""A socket whose last close() blocks: what a hostile peer sends to stall whoever closes it.

Owns: :func:`lingering_socket` (yields the lingering socket and its peer). Invariant: the test holds the peer end open (never reading)
until the context ends, then closes it, which resets the connection and ends any linger.
"""

from __future__ import annotations

import contextlib
import socket
import struct

LINGER_S = 3


@contextlib.contextmanager
def lingering_socket(linger_s: int = LINGER_S):
    """A connected TCP socket whose close() blocks for ``linger_s``: SO_LINGER on, its send
    queue full, its peer (kept open here, never reading) advertising a closed window."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        sender = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        try:
            sender.setblocking(False)
            chunk = b"x" * 65536
            with contextlib.suppress(BlockingIOError):
                while True:
                    sender.send(chunk)
            sender.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, linger_s))
            yield sender, peer
        finally:
            sender.close()  # blocks here only if the test still holds the last reference
            peer.close()    # a reset ends the linger wherever it is
