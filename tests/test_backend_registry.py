"""The backend registry: one list of backends, read by C and Python, and a new backend added
through it alone.

The core's registry (csrc/backend/backend_registry.hpp) names every backend with its code,
factory and capabilities; the C ABI lists it (vta_backends) and Python reads it
(vtalloc.allocator.backends) instead of listing names. A toy backend (the host backend under
another name, without host pages: csrc/backend/testing/toy_backend.cpp) is registered at run
time and used by name, through the address space, the torch shim and the CLI's checks, with no
other code knowing it. Code above the driver seam asks a backend's capabilities, never its kind.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vtalloc.allocator import InvalidArgumentError, _native, backends
from vtalloc.allocator.config import BACKENDS
from helpers.subproc import run_python

ROOT = Path(__file__).resolve().parents[1]

def _header_value(name: str) -> int:
    text = (ROOT / "csrc/include/vtalloc/vtalloc.h").read_text()
    m = re.search(rf"\b{name} = (\d+)", text)
    assert m, name
    return int(m.group(1))


def test_the_built_ins_keep_their_public_codes_and_say_what_they_can_do():
    host, cuda = backends.registered()[:2]
    assert (host.name, host.code) == ("host", _header_value("VTA_BACKEND_HOST"))
    assert (cuda.name, cuda.code) == ("cuda", _header_value("VTA_BACKEND_CUDA"))
    assert _header_value("VTA_BACKEND_AUTO") == backends.AUTO_CODE == 0
    assert host.capabilities() == ["host_pages", "export_pages", "test_kernels"]
    assert cuda.capabilities() == ["device_memory", "needs_context", "can_capture", "host_pages", "export_pages"]
    # The Python bits are the header's.
    for field in ("device_memory", "needs_context", "can_capture", "host_pages", "export_pages", "test_kernels"):
        assert backends._CAPABILITY_BITS[field] == _header_value(f"VTA_BACKEND_CAP_{field.upper()}")
    # "auto" tries device memory first: cuda, then host.
    assert [b.name for b in backends.auto_order()][:2] == ["cuda", "host"]


def test_python_reads_the_names_and_codes_from_the_registry():
    assert BACKENDS == ("auto", *backends.names()) == backends.choices()
    assert _native.BACKEND_CODES == {"auto": 0, **{b.name: b.code for b in backends.registered()}}
    assert _native.BACKEND_NAMES == {code: name for name, code in _native.BACKEND_CODES.items()}
    with pytest.raises(InvalidArgumentError, match="backend must be one of auto, host, cuda"):
        backends.code("tpu")
    with pytest.raises(InvalidArgumentError, match="no backend has the code 99"):
        backends.name_of(99)


def test_no_file_above_the_seam_lists_the_backends_or_tests_a_kind():
    listing = re.compile(r"""["'](auto|host|cuda)["']\s*,\s*["'](host|cuda)["']|["']auto["']\s*:\s*0\s*,\s*["'](host|cuda)""")
    for rel in ("allocator/config.py", "allocator/_native.py", "client/cli.py", "client/train_demo.py",
                "client/commands_common.py", "allocator/probe.py"):
        found = [line for line in (ROOT / rel).read_text().splitlines() if listing.search(line)]
        assert found == [], f"{rel} lists backend names: {found}"
    kind_test = re.compile(r"VTA_BACKEND_(HOST|CUDA)\b|backend_kind\(\)\s*[!=]=")
    for path in sorted((ROOT / "csrc/torch").glob("*.[ch]pp")) + sorted((ROOT / "csrc/space").glob("*.[ch]pp")):
        code = [line.split("//", 1)[0] for line in path.read_text().splitlines()]
        assert not [c for c in code if kind_test.search(c)], f"{path.name} tests a backend's kind"


# The toy runs in a fresh interpreter: a registry never forgets a kind, and the other tests of a
# worker process must see only the built-ins (the CLI's `info`, the choices in error messages).
TOY_PREAMBLE = """
import ctypes, json
from vtalloc.allocator import _native, backends

def register(name):
    code = ctypes.c_int32()
    _native.check(_native.load().vta_test_register_toy_backend(name.encode(), ctypes.byref(code)))
    return code.value

def refused(call, error):
    try:
        call()
    except error as e:
        return str(e)
    raise AssertionError(f"{call} was not refused")

code = register("toy")
toy = backends.by_name("toy")
out = {"code": code, "toy_code": toy.code, "capabilities": toy.capabilities(), "choices": list(backends.choices())}
"""


def test_the_registry_refuses_a_bad_or_taken_name():
    out = run_python(TOY_PREAMBLE + """
from vtalloc.allocator import InvalidArgumentError
out["refused"] = {name: refused(lambda: register(name), InvalidArgumentError) for name in ("", "auto", "host", "toy", "x" * 32)}
out["names"] = list(backends.names())
print(json.dumps(out))
""")
    assert out["names"] == ["host", "cuda", "toy"]  # nothing refused was registered
    assert "is registered already" in out["refused"]["host"] and "is registered already" in out["refused"]["toy"]
    assert "other than 'auto'" in out["refused"]["auto"] and "1 to 31 characters" in out["refused"][""]
    assert "1 to 31 characters" in out["refused"]["x" * 32]


def test_a_toy_backend_registered_at_run_time_is_usable_by_name():
    out = run_python(TOY_PREAMBLE + """
from vtalloc.allocator import AddressSpace, BackendUnavailableError, Config, backend_available, global_counters
from vtalloc.allocator.config import BACKENDS
MiB = 1 << 20
out["BACKENDS"] = list(BACKENDS)
out["config"] = Config(backend="toy").backend
out["available"] = list(backend_available("toy"))
with AddressSpace(backend="toy", capacity=32 * MiB) as space:
    out["space_backend"] = space.backend
    a = space.malloc(3 * MiB)
    space.write(a, b"through the registry")
    space.offload(a)  # "auto" eviction: copy mode, since the toy has no host pages
    out["evict_mode"] = space.stats().evict_mode
    out["read_back"] = space.read(a, 20).decode()
    space.free(a)
out["mapped_refused"] = refused(lambda: AddressSpace(backend="toy", capacity=32 * MiB, evict_mode="mapped"),
                                BackendUnavailableError)
with AddressSpace(backend="host", capacity=32 * MiB, evict_mode="mapped") as space:
    out["host_evict_mode"] = space.stats().evict_mode
out["counters"] = global_counters()
print(json.dumps(out))
""")
    assert out["code"] == out["toy_code"] == 3  # the next code after the built-ins
    assert out["capabilities"] == ["export_pages", "test_kernels"]  # no host pages, unlike host
    assert out["choices"] == out["BACKENDS"] == ["auto", "host", "cuda", "toy"]
    assert out["config"] == out["space_backend"] == "toy" and out["available"] == [True, ""]
    assert out["read_back"] == "through the registry" and out["evict_mode"] == "copy"
    # What it cannot do is refused by its capabilities, not by its name.
    assert "host-located VMM pages" in out["mapped_refused"] and out["host_evict_mode"] == "mapped"
    assert not any(out["counters"].values()), out["counters"]


def test_the_torch_shim_serves_a_toy_backend_by_its_capabilities():
    out = run_python(TOY_PREAMBLE + """
from vtalloc.allocator import Config
from vtalloc.allocator.torch import shim
MiB = 1 << 20
kept = shim.configure(Config(backend="toy", capacity=16 * MiB), shim.FAIL_RETURN_NULL)
out["kept"] = kept.backend
out["configured_code"] = shim.current_config()[2]["backend"]
p = shim.alloc_for_test(2 * MiB, device=1)
ctypes.memmove(p, b"toy" * 10, 30)
out["bytes"] = ctypes.string_at(p, 30).decode()
shim.free_for_test(p, 2 * MiB, device=1)
out["live"] = shim.device_stats(1).num_live_allocs
shim.release()
print(json.dumps(out))
""")
    assert out["kept"] == "toy" and out["configured_code"] == out["code"]
    assert out["bytes"] == "toy" * 10 and out["live"] == 0
