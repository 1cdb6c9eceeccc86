"""The side channel sends descriptors with the standard library's socket.send_fds; it receives
them with one recvmsg (recv_datagram) because socket.recv_fds drops MSG_CMSG_CLOEXEC."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from vtalloc.server.protocol.side_channel import ProtocolError, recv_message, send_message

ROOT = Path(__file__).resolve().parent.parent


def _pair():
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def test_descriptors_arrive_usable_and_close_on_exec():
    a, b = _pair()
    r, w = os.pipe()
    try:
        send_message(a, {"t": "pages", "page_ids": [7]}, [w])
        msg, fds = recv_message(b, 5, max_fds=1)
        assert msg == {"t": "pages", "page_ids": [7]} and len(fds) == 1
        assert not os.get_inheritable(fds[0])  # MSG_CMSG_CLOEXEC
        os.write(fds[0], b"x")
        assert os.read(r, 1) == b"x"
        os.close(fds[0])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_more_descriptors_than_allowed_are_refused_and_closed():
    a, b = _pair()
    r, w = os.pipe()
    try:
        send_message(a, {"t": "bye"}, [w, w])
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(ProtocolError, match="truncated|descriptors"):
            recv_message(b, 5, max_fds=1)
        assert set(os.listdir("/proc/self/fd")) <= before  # none of them leaked
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_one_receive_path_and_no_hand_written_send():
    hits = {}
    for path in [*ROOT.glob("server/**/*.py"), *ROOT.glob("client/*.py")]:
        for call in re.findall(r"\.(recvmsg|sendmsg)\(|socket\.(send_fds|recv_fds)\(", path.read_text()):
            hits.setdefault(path.relative_to(ROOT).as_posix(), []).append("".join(call))
    assert hits == {"server/protocol/side_channel.py": ["send_fds", "recvmsg"]}


def test_why_not_recv_fds_it_drops_cloexec_here():
    """When this fails, socket.recv_fds honours its flags (CPython gh-107898): use it in recv_datagram."""
    a, b = _pair()
    r, w = os.pipe()
    try:
        socket.send_fds(a, [b"{}"], [w])
        _, fds, _, _ = socket.recv_fds(b, 100, 1, socket.MSG_CMSG_CLOEXEC)
        inheritable = os.get_inheritable(fds[0])
        os.close(fds[0])
        assert inheritable
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()
