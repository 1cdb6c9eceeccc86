"""benchmarks/bench_saved_offload.py on small synthetic traces with saved marks, where what moves
is computable by hand.

Owns: checks that the replay asks paged_activations' evict-behind rule's bytes (oldest first,
never the tensor just saved, only above the budget, a freed one never), counts as moved what
offload() moved (a 3 MiB block whose shared page it shares with a saved neighbour moves whole;
with a block not saved there, that page stays, 1 MiB kept "on a shared page"; a block in an
extent that a block not saved shares stays whole, kept "on a shared handle"), counts a refused
block as asked and not moved and tries it again at a later mark, tells the bytes pinned only by
allocations of <= 8 bytes apart, drops them in the what-if, and the command line (JSON
written, table printed, bad input refused).
Invariants: CPU only, a few seconds; every space is closed (conftest checks nothing is left
held). Placement: a fresh space places the first block at the start of a page and each next one
right after the one before (docs/design.md, "Blocks share pages"); the expectations rely on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.benchmarks import load_script
from helpers.sizes import MiB

bs = load_script("bench_saved_offload")
tf = bs.trace_format
KiB = 1 << 10


def make_trace(events: list[tuple], saved: list[tuple[int, int]], name: str = "synthetic") -> Any:
    ev = tf.validate_events(events)
    return tf.Trace(name=name, source="cpu-profiler", model={}, workload={}, recorded={}, events=ev,
                    saved=tf.validate_saved(saved, ev))


def test_a_block_whose_shared_page_holds_a_saved_neighbour_moves_whole():
    # a [0, 3 MiB) and b [3, 6 MiB) share page 1; both saved. Budget 0: b's mark offloads a.
    t = make_trace([("a", 0, 3 * MiB, 0), ("a", 1, 3 * MiB, 0), ("f", 0), ("f", 1)], [(1, 0), (1, 1)])
    r = bs.replay(t, 0.0)
    assert (r["saved_tensors"], r["saved_bytes"], r["budget_bytes"]) == (2, 6 * MiB, 0)
    assert (r["asked_tensors"], r["asked_bytes"], r["moved_bytes"]) == (1, 3 * MiB, 3 * MiB)
    assert r["moved_share"] == 1.0 and r["meets_requirement"] is True and r["kept_bytes"] == 0
    assert r["refusals"] == 0 and r["pressure_evictions"] == 0 and r["ooms"] == 0


def test_a_page_shared_with_a_block_not_saved_stays():
    # a [0, 3 MiB), p [3, 6 MiB) not saved, then a saved; c [6, 9 MiB) saved: c's mark offloads a,
    # whose page 1 p pins: 2 MiB move, 1 MiB stays on the shared page.
    t = make_trace([("a", 0, 3 * MiB, 0), ("a", 1, 3 * MiB, 0), ("a", 2, 3 * MiB, 0)], [(1, 0), (2, 2)])
    r = bs.replay(t, 0.0)
    assert (r["asked_bytes"], r["moved_bytes"], r["kept_bytes"]) == (3 * MiB, 2 * MiB, MiB)
    assert r["kept_on_shared_page_bytes"] == MiB and r["kept_on_shared_handle_bytes"] == 0
    assert r["kept_unexplained_bytes"] == 0 and r["partly_kept_tensors"] == 1 and r["never_moved_tensors"] == 0
    assert r["moved_share"] == pytest.approx(2 / 3) and r["meets_requirement"] is False


def test_a_partly_moved_block_moves_the_rest_once_its_neighbour_is_gone():
    # As above, then p is freed and d's mark (the budget still exceeded) offloads a again: all of it.
    events = [("a", 0, 3 * MiB, 0), ("a", 1, 3 * MiB, 0), ("a", 2, 3 * MiB, 0), ("f", 1), ("a", 3, 3 * MiB, 0)]
    r = bs.replay(make_trace(events, [(1, 0), (2, 2), (4, 3)]), 0.0)
    assert (r["asked_bytes"], r["moved_bytes"], r["kept_bytes"]) == (6 * MiB, 6 * MiB, 0)
    assert r["partly_kept_tensors"] == 0 and r["meets_requirement"] is True


def test_a_block_made_after_a_saved_one_keeps_off_its_page():
    # a saved first, then p (not saved): p does not take the rest of a's last page (the placement
    # keeps new blocks off handles that evictable allocations hold), so a moves whole.
    t = make_trace([("a", 0, 3 * MiB, 0), ("a", 1, 3 * MiB, 0), ("a", 2, 3 * MiB, 0)], [(0, 0), (2, 2)])
    r = bs.replay(t, 0.0)
    assert (r["asked_bytes"], r["moved_bytes"], r["kept_bytes"]) == (3 * MiB, 3 * MiB, 0)


def test_an_extent_shared_with_a_block_not_saved_stays_whole():
    # A 64 MiB block gets one 64 MiB extent (docs/eviction.md, "Extents"); freed, it is reused in
    # place by a 40 MiB block (at least half of it) and p, 20 MiB not saved, fills the rest: the
    # extent moves whole or not at all, so the saved 40 MiB block is refused, its pages shared with
    # no one but their handle shared with p.
    events = [("a", 0, 64 * MiB, 0), ("f", 0), ("a", 1, 40 * MiB, 0), ("a", 2, 20 * MiB, 0), ("a", 3, 3 * MiB, 0)]
    r = bs.replay(make_trace(events, [(3, 1), (4, 3)]), 0.0)  # saved once p is there
    assert (r["asked_bytes"], r["moved_bytes"], r["refusals"], r["never_moved_tensors"]) == (40 * MiB, 0, 1, 1)
    assert r["kept_on_shared_handle_bytes"] == 40 * MiB and r["kept_on_shared_page_bytes"] == 0
    assert r["kept_elsewhere_bytes"] == r["kept_unexplained_bytes"] == 0


def test_the_budget_decides_what_is_asked():
    events = [("a", 0, 3 * MiB, 0), ("a", 1, 3 * MiB, 0), ("a", 2, 3 * MiB, 0)]
    t = make_trace(events, [(0, 0), (1, 1), (2, 2)])
    # 9 MiB saved; share 0.7 (6.3 MiB): the third mark (9 MiB resident) offloads a only (6 MiB left)
    r = bs.replay(t, 0.7)
    assert (r["budget_bytes"], r["asked_tensors"], r["asked_bytes"], r["moved_bytes"]) == (int(0.7 * 9 * MiB), 1,
                                                                                         3 * MiB, 3 * MiB)
    # share 0.5 (4.5 MiB): a, then b too (6 MiB is still above it)
    r = bs.replay(t, 0.5)
    assert (r["asked_tensors"], r["asked_bytes"], r["moved_bytes"]) == (2, 6 * MiB, 6 * MiB)
    # share 1: never above the budget, nothing asked
    r = bs.replay(t, 1.0)
    assert (r["asked_bytes"], r["moved_bytes"], r["moved_share"], r["meets_requirement"]) == (0, 0, None, None)
    # share 0: everything but the last saved; the tensor just saved is never offloaded by its own mark
    r = bs.replay(t, 0.0)
    assert (r["asked_tensors"], r["asked_bytes"], r["moved_bytes"]) == (2, 6 * MiB, 6 * MiB)


def test_a_freed_saved_block_leaves_the_count_and_is_never_asked():
    t = make_trace([("a", 0, 3 * MiB, 0), ("f", 0), ("a", 1, 3 * MiB, 0)], [(0, 0), (2, 1)])
    r = bs.replay(t, 0.0)
    assert (r["saved_tensors"], r["asked_bytes"], r["offload_calls"]) == (2, 0, 0)


def test_a_refused_block_counts_as_asked_and_is_tried_again():
    # x [0, 4 KiB) shares its page with y (not saved), then x is saved: refused at z's mark (0
    # moved). y is freed; w's mark tries x again, and it moves whole (no one else is on its page).
    events = [("a", 0, 4 * KiB, 0), ("a", 1, 4 * KiB, 0), ("a", 2, 3 * MiB, 0), ("f", 1), ("a", 3, MiB, 0)]
    t = make_trace(events, [(1, 0), (2, 2), (4, 3)])
    r = bs.replay(t, 0.0)
    assert r["refusals"] == 1 and r["offload_calls"] >= 3
    assert r["asked_tensors"] == 2 and r["never_moved_tensors"] == 0
    assert r["asked_bytes"] == r["moved_bytes"] == 4 * KiB + 3 * MiB
    # without y's free x is never moved: asked, 0 moved, kept on the page y shares
    t = make_trace([e for e in events if e != ("f", 1)], [(1, 0), (2, 2), (3, 3)])
    r = bs.replay(t, 0.0)
    assert r["never_moved_tensors"] == 1 and r["asked_bytes"] - r["moved_bytes"] >= 4 * KiB
    assert r["kept_on_shared_page_bytes"] == r["kept_bytes"] and r["kept_unexplained_bytes"] == 0


def test_scalars_that_pin_and_the_what_if_without_them():
    # x (4 KiB, saved) shares its page with an 8-byte allocation not saved: refused, its bytes kept
    # on a page pinned by allocations of <= 8 B only. Without them (the what-if) x moves.
    events = [("a", 0, 4 * KiB, 0), ("a", 1, 8, 0), ("a", 2, 3 * MiB, 0), ("f", 1)]
    t = make_trace(events, [(1, 0), (2, 2)])
    r = bs.replay(t, 0.0)
    assert (r["asked_bytes"], r["moved_bytes"], r["kept_on_page_pinned_by_tiny_only_bytes"]) == (4 * KiB, 0, 4 * KiB)
    bare = bs.without_small(t, 8)
    assert bare.events == (("a", 0, 4 * KiB, 0), ("a", 1, 3 * MiB, 0)) and bare.saved == ((0, 0), (1, 1))
    assert bs.without_small(t, 0) is t
    r = bs.replay(bare, 0.0)
    assert r["asked_bytes"] == r["moved_bytes"] == 4 * KiB


def test_repeated_marks_add_no_bytes():
    t = make_trace([("a", 0, 3 * MiB, 0), ("a", 1, 3 * MiB, 0)], [(0, 0), (1, 0), (1, 1), (1, 1)])
    r = bs.replay(t, 0.0)
    assert (r["saved_marks"], r["repeat_marks"], r["saved_tensors"], r["saved_bytes"]) == (4, 2, 2, 6 * MiB)
    assert r["asked_bytes"] == r["moved_bytes"] == 3 * MiB


def test_a_trace_without_marks_is_refused():
    with pytest.raises(bs.BenchError, match="no saved marks"):
        bs.replay(make_trace([("a", 0, 3 * MiB, 0)], []), 0.25)


def test_the_command_line(tmp_path: Path, capsys):
    t = make_trace([("a", 0, 3 * MiB, 0), ("a", 1, 3 * MiB, 0), ("a", 2, 3 * MiB, 0)], [(1, 0), (2, 2)], name="pin")
    folder = tmp_path / "traces"
    tf.save(t, folder / "pin.json.gz")
    out = tmp_path / "out-{date}.json"
    assert bs.main(["--trace", str(folder), "--budget-share", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| pin | 0 | 2 | 6.0 | 3.0 | 2.0 | 66.67% | 1.0 (0.0) | 0.0 | 0 | **no** |" in text
    record = json.loads(next(tmp_path.glob("out-*.json")).read_text())
    assert record["benchmark"] == "saved_offload" and record["settings"]["budget_shares"] == [0.0]
    assert record["provenance"]["git"] is not None and len(record["rows"]) == 1
    assert len(record["provenance"]["library"]["sha256"]) == 64
    for argv in (["--budget-share", "2"], ["--trace", str(tmp_path / "missing.json.gz")]):
        with pytest.raises(SystemExit) as e:
            bs.main(argv)
        assert e.value.code == 2
    tf.save(make_trace([("a", 0, 3 * MiB, 0)], [], name="bare"), folder / "bare.json.gz")
    assert bs.main(["--trace", str(folder / "bare.json.gz"), "--out", str(out)]) == 1
    assert "no saved marks" in capsys.readouterr().err
