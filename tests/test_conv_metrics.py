"""The daemon's Prometheus endpoint, scraped and parsed with prometheus_client's own parser:
node labels on every vtalloc series, build info, the standard process metrics, a start time,
and "resident" as the one word for pages mapped under live allocations."""

from __future__ import annotations

import time
import urllib.request

import pytest
from helpers.service import Daemon
from helpers.sizes import MiB
from prometheus_client.parser import text_string_to_metric_families

from vtalloc.client.service_space import ServiceAddressSpace
from vtalloc.server import metrics

PAGE = 2 * MiB


@pytest.fixture(scope="module")
def scraped():
    before = time.time()
    with Daemon(capacity="64MiB", args=("--metrics-port", "0")) as d:
        with ServiceAddressSpace(d.address, lease_batch_pages=1, keep_free_pages=0) as space:
            addr = space.malloc(3 * PAGE)
            deadline = time.monotonic() + 10
            while True:  # the client's report reaches the daemon within its report interval
                text = urllib.request.urlopen(d.ready["metrics"], timeout=5).read().decode()
                samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                           for f in text_string_to_metric_families(text) for s in f.samples}
                if samples.get(("vtalloc_client_pages", (("backend", "host"), ("device", "0"),
                                                         ("state", "resident")))) == 3 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            space.free(addr)
    return before, text, samples


def test_every_vtalloc_series_names_its_backend_and_device(scraped):
    _, _, samples = scraped
    vtalloc = [(name, dict(labels)) for name, labels in samples if name.startswith("vtalloc_")]
    assert len(vtalloc) > 20
    for name, labels in vtalloc:
        assert (labels.get("backend"), labels.get("device")) == ("host", "0"), name


def test_build_info_and_start_time_replace_uptime(scraped):
    before, text, samples = scraped
    info = [dict(labels) for name, labels in samples if name == "vtalloc_build_info"]
    assert info == [{"version": metrics.version(), "backend": "host", "device": "0"}]
    assert metrics.version() != "unknown"  # the test environment installs vtalloc
    start = samples[("vtalloc_start_time_seconds", (("backend", "host"), ("device", "0")))]
    assert before - 1 <= start <= time.time()
    assert "vtalloc_uptime_seconds" not in text


def test_process_metrics_are_the_standard_ones(scraped):
    before, _, samples = scraped
    names = {name for name, _ in samples}
    assert {"process_start_time_seconds", "process_resident_memory_bytes", "process_open_fds",
            "process_cpu_seconds_total"} <= names
    assert samples[("process_resident_memory_bytes", ())] > 1 * MiB
    assert samples[("process_open_fds", ())] >= 3
    assert abs(samples[("process_start_time_seconds", ())] - before) < 60


def test_resident_is_the_word_for_pages_under_live_allocations(scraped):
    _, text, samples = scraped
    node = (("backend", "host"), ("device", "0"))
    states = {dict(labels)["state"] for name, labels in samples if name == "vtalloc_client_pages"}
    assert states == {"resident", "cached", "unmapped", "evicted"}
    assert samples[("vtalloc_client_pages", (*node, ("state", "resident")))] == 3
    assert 'state="allocated"' not in text and "principal_resident" not in text
    assert any(name == "vtalloc_principal_leased_bytes" for name, _ in samples)


def test_the_proto_field_was_renamed_not_renumbered():
    from vtalloc.server.proto.vtalloc.v1 import pages_pb2

    field = pages_pb2.ClientReport.DESCRIPTOR.fields_by_name["pages_resident"]
    assert field.number == 6 and "pages_allocated" not in pages_pb2.ClientReport.DESCRIPTOR.fields_by_name
    old_wire = b"\x30\x07"  # field 6, varint 7: what a client built before the rename sends
    assert pages_pb2.ClientReport.FromString(old_wire).pages_resident == 7
