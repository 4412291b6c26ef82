// SPDX-License-Identifier: MIT
#include "cli.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace lfapp {

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (see --help)\n", app.get_name().c_str(), e.what());
    return 2;
  }
  return std::nullopt;
}

CLI::Validator whole(std::uint64_t min, std::uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        std::uint64_t v = 0;
        const char* end = text.data() + text.size();
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (!digits || ec == std::errc::invalid_argument || ptr != end) return "\"" + text + "\" is not a whole number";
        if (ec == std::errc::result_out_of_range || v < min || v > max)
          return "\"" + text + "\" is out of range " + std::to_string(min) + " to " + std::to_string(max);
        return {};
      },
      "[" + std::to_string(min) + " - " + std::to_string(max) + "]", "whole");
}

CLI::Validator real(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(v))
          return "\"" + text + "\" is not a finite number";
        if (v < min || v > max)
          return "\"" + text + "\" is out of range " + CLI::detail::to_string(min) + " to " +
                 CLI::detail::to_string(max);
        return {};
      },
      "NUMBER", "real");
}

}  // namespace lfapp
