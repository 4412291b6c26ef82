# SPDX-License-Identifier: MIT
# The lavaflow package under test comes from the build tree (PYTHONPATH, set by CTest); each test
# gets its own rendezvous directory, so nothing is left behind in the user's runtime directory.
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

M64 = (1 << 64) - 1


@pytest.fixture
def rendezvous():
    # Short (a Unix socket path is at most 107 bytes), and removed afterwards: nothing is left in /tmp.
    d = tempfile.mkdtemp(prefix="lf-py-")
    try:
        yield d
        assert not os.listdir(d), f"left behind: {os.listdir(d)}"
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def channel_name(request):
    return f"py{os.getpid()}-{abs(hash(request.node.name)) % 10**6}"


def pattern(seq, size):
    """The demo's message pattern (apps/common/pattern.h) as bytes, computed with NumPy."""
    words = size // 8
    i = np.arange(words, dtype=np.uint64)
    with np.errstate(over="ignore"):
        w = np.uint64((seq + 1) * 0x9E3779B97F4A7C15 & M64) + i * np.uint64(0xD1B54A32D192ED03)
    tail = bytes(((((seq + 1) * 0x9E3779B97F4A7C15 + j * 0xD1B54A32D192ED03) & M64) >> 56) for j in range(words * 8, size))
    return w.tobytes() + tail


def checksum(b):
    """The demo's checksum (apps/common/payload.hpp), carried in the message's tag."""
    b = bytes(b)
    h = 0xCBF29CE484222325 ^ len(b)
    words = len(b) // 8
    for w in np.frombuffer(b, np.uint64, count=words).tolist():
        h = ((h ^ w) * 0x100000001B3) & M64
        h ^= h >> 32
    for c in b[words * 8:]:
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def run_python(code, *args, **kwargs):
    """Starts another /usr/bin/python3 (the interpreter under test) running `code`."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], **kwargs)


def pytest_sessionfinish(session, exitstatus):
    # A file whose every test was skipped (no GPU, no CuPy) is a CTest skip with its reasons, never a pass.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    # Everything skipped at collection (a module-level skip) ends as "no tests collected" (5).
    if reporter is None or exitstatus not in (0, 5):
        return
    skipped = reporter.stats.get("skipped", [])
    if skipped and not reporter.stats.get("passed") and not reporter.stats.get("failed"):
        reasons = sorted({str(r.longrepr[2]) for r in skipped if isinstance(r.longrepr, tuple)})
        print("\nLAVAFLOW-SKIP " + "; ".join(reasons))
        session.exitstatus = 77
