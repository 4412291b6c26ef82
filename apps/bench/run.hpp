// SPDX-License-Identifier: MIT
#pragma once
// lavaflow-bench run | compare | report: every suite in one run file, two run files compared, run
// files as a Markdown page. The comparison itself is in regress.hpp.
#include <cstdint>
#include <string>
#include <vector>

namespace lfbench {

struct RunOptions {
  std::vector<std::string> suites;  ///< empty: every suite
  bool quick = false;
  std::uint64_t repeats = 3;
  std::string out;  ///< directory for run.json and the plots
};
/// Runs each suite (as a child process of this program, with --json) `repeats` times; 0 when every
/// suite ran or was skipped for a reason, 1 when one failed, 2 when the output cannot be written.
int bench_run(const RunOptions& options);

/// The suites `run` knows, in the order it runs them.
[[nodiscard]] std::vector<std::string> run_suites();

struct CompareCommand {
  std::string base, now;
  double threshold_percent = 10;
  bool ratios_only = false;
};
/// 0: no regression; 1: a row regressed; 2: bad input (said on stderr).
int bench_compare(const CompareCommand& command);

/// Writes the Markdown page of `runs` to `out` ("-": standard output); 2 on bad input.
int bench_report(const std::vector<std::string>& runs, const std::string& out);

}  // namespace lfbench
