// SPDX-License-Identifier: MIT
#pragma once
// Checks for the MPI test programs (one process per rank, no Catch2): each failed check is
// counted and named on stderr as "FAILED: …", which CTest's FAIL_REGULAR_EXPRESSION catches.
#include <cstdio>
#include <string>

#include "lavaflow/core/error.hpp"

namespace lftest {

inline int failures = 0;

inline void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  }
}

/// `r` (a Result or Status) failed with `code`.
template <class R>
bool is(const R& r, lavaflow::Errc code) {
  return !r && r.error().code() == code;
}

}  // namespace lftest
