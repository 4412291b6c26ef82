// SPDX-License-Identifier: MIT
#pragma once
// The apps' one argument parser: CLI11, with checks it lacks and lava-flow's exit statuses.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

namespace lfapp {

/// Parses argv. Returns the status to exit with when the program should stop here: 0 after
/// --help, 2 after bad usage (one line on stderr naming the flag and what is wrong); nullopt to
/// go on.
[[nodiscard]] std::optional<int> parse(CLI::App& app, int argc, char** argv);

/// An unsigned whole number in [min, max], written in decimal digits only: rejects signs
/// ("-1" would otherwise wrap around), values past 2^64 - 1, fractions and exponents.
[[nodiscard]] CLI::Validator whole(std::uint64_t min, std::uint64_t max);

/// A finite number in [min, max] (no nan, no inf).
[[nodiscard]] CLI::Validator real(double min, double max);

/// Adds `--name` for an unsigned integer of any width, checked with whole(min, max).
template <class T>
CLI::Option* add_whole(CLI::App& app, const std::string& name, T& value, const std::string& help, std::uint64_t min,
                       std::uint64_t max) {
  return app.add_option(name, value, help)->check(whole(min, max))->capture_default_str();
}

}  // namespace lfapp
