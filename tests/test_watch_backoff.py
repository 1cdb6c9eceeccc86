"""The client's Watch stream: gRPC's retry policy re-sends a Watch that failed UNAVAILABLE, and
the watch thread's own pause after a failure doubles while failures repeat, instead of a fixed
sleep (client/session.py, client/lease_threads.py)."""

from __future__ import annotations

import json
import threading

import grpc

from vtalloc.client import lease_threads, session


def test_only_watch_has_a_retry_policy():
    options = dict(session._CHANNEL_OPTIONS)
    assert options["grpc.enable_retries"] == 1
    config = json.loads(options["grpc.service_config"])
    (method,) = config["methodConfig"]
    assert method["name"] == [{"service": "vtalloc.v1.Pages", "method": "Watch"}]
    assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]


class _Failing(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


class _FakeSession:
    """Every Watch fails UNAVAILABLE; records the pauses the loop takes between them."""

    alive = True
    session_id = "s-test"

    def __init__(self, link, tries: int) -> None:
        self.link, self.tries, self.calls = link, tries, 0

    def watch(self, _deadline):
        self.calls += 1
        if self.calls > self.tries:
            self.link.stop.set()

        def stream():
            raise _Failing()
            yield  # pragma: no cover - a generator that fails at once

        return stream()


def test_the_pause_after_a_failed_watch_doubles_up_to_its_cap(monkeypatch):
    link = lease_threads.Link.__new__(lease_threads.Link)
    link.stop = threading.Event()
    link.watch_call = None
    fake = _FakeSession(link, tries=8)
    link.session = fake
    pauses: list[float] = []
    real_wait = link.stop.wait

    def wait(t):
        pauses.append(t)
        return real_wait(0)

    monkeypatch.setattr(link.stop, "wait", wait)
    lease_threads._watch_loop(lambda: None, link, fake)
    lo, hi = lease_threads.WATCH_BACKOFF_S
    assert pauses[:3] == [lo, 2 * lo, 4 * lo]
    assert max(pauses) == hi and all(b == min(2 * a, hi) for a, b in zip(pauses, pauses[1:]))
