// SPDX-License-Identifier: MIT
#include "lavaflow/core/detail/format.hpp"
#include "support.hpp"

TEST_CASE("format substitutes in order and honours the small spec set") {
  using lavaflow::str_format;
  CHECK(str_format("a {} b {}", 1, "x") == "a 1 b x");
  CHECK(str_format("{:#x}", 255) == "0xff");
  CHECK(str_format("{:02x}", std::uint8_t{10}) == "0a");
  CHECK(str_format("{:.2f}", 3.14159) == "3.14");
  CHECK(str_format("mode {:04o}", 0700) == "mode 0700");
  CHECK(str_format("{:o}", 0644) == "644");
  CHECK(str_format("[{:5}]", 42) == "[   42]");
  CHECK(str_format("[{:<5}]", 42) == "[42   ]");
  CHECK(str_format("{{}} {}", 1) == "{} 1");
  CHECK(str_format("no args") == "no args");
}
