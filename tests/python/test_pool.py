# SPDX-License-Identifier: MIT
# The memory pool from Python: rented buffers are NumPy/PyTorch memory without a copy, go back to
# the pool only when no view remains, and the statistics and info() report them.
import numpy as np
import pytest
import torch

import lavaflow


def test_rent_view_release_and_reuse():
    pool = lavaflow.Pool()
    b = pool.rent(4096)
    assert (b.size, b.kind) == (4096, "cpu-shared") and b.capacity >= 4096
    a = np.frombuffer(b, np.uint32)
    assert a.ctypes.data == b.data_ptr
    a[:] = 7
    t = torch.from_dlpack(b)
    assert t.data_ptr() == b.data_ptr and int(t.view(torch.int32)[5]) == 7
    first = b.data_ptr
    b.release()  # views remain: the block stays rented until they go
    assert b.released
    with pytest.raises(lavaflow.Closed):
        np.frombuffer(b, np.uint8)
    assert pool.stats()["allocation.all.current"] == 1
    del a, t
    assert pool.stats()["allocation.all.current"] == 0
    with pool.rent(4096) as again:  # the same block comes back
        assert again.data_ptr == first
    s = lavaflow.info(pool)["pool"]
    assert s["allocation.all.allocated"] == 2 and s["num_device_alloc"] >= 1


def test_bad_kinds_and_sizes():
    pool = lavaflow.Pool()
    with pytest.raises(ValueError):
        pool.rent(16, "tpu")
    with pytest.raises(lavaflow.Unsupported):
        pool.rent(16, "gpu-device-local")  # no Vulkan in this pool
    with pytest.raises(lavaflow.InvalidArgument):
        pool.rent(0)
    pool.close()
    with pytest.raises(lavaflow.Closed):
        pool.rent(16)
