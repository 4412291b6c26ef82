# SPDX-License-Identifier: MIT
# On an NVIDIA GPU: a Vulkan ring buffer written by PyTorch in one process arrives in another as a
# CUDA torch.Tensor and a CuPy array over the same device pointer (DLPack, no copy); kernels there
# modify it in place and the producer's own tensor over the buffer sees the change.
import subprocess

import pytest

import lavaflow
from conftest import run_python

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy", reason="CuPy not installed")
if not lavaflow.cuda_built:
    pytest.skip("lavaflow built without CUDA", allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

N = 1 << 20  # float32 elements

CONSUMER = """
import sys, torch, cupy, lavaflow
name, directory, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = lavaflow.Consumer(name, directory=directory, connect_timeout=30)
with c.receive(timeout=30) as msg:
    kind, device = msg.__dlpack_device__()
    assert kind == 2 and device == torch.cuda.current_device(), (kind, device)
    t = torch.from_dlpack(msg).view(torch.float32)
    a = cupy.from_dlpack(msg).view(cupy.float32)
    assert t.data_ptr() == a.data.ptr == msg.data_ptr, (t.data_ptr(), a.data.ptr, msg.data_ptr)
    assert t.is_cuda and t.numel() == n
    assert torch.equal(t, torch.arange(n, device="cuda", dtype=torch.float32))
    t.mul_(2)                    # a PyTorch kernel, in place
    torch.cuda.synchronize()
    a += 1                       # a CuPy kernel, in place
    cupy.cuda.runtime.deviceSynchronize()
    print("consumer pointer", hex(msg.data_ptr), "views", msg.views, flush=True)
"""


def test_vulkan_buffer_into_torch_and_cupy_in_another_process_zero_copy(rendezvous, channel_name):
    with lavaflow.Producer(channel_name, slot_size=N * 4, slots=2, transport="vulkan", directory=rendezvous) as p:
        consumer = run_python(CONSUMER, channel_name, rendezvous, N, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        p.wait_for_consumers(1, timeout=30)
        with p.loan(timeout=10) as buf:
            if buf.__dlpack_device__()[0] != 2:
                consumer.kill()
                pytest.skip(f"the ring is not CUDA-reachable here (route {p.route})")
            t = torch.from_dlpack(buf).view(torch.float32)
            assert t.data_ptr() == buf.data_ptr
            t.copy_(torch.arange(N, device="cuda", dtype=torch.float32))
        p.flush(timeout=30)
        out, _ = consumer.communicate(timeout=60)
        assert consumer.returncode == 0, out
        torch.cuda.synchronize()
        expected = torch.arange(N, device="cuda", dtype=torch.float32) * 2 + 1
        assert torch.equal(t, expected), "the producer's tensor does not show the consumer's in-place writes"
        print(out.strip(), "| producer pointer", hex(t.data_ptr()), "route", p.route[0])
