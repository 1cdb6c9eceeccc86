"""Regions through the daemon (docs/regions.md): a client pauses a region and its pages go back to
the node, another process leases them, gives them back, and the first resumes with every byte;
what is paused shows per session and per tag in `vtalloc stats`, `vtalloc pages` and Prometheus;
reports listing regions are checked like any other report value."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from helpers.schemas import validate
from prometheus_client.parser import text_string_to_metric_families
from helpers.service import ClientProc, Daemon, Observer, wait_until
from helpers.spaces import PAGE, MiB
from typer.testing import CliRunner

from vtalloc.allocator import InvalidArgumentError
from vtalloc.client.cli import app
from vtalloc.server.metrics import METRICS_MAX_REGIONS, OTHER_REGIONS, regions_paused
from vtalloc.server.reports import check_report
from vtalloc.server.views import ClientReport, RegionReport

WEIGHTS = 16 * PAGE - 4096  # 16 pages: the whole 32 MiB node


def cli_json(d: Daemon, *args: str) -> dict:
    r = CliRunner().invoke(app, [*args, "--json"], env={"VTALLOC_SOCKET": d.socket})
    assert r.exit_code == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout.splitlines()[0])


def test_a_paused_regions_pages_serve_another_process_then_come_back_with_their_bytes():
    with Daemon(capacity="32MiB", args=("--default-quota", "0:1GiB", "--metrics-port", "0"), evict_deadline=0.5) as d, \
            Observer(d.address) as obs, ClientProc() as a, ClientProc() as b:
        sid = a.ok("open", address=d.address, batch=1)["session_id"]
        w = a.ok("malloc", nbytes=WEIGHTS, seed=1, tag="weights")["addr"]
        b.ok("open", address=d.address, batch=1)
        r = b.call("malloc", nbytes=WEIGHTS, seed=2)
        assert not r["ok"] and r["error"] == "NodeShortError"  # the node is full, the weights live
        assert a.ok("pause", tag="weights")["bytes"] == 16 * PAGE
        assert obs.stats().device.free_pages == 16  # given back to the node at once

        def shown() -> dict | None:
            doc = cli_json(d, "stats")
            s = [x for x in doc["sessions"] if x["session_id"] == sid]
            return doc if s and s[0]["paused_bytes"] == WEIGHTS else None

        doc = wait_until(shown, 10, interval_s=0.05)
        validate(doc)
        mine = next(x for x in doc["sessions"] if x["session_id"] == sid)
        assert mine["regions"] == [{"tag": "weights", "bytes": WEIGHTS, "paused_bytes": WEIGHTS,
                                    "host_bytes": 16 * PAGE}]  # the host pool holds whole pages
        assert doc["devices"][0]["paused_bytes"] == WEIGHTS
        pages = cli_json(d, "pages")
        validate(pages)
        assert next(x for x in pages["sessions"] if x["session_id"] == sid)["paused_bytes"] == WEIGHTS
        text = urllib.request.urlopen(d.ready["metrics"], timeout=5).read().decode()
        samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
                   for f in text_string_to_metric_families(text) for x in f.samples}
        node = (("backend", "host"), ("device", "0"))
        assert samples[("vtalloc_region_paused_bytes", (*node, ("region", "weights")))] == WEIGHTS
        assert samples[("vtalloc_client_paused_bytes", node)] == WEIGHTS

        other = b.ok("malloc", nbytes=WEIGHTS, seed=2)["addr"]  # the other process leases every freed page
        assert b.ok("check", addr=other, nbytes=WEIGHTS, seed=2)["intact"]
        r = a.call("resume", tag="weights")  # the node is short and the other's pages are live
        assert not r["ok"] and "MemoryError" in r["bases"]
        b.ok("free", addr=other)
        b.ok("trim")  # every page back to the node
        a.ok("resume", tag="weights")
        assert a.ok("check", addr=w, nbytes=WEIGHTS, seed=1)["intact"]
        wait_until(lambda: cli_json(d, "stats")["devices"][0]["paused_bytes"] == 0, 10, interval_s=0.05)


def test_a_resume_waits_for_the_other_process_to_give_pages_back_within_its_timeout():
    with Daemon(capacity="32MiB", args=("--default-quota", "0:1GiB"), evict_deadline=0.3) as d, \
            ClientProc() as a, ClientProc() as b:
        a.ok("open", address=d.address, batch=1)
        w = a.ok("malloc", nbytes=WEIGHTS, seed=3, tag="weights")["addr"]
        a.ok("pause", tag="weights", discard=False)
        b.ok("open", address=d.address, batch=1)
        other = b.ok("malloc", nbytes=WEIGHTS, seed=4)["addr"]
        a.send("resume", tag="weights", timeout=30)
        time.sleep(1.0)  # a tries, the node is short: it waits
        b.ok("free", addr=other)
        b.ok("trim")
        assert a.recv(30)["ok"]
        assert a.ok("check", addr=w, nbytes=WEIGHTS, seed=3)["intact"]


@pytest.mark.parametrize("regions, why", [
    ((RegionReport("w", 1, 1, 0),) * 2, "twice"),
    (tuple(RegionReport(f"t{i}") for i in range(65)), "at most 64"),
    ((RegionReport("bad tag"),), "a tag is"),
    ((RegionReport("x" * 100_000),), "a tag is"),
    ((RegionReport("w", 1 << 60),), "regions.bytes"),
    ((RegionReport("w", 0, -1),), "regions.paused_bytes"),
])
def test_a_report_whose_regions_break_a_rule_is_refused_whole(regions, why):
    with pytest.raises(InvalidArgumentError, match=why) as e:
        check_report(ClientReport(paused_bytes=1, regions=regions))
    assert len(str(e.value)) < 400  # a huge tag is quoted, not echoed whole


def test_the_exporter_labels_a_bounded_number_of_region_tags():
    class S:  # a session view, as far as the exporter reads it
        def __init__(self, regions):
            self.report = ClientReport(regions=regions)

    sessions = [S(tuple(RegionReport(f"t{i}-{j}", 0, (i + 1) * MiB) for j in range(8))) for i in range(10)]
    sessions.append(S((RegionReport("t9-0", 0, 5),)))  # the same tag in two sessions adds up
    rows = regions_paused(sessions)
    assert len(rows) == METRICS_MAX_REGIONS + 1 and rows[-1][0] == OTHER_REGIONS
    assert rows[0] == ("t9-0", 10 * MiB + 5)
    assert sum(n for _, n in rows) == sum(8 * (i + 1) * MiB for i in range(10)) + 5
