// SPDX-License-Identifier: MIT
#pragma once
namespace lfbench {
/// `lavaflow-bench interop [--json] [--size BYTES] [--frame BYTES] [--rounds N]` (needs a CUDA GPU).
int bench_interop(int argc, char** argv);
/// The second process of the hand-off measurements.
int bench_interop_peer(int argc, char** argv);
}  // namespace lfbench
