"""The test helpers the docs describe: VTALLOC_SLOW_TESTS is read one way (tests/helpers/slow.py)."""

from __future__ import annotations

import pytest

from helpers.slow import SLOW_TESTS_ENV, slow_tests


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("off", False), ("No", False),
                                       ("1", True), ("true", True), ("YES", True), (" on ", True)])
def test_slow_tests_switch(value, on):
    env = {} if value is None else {SLOW_TESTS_ENV: value}
    assert slow_tests(env) is on


def test_slow_tests_refuses_a_value_it_cannot_read():
    with pytest.raises(ValueError, match=SLOW_TESTS_ENV):
        slow_tests({SLOW_TESTS_ENV: "2"})


def test_every_test_reads_the_switch_through_the_helper():
    """No test reads the variable itself (two used to read it differently)."""
    from helpers.doc_blocks import ROOT

    readers = [p.name for p in (ROOT / "tests").glob("test_*.py")
               if SLOW_TESTS_ENV in p.read_text() and "helpers.slow" not in p.read_text()]
    assert readers == [], readers
