// SPDX-License-Identifier: MIT
#include "pool_report.hpp"

#include <cmath>

namespace lfinfo {

std::expected<PoolSummary, std::string> parse_pool_report(std::string_view json) {
  auto j = nlohmann::ordered_json::parse(json.begin(), json.end(), nullptr, false);
  if (j.is_discarded()) return std::unexpected("not JSON");
  if (!j.is_object()) return std::unexpected("not a JSON object");
  // A report is flat: keys with numbers. Nothing nested is kept (nor printed back, recursively).
  for (const auto& [key, value] : j.items())
    if (!value.is_number()) return std::unexpected("\"" + key + "\" is not a number");
  PoolSummary s;
  std::string bad;
  auto count = [&](const char* key, std::int64_t& out) {
    if (!bad.empty()) return;
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) {
      bad = std::string("\"") + key + "\" is missing or not an integer";
      return;
    }
    out = it->get<std::int64_t>();
    if (out < 0) bad = std::string("\"") + key + "\" is negative";
  };
  count("allocated_bytes.all.current", s.allocated_bytes);
  count("allocation.all.current", s.allocations);
  count("reserved_bytes.all.current", s.reserved_bytes);
  count("reserved_bytes.all.peak", s.reserved_peak);
  count("segment.all.current", s.segments);
  count("open_fds", s.open_fds);
  count("num_ooms", s.num_ooms);
  if (!bad.empty()) return std::unexpected(bad);
  const auto rate = j.find("reuse_rate");
  if (rate == j.end() || !rate->is_number()) return std::unexpected("\"reuse_rate\" is missing or not a number");
  s.reuse_rate = rate->get<double>();
  if (!(s.reuse_rate >= 0 && s.reuse_rate <= 1)) return std::unexpected("\"reuse_rate\" is outside 0..1");
  s.all = std::move(j);
  return s;
}

}  // namespace lfinfo
