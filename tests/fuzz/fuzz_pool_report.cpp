// SPDX-License-Identifier: MIT
// libFuzzer target for what `lavaflow-info --pool` reads from another process's socket: a pool's
// statistics as JSON (pool_report.cpp). parse_pool_report may refuse input, with a reason; it
// must never crash, and what it accepts holds together: counts and sizes not negative, the
// reuse rate within 0..1, and the whole report kept.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "pool_report.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto r = lfinfo::parse_pool_report(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!r) {
    if (r.error().empty()) std::abort();
    return 0;
  }
  if (r->allocated_bytes < 0 || r->allocations < 0 || r->reserved_bytes < 0 || r->reserved_peak < 0 ||
      r->segments < 0 || r->open_fds < 0 || r->num_ooms < 0)
    std::abort();
  if (!(r->reuse_rate >= 0 && r->reuse_rate <= 1) || !r->all.is_object()) std::abort();
  (void)r->all.dump();
  return 0;
}
