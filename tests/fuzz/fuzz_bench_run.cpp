// SPDX-License-Identifier: MIT
// libFuzzer target for the run files `lavaflow-bench compare` and `report` read (regress.cpp):
// parse_run may refuse input, with a reason; it must never crash, and what it accepts must hold
// together: every spread brackets its value, a run compared with itself has no regression, and
// it can be written back, read again and put in a report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "regress.hpp"

using namespace lfbench::regress;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto run = parse_run(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!run) {
    if (run.error().empty()) std::abort();
    return 0;
  }
  for (const auto& r : run->rows) {
    if (!(r.abs.lo <= r.abs.value && r.abs.value <= r.abs.hi)) std::abort();
    if (r.ratio && !(r.ratio->lo <= r.ratio->value && r.ratio->value <= r.ratio->hi)) std::abort();
  }
  const auto c = compare(*run, *run, {});
  if (c.regressions != 0 || c.rows.size() != run->rows.size()) std::abort();
  (void)format_comparison(c, {});
  const auto again = parse_run(to_json(*run).dump());
  if (!again || again->rows.size() != run->rows.size()) std::abort();
  (void)markdown_report({{"fuzz", "/nonexistent/run.json", *run}}, "/nonexistent", "fuzz");
  return 0;
}
