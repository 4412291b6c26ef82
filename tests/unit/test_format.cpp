// SPDX-License-Identifier: MIT
#include "lavaflow/core/format.hpp"

#include "support.hpp"

TEST_CASE("format substitutes in order and honours the small spec set") {
  using lavaflow::format;
  CHECK(format("a {} b {}", 1, "x") == "a 1 b x");
  CHECK(format("{:#x}", 255) == "0xff");
  CHECK(format("{:02x}", std::uint8_t{10}) == "0a");
  CHECK(format("{:.2f}", 3.14159) == "3.14");
  CHECK(format("[{:5}]", 42) == "[   42]");
  CHECK(format("[{:<5}]", 42) == "[42   ]");
  CHECK(format("{{}} {}", 1) == "{} 1");
  CHECK(format("no args") == "no args");
}
