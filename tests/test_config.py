"""Sizes and configuration are parsed in one place, strictly."""

from __future__ import annotations

import pytest

from vtalloc.allocator import Config, InvalidArgumentError, format_size, parse_size


@pytest.mark.parametrize("text,expected", [
    ("64MiB", 64 << 20), ("64 MiB", 64 << 20), ("2GiB", 2 << 30), ("1.5GiB", 3 << 29), ("512", 512),
    ("4k", 4096), ("4KiB", 4096), ("1KB", 1000), ("3M", 3 << 20), ("1TiB", 1 << 40), ("10b", 10), (4096, 4096),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "MiB", "-1MiB", "1.3B", "0.1KiB", "12 parsecs", "0", 0, -4, 1.0, True, None, "1e9"])
def test_parse_size_rejects(bad):
    with pytest.raises(InvalidArgumentError):
        parse_size(bad)


def test_format_size():
    assert format_size(64 << 20) == "64 MiB"
    assert format_size(3 << 29) == "1.50 GiB"
    assert format_size(100) == "100 B"


def test_from_env_and_overrides():
    env = {"VTALLOC_CAPACITY": "8GiB", "VTALLOC_BACKEND": "host", "VTALLOC_DEVICE": "1", "VTALLOC_PAGE_SIZE": ""}
    c = Config.from_env(env)
    assert (c.capacity, c.backend, c.device, c.page_size) == (8 << 30, "host", 1, None)
    c2 = Config.from_env(env, capacity="1GiB")
    assert c2.capacity == 1 << 30
    with pytest.raises(InvalidArgumentError):
        Config.from_env({"VTALLOC_DEVICE": "gpu0"})
    with pytest.raises(InvalidArgumentError):
        Config.from_env({}, capacityy="1GiB")


def test_config_is_frozen():
    c = Config(backend="host")
    with pytest.raises(Exception):
        c.backend = "cuda"
