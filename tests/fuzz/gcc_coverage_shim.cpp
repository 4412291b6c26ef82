// SPDX-License-Identifier: MIT
// Lets libFuzzer (clang's runtime) drive code compiled by g++. g++ can only emit
// -fsanitize-coverage=trace-pc callbacks, which libFuzzer 14 no longer accepts; it does accept
// inline 8-bit counters. This shim hashes each call site's PC into a counter table registered with
// __sanitizer_cov_8bit_counters_init. Not compiled with coverage itself.
#include <cstddef>
#include <cstdint>

extern "C" void __sanitizer_cov_8bit_counters_init(std::uint8_t* start, std::uint8_t* stop);
extern "C" void __sanitizer_cov_pcs_init(const std::uintptr_t* start, const std::uintptr_t* stop);

namespace {
constexpr std::size_t kCounters = 1 << 16;
alignas(64) std::uint8_t counters[kCounters];
std::uintptr_t pcs[kCounters * 2];  // (pc, flags) pairs, as libFuzzer expects

[[gnu::constructor]] void register_counters() {
  for (std::size_t i = 0; i < kCounters; ++i) pcs[2 * i] = i + 1;
  __sanitizer_cov_8bit_counters_init(counters, counters + kCounters);
  __sanitizer_cov_pcs_init(pcs, pcs + 2 * kCounters);
}
}  // namespace

extern "C" [[gnu::no_sanitize_address, gnu::no_sanitize_undefined]] void __sanitizer_cov_trace_pc() {
  const auto pc = reinterpret_cast<std::uintptr_t>(__builtin_return_address(0));
  auto& c = counters[(pc ^ (pc >> 16)) & (kCounters - 1)];
  c = static_cast<std::uint8_t>(c + 1 + (c == 255));
}
