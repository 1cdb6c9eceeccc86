"""The side channel on a socketpair: descriptors travel, identity is the kernel's, bad datagrams are refused."""

from __future__ import annotations

import os
import socket

import pytest

from vtalloc.server.protocol.address import side_channel_path
from vtalloc.server.protocol.side_channel import MAX_MESSAGE_BYTES, ProtocolError, decode, encode, recv_message, send_message
from vtalloc.server.side_channel import peer_credentials, peer_pidfd


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a, b
    a.close()
    b.close()


def open_fds() -> set[int]:
    return {int(x) for x in os.listdir("/proc/self/fd")}


def test_descriptors_arrive_and_point_at_the_same_file(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        send_message(a, {"t": "pages", "page_ids": [7]}, [w])
        msg, fds = recv_message(b, 1.0)
        assert msg == {"t": "pages", "page_ids": [7]} and len(fds) == 1
        os.write(fds[0], b"hi")
        os.close(fds[0])
        assert os.read(r, 2) == b"hi"
    finally:
        os.close(r)
        os.close(w)


def test_peer_identity_is_the_kernels(pair):
    a, _ = pair
    assert peer_credentials(a) == (os.getpid(), os.geteuid(), os.getegid())
    fd, exact = peer_pidfd(a, os.getpid())
    kernel = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    assert fd is not None and exact == (kernel >= (6, 5))  # SO_PEERPIDFD since Linux 6.5; before: pidfd_open
    os.close(fd)


def test_too_many_descriptors_are_closed_not_leaked(pair):
    a, b = pair
    r, w = os.pipe()
    before = open_fds()
    send_message(a, {"t": "pages", "page_ids": [1, 2, 3]}, [r, w, r])
    with pytest.raises(ProtocolError):
        recv_message(b, 1.0, max_fds=2)
    assert open_fds() == before
    os.close(r)
    os.close(w)


def test_oversized_and_undecodable_datagrams_are_protocol_errors(pair):
    a, b = pair
    a.send(b"x" * (MAX_MESSAGE_BYTES + 100))
    with pytest.raises(ProtocolError):
        recv_message(b, 1.0)
    for junk in (b"\xff\xfe", b"[1,2]", b'{"t": 5}', b"{not json"):
        a.send(junk)
        with pytest.raises(ProtocolError):
            recv_message(b, 1.0)
    with pytest.raises(ProtocolError):
        encode({"t": "x", "pad": "y" * MAX_MESSAGE_BYTES})
    assert decode(encode({"t": "ok"})) == {"t": "ok"}


def test_eof_and_timeout(pair):
    a, b = pair
    with pytest.raises(TimeoutError):
        recv_message(b, 0.05)
    a.close()
    with pytest.raises(EOFError):
        recv_message(b, 1.0)


def test_side_channel_path_sits_beside_the_control_socket():
    assert side_channel_path("/run/vtalloc/vtalloc.sock") == "/run/vtalloc/vtalloc.fd.sock"
    assert side_channel_path("/tmp/x/ctl") == "/tmp/x/ctl.fd.sock"
