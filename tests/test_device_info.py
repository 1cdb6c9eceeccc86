"""The driver's own view of a device (cuda-python), and vtalloc's accounting checked against it."""

from __future__ import annotations

import pytest

from vtalloc.allocator import AddressSpace, BackendUnavailableError, backend_available
from vtalloc.allocator.device_info import device_info
from helpers.sizes import MiB


def test_without_a_driver_the_error_is_typed():
    if backend_available("cuda")[0]:
        pytest.skip("a CUDA device is present")
    with pytest.raises(BackendUnavailableError):
        device_info(0)


@pytest.mark.gpu
def test_driver_free_memory_follows_what_a_space_maps():
    before = device_info(0)
    assert before.vmm_supported and before.total_bytes > 0
    with AddressSpace(backend="cuda", capacity=512 * MiB) as space:
        a = space.malloc(256 * MiB)
        held = device_info(0).free_bytes
        # Other processes may share the GPU: allow slack, but 256 MiB must be visibly gone.
        assert before.free_bytes - held >= 240 * MiB
        space.free(a)
        space.trim()  # pages given back to the driver
        assert device_info(0).free_bytes >= held + 240 * MiB
