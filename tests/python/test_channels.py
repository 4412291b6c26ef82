# SPDX-License-Identifier: MIT
# Channels between Python processes, and between Python and C++ processes: zero-copy NumPy views,
# DLPack into NumPy and PyTorch, errors as exception classes, lifetimes of views.
import ctypes
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

import lavaflow
from conftest import checksum, pattern, run_python

SLOT = 64 * 1024
COUNT = 200

CONSUMER = """
import sys, numpy as np, lavaflow
name, directory, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = lavaflow.Consumer(name, directory=directory)
pointers = set()
n = 0
for msg in c:
    with msg:
        a = np.frombuffer(msg, np.float64)
        # Zero-copy: the array's data is the mapped ring buffer itself.
        assert a.ctypes.data == msg.data_ptr, (a.ctypes.data, msg.data_ptr)
        assert a.size * 8 == msg.size == %d
        assert a[0] == msg.sequence and float(a.sum()) == msg.tag, (a[0], msg.sequence, a.sum(), msg.tag)
        pointers.add(msg.data_ptr)
        n += 1
print("received", n, "slots", len(pointers), flush=True)
sys.exit(0 if n == count else 1)
""" % SLOT


def test_two_python_processes_stream_numpy_arrays_zero_copy(rendezvous, channel_name):
    with lavaflow.Producer(channel_name, slot_size=SLOT, directory=rendezvous, transport="shm") as p:
        assert p.route[0] == "shm"
        consumer = run_python(CONSUMER, channel_name, rendezvous, COUNT, stdout=subprocess.PIPE, text=True)
        p.wait_for_consumers(1, timeout=20)
        pointers = set()
        for seq in range(COUNT):
            with p.loan(timeout=10) as buf:
                a = np.frombuffer(buf, np.float64)
                assert a.ctypes.data == buf.data_ptr
                a[:] = np.arange(a.size) % 7
                a[0] = seq
                buf.tag = int(a.sum())
                pointers.add(buf.data_ptr)
        assert len(pointers) == p.slots  # the ring's buffers, reused: no copies, no new memory
        p.flush(timeout=20)
    out, _ = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, out
    assert f"received {COUNT}" in out


PRODUCER_THEN_HANG = """
import sys, time, numpy as np, lavaflow
name, directory = sys.argv[1], sys.argv[2]
p = lavaflow.Producer(name, slot_size=4096, directory=directory, transport="shm")
p.wait_for_consumers(1, timeout=20)
for i in range(3):
    with p.loan() as buf:
        np.frombuffer(buf, np.uint8)[:] = i
print("published", flush=True)
time.sleep(120)
"""


def test_a_killed_producer_raises_peer_lost(rendezvous, channel_name):
    producer = run_python(PRODUCER_THEN_HANG, channel_name, rendezvous, stdout=subprocess.PIPE, text=True)
    try:
        c = lavaflow.Consumer(channel_name, directory=rendezvous, connect_timeout=20)
        assert producer.stdout.readline().strip() == "published"
        for i in range(3):
            with c.receive(timeout=10) as msg:
                assert bytes(msg) == bytes([i]) * 4096
        with pytest.raises(lavaflow.Timeout):
            c.receive(timeout=0.05)
        producer.send_signal(signal.SIGKILL)
        producer.wait(timeout=10)
        with pytest.raises(lavaflow.PeerLost) as e:
            c.receive(timeout=10)
        assert isinstance(e.value, lavaflow.Error)
        assert list(c) == []  # iteration ends at once: the producer is gone
    finally:
        producer.kill()
        producer.wait()
    # The dead producer's files: the next producer of the name reclaims them.
    lavaflow.Producer(channel_name, directory=rendezvous).close()


def capsule_name(capsule):
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    return get_name(capsule).decode()


def test_dlpack_into_torch_and_numpy_zero_copy_both_capsule_kinds(rendezvous, channel_name):
    with lavaflow.Producer(channel_name, slot_size=4096, slots=1, directory=rendezvous, transport="shm") as p:
        c = lavaflow.Consumer(channel_name, directory=rendezvous)
        p.wait_for_consumers(1, timeout=10)
        with p.loan() as buf:
            np.frombuffer(buf, np.float32)[:] = np.arange(1024, dtype=np.float32)
            first = buf.data_ptr
        msg = c.receive(timeout=10)
        assert msg.__dlpack_device__() == (1, 0)  # kDLCPU

        t = torch.from_dlpack(msg)
        assert t.data_ptr() == msg.data_ptr and t.dtype == torch.uint8 and t.numel() == 4096
        assert torch.equal(t.view(torch.float32), torch.arange(1024, dtype=torch.float32))
        n = np.from_dlpack(msg)
        assert n.ctypes.data == msg.data_ptr and n.view(np.float32)[1023] == 1023
        assert msg.views >= 2  # each consumer holds the message

        legacy = msg.__dlpack__()
        assert capsule_name(legacy) == "dltensor"
        versioned = msg.__dlpack__(max_version=(1, 0))
        assert capsule_name(versioned) == "dltensor_versioned"
        old = msg.__dlpack__(max_version=(0, 8))
        assert capsule_name(old) == "dltensor"
        # Unconsumed capsules give their hold back when dropped.
        before = msg.views
        del legacy, versioned, old
        assert msg.views == before - 3
        del t, n
        assert msg.views == 0

        # A consumer's in-place write is seen by the producer: one memory, no copy.
        torch.from_dlpack(msg).view(torch.float32)[0] = 42.0
        with pytest.raises(BufferError):
            msg.__dlpack__(copy=True)
        with pytest.raises(BufferError):
            msg.__dlpack__(dl_device=(2, 0))
        msg.release()
        p.flush(timeout=10)
        with p.loan() as again:  # a one-buffer ring: the same memory comes back, holding the write
            assert again.data_ptr == first
            assert np.frombuffer(again, np.float32)[0] == 42.0
            again.give_back()
        c.close()


def test_released_messages_and_closed_channels_are_clear_errors(rendezvous, channel_name):
    p = lavaflow.Producer(channel_name, slot_size=4096, slots=2, directory=rendezvous, transport="shm")
    c = lavaflow.Consumer(channel_name, directory=rendezvous)
    p.wait_for_consumers(1, timeout=10)
    with p.loan() as buf:
        buf.size = 100
        buf.tag = 9
        view = np.frombuffer(buf, np.uint8)
        view[:] = 7
    assert buf.published
    with pytest.raises(lavaflow.Closed):
        buf.sequence
    with c.receive(timeout=10) as msg:
        assert (msg.size, msg.tag, msg.sequence) == (100, 9, 0)
        kept = np.frombuffer(msg, np.uint8)
    assert msg.released and kept.sum() == 700  # the view stays mapped after the release
    with pytest.raises(lavaflow.Closed):
        np.frombuffer(msg, np.uint8)
    with pytest.raises(lavaflow.Closed):
        msg.__dlpack__()
    # A loan dropped in an exception is given back, not published.
    with pytest.raises(KeyError):
        with p.loan() as buf:
            raise KeyError("no")
    with pytest.raises(lavaflow.Timeout):
        c.receive(timeout=0.05)
    p.close()
    with pytest.raises(lavaflow.Closed):
        p.loan()
    with pytest.raises(lavaflow.PeerLost):
        c.receive(timeout=10)
    c.close()
    with pytest.raises(lavaflow.Closed):
        c.receive()
    del view, kept


def test_bad_arguments_raise_named_errors(rendezvous):
    with pytest.raises(lavaflow.InvalidArgument) as e:
        lavaflow.Producer("no spaces", directory=rendezvous)
    assert isinstance(e.value, ValueError) and "name" in str(e.value)
    with pytest.raises(ValueError):
        lavaflow.Producer("x", policy="sometimes", directory=rendezvous)
    with pytest.raises(ValueError):
        lavaflow.Producer("x", device="tpu", directory=rendezvous)
    with pytest.raises(lavaflow.InvalidArgument):
        lavaflow.Producer("x", transport="carrier-pigeon", directory=rendezvous)
    with pytest.raises(TypeError):
        lavaflow.Producer("x", slots=-1, directory=rendezvous)
    with pytest.raises(lavaflow.Error):
        lavaflow.Consumer("nobody-here", connect_timeout=0.05, directory=rendezvous)
    with lavaflow.Producer("x", slot_size=64, directory=rendezvous) as p:
        with pytest.raises(ValueError):
            p.loan(timeout=-1)
        with pytest.raises(ValueError):
            p.flush(timeout=float("nan"))
        with p.loan() as buf:
            with pytest.raises(ValueError):
                buf.size = 65
            buf.give_back()


def test_info_lists_devices_and_interop():
    i = lavaflow.info()
    assert i["version"] == lavaflow.__version__
    assert isinstance(i["vulkan_devices"], list) and isinstance(i["interop"], list)
    for d in i["vulkan_devices"]:
        assert {"name", "type", "driver", "device_uuid", "memory_fd_export"} <= d.keys()
    assert "cuda_devices" in i
    # The accelerator list: each Vulkan device is one accelerator that Vulkan reaches.
    uuids = {a["uuid"] for a in i["accelerators"] if "Vulkan" in a["apis"]}
    assert {d["device_uuid"] for d in i["vulkan_devices"]} == uuids
    for a in i["accelerators"]:
        assert {"name", "type", "memory_bytes", "pci_address", "numa_node", "shares_memory_with"} <= a.keys()


# ---- Python and C++ on the two ends of one channel (lavaflow-demo's verified stream)

DEMO = os.environ.get("LAVAFLOW_DEMO")
needs_demo = pytest.mark.skipif(not DEMO, reason="LAVAFLOW_DEMO (the lavaflow-demo program) not set")


@needs_demo
def test_python_consumer_of_a_cpp_producer(rendezvous, channel_name):
    size, count = 4096 + 5, 40
    producer = subprocess.Popen([DEMO, "produce", "--channel", channel_name, "--dir", rendezvous, "--count", str(count),
                                 "--size", str(size), "--transport", "shm", "--verify", "cpu"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        c = lavaflow.Consumer(channel_name, directory=rendezvous, connect_timeout=20)
        got = 0
        for msg in c:
            with msg:
                if msg.tag == (1 << 64) - 1:  # the end-of-stream message
                    continue
                b = np.frombuffer(msg, np.uint8)
                assert b.ctypes.data == msg.data_ptr
                assert b.tobytes() == pattern(msg.sequence, size), msg.sequence
                assert checksum(b) == msg.tag
                got += 1
        assert got == count
    finally:
        out, _ = producer.communicate(timeout=60)
    assert producer.returncode == 0, out


@needs_demo
def test_cpp_consumer_of_a_python_producer(rendezvous, channel_name):
    size, count = 4096 + 3, 40
    with lavaflow.Producer(channel_name, slot_size=size, directory=rendezvous, transport="shm") as p:
        consumer = subprocess.Popen([DEMO, "consume", "--channel", channel_name, "--dir", rendezvous, "--count",
                                     str(count), "--verify", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
        p.wait_for_consumers(1, timeout=20)
        for seq in range(count):
            with p.loan(timeout=10) as buf:
                b = pattern(seq, size)
                np.frombuffer(buf, np.uint8)[:] = np.frombuffer(b, np.uint8)
                buf.tag = checksum(b)
        p.flush(timeout=20)
    out, _ = consumer.communicate(timeout=60)
    assert consumer.returncode == 0, out
    assert "OK" in out
