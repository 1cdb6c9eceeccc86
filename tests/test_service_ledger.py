"""The ledger's rules, without gRPC or processes: quotas, ownership, victims, tickets, visibility."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from vtalloc.allocator import InvalidArgumentError
from vtalloc.server.errors import (
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    UnauthenticatedError,
)
from vtalloc.server.ledger import ClientReport, Ledger, NodeGeometry
from vtalloc.server.quota import PrincipalMap, Quota, parse_named_quota, parse_principal_map, parse_quota
from helpers.sizes import PAGE
from helpers.ledger_checks import check_invariants, held_pages, node_counters


def geometry(pages: int = 16) -> NodeGeometry:
    return NodeGeometry("host", 0, PAGE, pages, 0, 1.0)


class Ids:
    """Fresh page ids, as the pool hands them out (never reused)."""

    def __init__(self) -> None:
        self.n = 0

    def take(self, k: int) -> list[int]:
        out = list(range(self.n + 1, self.n + 1 + k))
        self.n += k
        return out


def lease(ledger: Ledger, s, ids: Ids, k: int) -> list[int]:
    assert ledger.leases.admit(s, k) == 0
    pages = ids.take(k)
    ledger.leases.add_pages(s, pages)
    ledger.leases.mark_delivered(s, pages)
    return pages


def test_a_lease_past_the_maximum_fails_at_once_and_is_counted():
    ledger = Ledger(geometry(), quotas=[Quota("uid:1000", 0, 4 * PAGE)])
    s = ledger.sessions.open(10, 1000, 1000, "client")
    ids = Ids()
    lease(ledger, s, ids, 3)
    with pytest.raises(QuotaExceededError) as e:
        ledger.leases.admit(s, 2)
    assert isinstance(e.value, MemoryError) and e.value.capacity_bytes == 4 * PAGE
    assert ledger.leases.admit(s, 1) == 0
    assert node_counters(ledger)["quota_rejections_total"] == 1
    assert ledger.views.node_view(None).principals[0].quota_rejections == 1


def test_admit_reports_how_many_pages_the_node_is_short():
    ledger = Ledger(geometry(16))
    a = ledger.sessions.open(10, 1, 1, "client")
    b = ledger.sessions.open(11, 2, 2, "client")
    lease(ledger, a, Ids(), 14)
    assert ledger.leases.admit(b, 4) == 2
    assert ledger.leases.admit(b, 2) == 0


@pytest.mark.parametrize("pages", [0, 4097, -1])
def test_a_lease_of_a_bad_page_count_is_an_invalid_argument(pages):
    ledger = Ledger(geometry())
    s = ledger.sessions.open(10, 1, 1, "client")
    with pytest.raises(InvalidArgumentError):
        ledger.leases.admit(s, pages)


def test_an_observer_cannot_lease_or_report():
    ledger = Ledger(geometry())
    o = ledger.sessions.open(10, 1, 1, "observer")
    with pytest.raises(FailedPreconditionError):
        ledger.leases.admit(o, 1)
    with pytest.raises(FailedPreconditionError):
        ledger.reports.record(o, ClientReport())


def test_unknown_tokens_and_kinds_are_refused():
    ledger = Ledger(geometry())
    with pytest.raises(UnauthenticatedError):
        ledger.sessions.authenticate("0" * 32)
    with pytest.raises(UnauthenticatedError):
        ledger.sessions.authenticate(None)
    with pytest.raises(InvalidArgumentError):
        ledger.sessions.open(10, 1, 1, "superuser")
    s = ledger.sessions.open(10, 1, 1, "client")
    assert ledger.sessions.authenticate(s.token) is s
    ledger.sessions.end(s, clean=True)
    with pytest.raises(UnauthenticatedError):
        ledger.sessions.authenticate(s.token)


def test_returns_are_validated_all_or_nothing():
    ledger = Ledger(geometry())
    ids = Ids()
    a = ledger.sessions.open(10, 1, 1, "client")
    b = ledger.sessions.open(11, 1, 1, "client")
    pa = lease(ledger, a, ids, 3)
    pb = lease(ledger, b, ids, 2)
    with pytest.raises(NotFoundError):
        ledger.leases.give_back(a, [pa[0], 999])
    with pytest.raises(PermissionDeniedError):
        ledger.leases.give_back(a, [pa[0], pb[0]])
    with pytest.raises(InvalidArgumentError):
        ledger.leases.give_back(a, [pa[0], pa[0]])
    with pytest.raises(NotFoundError):
        ledger.leases.give_back(a, [pa[0]], evict_request_id=77)
    assert held_pages(ledger) == 5  # nothing moved
    assert ledger.leases.give_back(a, pa[:2]) == pa[:2]
    assert held_pages(ledger) == 3
    with pytest.raises(NotFoundError):
        ledger.leases.give_back(a, [pa[0]])  # already returned
    check_invariants(ledger)


def test_a_page_still_being_delivered_cannot_be_returned():
    ledger = Ledger(geometry())
    s = ledger.sessions.open(10, 1, 1, "client")
    ledger.leases.add_pages(s, [1])
    with pytest.raises(FailedPreconditionError):
        ledger.leases.give_back(s, [1])
    ledger.leases.drop_pages(s, [1])
    assert held_pages(ledger) == 0


def test_ending_a_session_gives_its_pages_back_and_counts_a_crash():
    ledger = Ledger(geometry())
    ids = Ids()
    a = ledger.sessions.open(10, 1, 1, "client")
    b = ledger.sessions.open(11, 1, 1, "client")
    pa = lease(ledger, a, ids, 3)
    lease(ledger, b, ids, 2)
    assert sorted(ledger.sessions.end(a, clean=False)) == pa
    assert ledger.sessions.end(a, clean=False) == []  # once only
    assert len(ledger.sessions.end(b, clean=True)) == 2
    c = node_counters(ledger)
    assert (c["reclaims_total"], c["reclaimed_pages_total"]) == (1, 3)
    assert c["pages_returned_total"] == 2
    assert held_pages(ledger) == 0
    check_invariants(ledger)


def test_quota_minimums_must_fit_the_node():
    ledger = Ledger(geometry(16))
    ledger.quotas.set("team-a", 10 * PAGE, 16 * PAGE)
    with pytest.raises(InvalidArgumentError):
        ledger.quotas.set("team-b", 7 * PAGE, 16 * PAGE)
    ledger.quotas.set("team-b", 6 * PAGE, 16 * PAGE)
    ledger.quotas.set("team-a", 2 * PAGE, 16 * PAGE)  # lowering one makes room for the other
    ledger.quotas.set("team-b", 14 * PAGE, 16 * PAGE)
    with pytest.raises(InvalidArgumentError):
        ledger.quotas.set("bad name!", 0, PAGE)
    with pytest.raises(InvalidArgumentError):
        ledger.quotas.set("team-c", 2 * PAGE, PAGE)  # min > max
    check_invariants(ledger)


def test_victims_are_principals_above_their_minimum_most_excess_first():
    names = PrincipalMap(((1, "a"), (2, "b"), (3, "c")))
    ledger = Ledger(geometry(32), quotas=[Quota("a", 10 * PAGE, 32 * PAGE)], principals=names)
    ids = Ids()
    a = ledger.sessions.open(10, 1, 1, "client")
    b1 = ledger.sessions.open(11, 2, 2, "client")
    b2 = ledger.sessions.open(12, 2, 2, "client")
    c = ledger.sessions.open(13, 3, 3, "client")
    lease(ledger, a, ids, 12)   # 2 above its minimum
    lease(ledger, b1, ids, 2)   # b: 5 above (minimum 0)
    lease(ledger, b2, ids, 3)
    picked = ledger.victims.pick(6, requester=c)
    assert [(s.principal, k) for s, k in picked] == [("b", 3), ("b", 2), ("a", 1)]
    # Asked pages are not asked again, and the requester is never asked.
    for s, k in picked:
        ledger.victims.open_eviction(s, k)
    assert ledger.victims.pick(6, requester=c) == [(a, 1)]
    assert b1 not in [s for s, _ in ledger.victims.pick(10, requester=b1)]


def test_eviction_tickets_credit_returns_and_judge_misses():
    ledger = Ledger(geometry())
    ids = Ids()
    s = ledger.sessions.open(10, 1, 1, "client")
    pages = lease(ledger, s, ids, 6)
    t = ledger.victims.open_eviction(s, 3)
    ledger.leases.give_back(s, pages[:2], evict_request_id=t.request_id)
    assert t.returned == 2
    assert ledger.victims.close_eviction(t, judge=True) is True
    t2 = ledger.victims.open_eviction(s, 1)
    ledger.leases.give_back(s, pages[2:3])  # any return while asked counts toward the request
    assert ledger.victims.close_eviction(t2, judge=True) is False
    t3 = ledger.victims.open_eviction(s, 2)
    assert ledger.victims.close_eviction(t3, judge=False) is False  # not needed any more: no miss
    view = ledger.views.node_view(None).sessions[0]
    assert (view.evict_requests, view.evict_pages_asked, view.evict_pages_returned, view.deadline_misses) == (3, 6, 3, 1)
    assert s.outstanding_evict == 0
    assert node_counters(ledger)["deadline_misses_total"] == 1


def test_within_guarantee():
    ledger = Ledger(geometry(), quotas=[Quota("uid:5", 4 * PAGE, 8 * PAGE)])
    s = ledger.sessions.open(10, 5, 5, "client")
    assert ledger.quotas.within_guarantee(s, 4)
    lease(ledger, s, Ids(), 3)
    assert ledger.quotas.within_guarantee(s, 1) and not ledger.quotas.within_guarantee(s, 2)


def test_other_uids_sessions_are_hidden_unless_admin():
    ledger = Ledger(geometry(), admin_uids=(0,))
    ids = Ids()
    mine = ledger.sessions.open(10, 1000, 1000, "client")
    theirs = ledger.sessions.open(11, 1001, 1001, "client")
    root = ledger.sessions.open(12, 0, 0, "observer")
    lease(ledger, mine, ids, 2)
    lease(ledger, theirs, ids, 3)
    v = ledger.views.node_view(mine)
    assert [s.info.session_id for s in v.sessions] == [mine.session_id]
    assert v.hidden_sessions == 1 and not v.admin_view
    assert [p.quota.principal for p in v.principals] == ["uid:1000"]
    with pytest.raises(PermissionDeniedError):
        ledger.views.node_view(mine, theirs.session_id)
    with pytest.raises(NotFoundError):
        ledger.views.node_view(mine, "nope")
    m = ledger.views.page_map(mine)
    assert {p.session_id for p in m.pages} == {mine.session_id} and m.hidden_pages == 3
    full = ledger.views.node_view(root)
    assert full.admin_view and len(full.sessions) == 2 and full.observers == 1
    with pytest.raises(PermissionDeniedError):
        ledger.sessions.require_admin(mine, "test")
    ledger.sessions.require_admin(root, "test")


def test_reports_give_rates_and_monotonic_node_counters():
    now = [100.0]
    ledger = Ledger(geometry(), clock=lambda: now[0])
    s = ledger.sessions.open(10, 1, 1, "client")
    ledger.reports.record(s, ClientReport(evictions_total=10, restores_total=4))
    now[0] += 2.0
    ledger.reports.record(s, ClientReport(evictions_total=30, restores_total=5))
    v = ledger.views.node_view(None).sessions[0]
    assert (v.evictions_per_s, v.restores_per_s) == (10.0, 0.5)
    assert node_counters(ledger)["evictions_total"] == 30
    ledger.sessions.end(s, clean=True)
    assert node_counters(ledger)["evictions_total"] == 30  # counters outlive sessions


def test_quota_and_principal_parsing():
    assert parse_quota("1GiB:8GiB") == Quota("", 1 << 30, 8 << 30)
    assert parse_quota("0:2MiB").min_bytes == 0
    assert parse_named_quota("uid:1000=0:4MiB") == Quota("uid:1000", 0, 4 << 20)
    for bad in ("8GiB", "1:2:3", "x:1GiB", "2GiB:1GiB"):
        with pytest.raises(InvalidArgumentError):
            parse_quota(bad)
    for bad in ("1GiB:2GiB", "a b=1:2", "=1:2"):
        with pytest.raises(InvalidArgumentError):
            parse_named_quota(bad)
    names = parse_principal_map(["team-a=1000,1001", "team-b=1002"])
    assert names.principal_for(1001) == "team-a" and names.principal_for(7) == "uid:7"
    for bad in (["team=1", "other=1"], ["uid:5=1"], ["team="], ["team=x"]):
        with pytest.raises(InvalidArgumentError):
            parse_principal_map(bad)


class LedgerMachine(RuleBasedStateMachine):
    """Random leases, returns, evictions and session ends never break the ledger's invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(geometry(24), quotas=[Quota("uid:1", 4 * PAGE, 12 * PAGE)])
        self.ids = Ids()
        self.sessions = [self.ledger.sessions.open(10 + i, i % 3, 0, "client") for i in range(4)]

    @rule(i=st.integers(0, 3), k=st.integers(1, 8))
    def lease(self, i, k):
        s = self.sessions[i]
        if not s.live:
            return
        try:
            short = self.ledger.leases.admit(s, k)
        except QuotaExceededError:
            return
        if short == 0:
            pages = self.ids.take(k)
            self.ledger.leases.add_pages(s, pages)
            self.ledger.leases.mark_delivered(s, pages)

    @rule(i=st.integers(0, 3), k=st.integers(0, 8), foreign=st.booleans())
    def give_back(self, i, k, foreign):
        s = self.sessions[i]
        if not s.live:
            return
        mine = list(s.pages)[:k]
        other = next((p for x in self.sessions if x is not s for p in x.pages), None)
        if foreign and other is not None:
            with pytest.raises(PermissionDeniedError):
                self.ledger.leases.give_back(s, mine + [other])
        self.ledger.leases.give_back(s, mine)

    @rule(i=st.integers(0, 3), k=st.integers(1, 4), judge=st.booleans())
    def evict(self, i, k, judge):
        s = self.sessions[i]
        if s.live:
            t = self.ledger.victims.open_eviction(s, k)
            self.ledger.leases.give_back(s, list(s.pages)[: k // 2], evict_request_id=t.request_id)
            self.ledger.victims.close_eviction(t, judge=judge)

    @rule(i=st.integers(0, 3), clean=st.booleans())
    def end(self, i, clean):
        s = self.sessions[i]
        if s.live:
            self.ledger.sessions.end(s, clean=clean)
            self.sessions[i] = self.ledger.sessions.open(20 + i, i % 3, 0, "client")

    @invariant()
    def consistent(self):
        check_invariants(self.ledger)
        assert all(s.outstanding_evict == 0 for s in self.sessions)
        view = self.ledger.views.node_view(None)
        assert view.device.leased_pages + view.device.free_pages == 24


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_reports_speak_page_by_page_only_for_the_sessions_own_pages():
    from vtalloc.server.ledger import PageUseReport

    ledger = Ledger(geometry())
    a = ledger.sessions.open(10, 1000, 1000, "client")
    b = ledger.sessions.open(11, 1000, 1000, "client")
    ids = Ids()
    mine, theirs = lease(ledger, a, ids, 2), lease(ledger, b, ids, 1)
    uses = (PageUseReport(mine[0], "resident"), PageUseReport(mine[1], "cached"),
            PageUseReport(theirs[0], "unmapped"), PageUseReport(999, "resident"), PageUseReport(mine[0], "bogus"))
    ledger.reports.record(a, ClientReport(pages_total=2, page_uses=uses))
    by_page = {p.page_id: (p.session_id, p.use) for p in ledger.views.page_map(None).pages}
    assert by_page[mine[0]] == (a.session_id, "resident") and by_page[mine[1]] == (a.session_id, "cached")
    assert by_page[theirs[0]] == (b.session_id, "unknown")  # a's report cannot speak for b's page
    assert 999 not in by_page
