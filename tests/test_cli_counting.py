"""What `vtalloc stats` counts is true: OOMs are the ones a caller saw, fragmentation of a space
with evicted pages is not hidden by a clamp.

- A service-backed space's first try of a malloc fails in the core when it holds too few pages;
  the lease then grows and the malloc succeeds: that is no OOM (``num_ooms``, the client's
  ``ooms_total``), while a malloc that raises OutOfMemoryError counts exactly one.
- Fragmentation is the share of the mapped device memory holding no live data:
  1 - (active - evicted) / mapped. Evicted allocations are still live (``active_bytes``) but
  their bytes are in host memory, not under the mapped pages.
"""

from __future__ import annotations

import json

import pytest
from helpers.service import Daemon, Observer, wait_until
from helpers.spaces import MiB, PAGE, host_space
from typer.testing import CliRunner

from vtalloc.allocator import OutOfMemoryError
from vtalloc.client.cli import app
from vtalloc.client.service_space import ServiceAddressSpace


@pytest.fixture(scope="module")
def daemon():
    with Daemon(capacity="64MiB") as d:
        yield d


def reported(daemon: Daemon, sid: str, check) -> object:
    """The session's row in the daemon's stats once ``check(row)`` holds (after a report)."""
    with Observer(daemon.address) as obs:
        def row():
            s = [x for x in obs.stats().sessions if x.info.session_id == sid and x.reported]
            return s and check(s[0]) and s[0]
        return wait_until(row, 10, interval_s=0.05)


def test_a_malloc_the_lease_serves_is_no_oom(daemon):
    with ServiceAddressSpace(daemon.address, capacity=16 * MiB, lease_batch_pages=1, keep_free_pages=0,
                             report_interval_s=0.05) as space:
        a = space.malloc(4 * MiB)  # no pages yet: the core's first try fails, the lease grows
        b = space.malloc(2 * MiB)
        assert space.stats().num_ooms == 0 and space.report().ooms_total == 0
        reported(daemon, space.session.session_id, lambda s: s.report.pages_resident == 3)
        assert reported(daemon, space.session.session_id, lambda s: True).report.ooms_total == 0
        with pytest.raises(OutOfMemoryError):
            space.malloc(16 * MiB, evict=False)  # past the 16 MiB ceiling: the caller sees one OOM
        assert space.stats().num_ooms == 1
        with pytest.raises(OutOfMemoryError):
            space.malloc(12 * MiB)  # the lease is at its ceiling and nothing is evictable: one more
        assert space.stats().num_ooms == 2
        space.free(a)
        space.free(b)
        doc = json.loads(CliRunner().invoke(app, ["stats", "--json", "--socket", daemon.socket]).stdout)
        assert all(s["ooms_total"] <= 2 for s in doc["sessions"])
        reported(daemon, space.session.session_id, lambda s: s.report.ooms_total == 2)


def test_a_restore_the_lease_serves_is_no_oom(daemon):
    with ServiceAddressSpace(daemon.address, capacity=16 * MiB, lease_batch_pages=1, keep_free_pages=0) as space:
        a = space.malloc(4 * MiB)
        space.set_evictable(a)
        space.offload(a)
        space.synchronize()
        space.give_back(space.stats().pages_total)
        space.ensure_resident(a)  # leases two pages again
        assert space.residency(a) == "resident" and space.stats().num_ooms == 0
        space.free(a)


def test_fragmentation_of_a_space_with_evicted_pages():
    with host_space(16 * MiB, host_capacity=16 * MiB) as space:
        a = space.malloc(3 * PAGE)
        space.free(space.malloc(2 * PAGE))  # 2 cached pages: mapped, no live data
        space.set_evictable(a)
        space.offload(a)
        space.synchronize()
        s = space.stats()
        assert s.pages_evicted == 3 and s.active_bytes == 3 * PAGE and s.mapped_bytes >= 2 * PAGE
        # nothing live is on the device: every mapped byte is unused
        assert s.fragmentation == 1.0
        space.ensure_resident(a)
        s = space.stats()
        assert s.pages_evicted == 0 and s.fragmentation == pytest.approx(1 - 3 * PAGE / s.mapped_bytes)
        space.free(a)


def test_the_fragmentation_formula():
    from vtalloc.allocator.stats import fragmentation

    assert fragmentation(0, 0) == 0.0
    assert fragmentation(3 * PAGE, 4 * PAGE) == 0.25
    assert fragmentation(6 * PAGE, 4 * PAGE, 6 * PAGE) == 1.0   # all live data evicted
    assert fragmentation(6 * PAGE, 4 * PAGE, 3 * PAGE) == 0.25  # 3 of 4 mapped pages live


def test_stats_shows_the_fragmentation_of_a_session_with_evicted_pages(daemon):
    with ServiceAddressSpace(daemon.address, capacity=16 * MiB, lease_batch_pages=1, keep_free_pages=4,
                             host_capacity=16 * MiB, report_interval_s=0.05) as space:
        a = space.malloc(3 * PAGE)
        space.free(space.malloc(2 * PAGE))
        space.set_evictable(a)
        space.offload(a)
        space.synchronize()
        sid = space.session.session_id
        reported(daemon, sid, lambda s: s.report.evicted_pages == 3)
        doc = json.loads(CliRunner().invoke(app, ["stats", "--json", "--session", sid,
                                                  "--socket", daemon.socket]).stdout)
        s = doc["sessions"][0]
        assert s["evicted_pages"] == 3 and s["fragmentation"] == 1.0
        space.free(a)
