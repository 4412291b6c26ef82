// SPDX-License-Identifier: MIT
#pragma once

namespace lfbench {

struct PythonBenchOptions {
  bool quick = false;
  bool json = false;
};

/// `lavaflow-bench python`: what the Python layer adds per message (receive → __dlpack__ →
/// from_dlpack → release) over the same loop in C++.
int bench_python(const PythonBenchOptions& options);

}  // namespace lfbench
