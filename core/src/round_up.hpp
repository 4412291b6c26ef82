// SPDX-License-Identifier: MIT
#pragma once
// Private: rounding sizes up to an alignment (page, huge page, pool granule, GPU offset).
#include <cstdint>

namespace lavaflow::detail {

/// `v` rounded up to a multiple of `a`; `v` itself when `a` is 0.
[[nodiscard]] constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return a ? (v + a - 1) / a * a : v; }

}  // namespace lavaflow::detail
