// SPDX-License-Identifier: MIT
#pragma once
// The checks of one rank of a multi-process job (lavaflow-launch, mpiexec): each failure counted,
// the first ten printed as "JOB rank R: FAILED: what" for the job's script to show.
#include <cstdint>
#include <cstdio>
#include <string>

namespace lftest {

struct RankChecks {
  const char* job = "";
  std::uint32_t rank = 0;
  int failures = 0;

  void expect(bool ok, const std::string& what) {
    if (!ok && failures++ < 10) std::printf("%s rank %u: FAILED: %s\n", job, rank, what.c_str());
  }
};

}  // namespace lftest
