# SPDX-License-Identifier: MIT
"""lava-flow: zero-copy buffers between processes, into NumPy, PyTorch and CuPy.

A producer loans a ring buffer, writes it and publishes it; every consumer receives it without a
copy. Buffers export themselves through the buffer protocol, ``__array_interface__`` and DLPack::

    with lavaflow.Producer("frames", slot_size=1 << 20) as producer:
        producer.wait_for_consumers(1, timeout=10)
        with producer.loan() as buf:
            numpy.frombuffer(buf, numpy.float32)[:] = 1.0   # published when the block ends

    for msg in lavaflow.Consumer("frames"):                  # ends when the producer is gone
        with msg:
            tensor = torch.from_dlpack(msg)                  # zero-copy; released at block end
"""
from ._lavaflow import (  # noqa: F401
    Closed,
    Consumer,
    DeviceMismatch,
    DriverError,
    Error,
    InternalError,
    InvalidArgument,
    Loan,
    Malformed,
    Message,
    NotFound,
    OutOfMemory,
    PeerLost,
    PermissionDenied,
    Pool,
    PooledBuffer,
    Producer,
    SystemCallError,
    Timeout,
    Unreachable,
    Unsupported,
    VersionMismatch,
    WouldBlock,
    __version__,
    cuda_built,
    info,
)

__all__ = [name for name in dir() if not name.startswith("_")]
