"""``VTALLOC_SLOW_TESTS``: the one switch for the long forms of tests, read the same way everywhere.

Owns: parsing the variable (``slow_tests()``) and the skip mark of tests that only run with it
(``needs_slow_tests``).
Invariants: unset or empty, ``0``, ``false``, ``no``, ``off`` mean off; ``1``, ``true``, ``yes``,
``on`` mean on (any case); any other value is an error at collection rather than a silent "off".
Documented in README.md ("Set up") and docs/design.md.
"""

from __future__ import annotations

import os

import pytest

__all__ = ["SLOW_TESTS_ENV", "slow_tests", "needs_slow_tests"]

SLOW_TESTS_ENV = "VTALLOC_SLOW_TESTS"
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def slow_tests(environ: dict[str, str] | None = None) -> bool:
    """Whether the long forms of tests run (``VTALLOC_SLOW_TESTS``)."""
    value = (os.environ if environ is None else environ).get(SLOW_TESTS_ENV, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{SLOW_TESTS_ENV}={value!r}: use 1 (run the long forms of tests) or 0")


def needs_slow_tests(why: str) -> pytest.MarkDecorator:
    """Skip a test unless ``VTALLOC_SLOW_TESTS`` is on; ``why`` says what it costs."""
    return pytest.mark.skipif(not slow_tests(), reason=f"{why}; set {SLOW_TESTS_ENV}=1 to run it")
