// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// A small `{}` formatter (g++ 12 has no <format>). Supports `{}` and the specs `{:x}`, `{:#x}`,
/// `{:0Nx}`, `{:o}`, `{:04o}` (file modes), `{:.Nf}`, `{:N}` (right-aligned width), `{:<N}`
/// (left-aligned). `{{`/`}}` escape.

#include <cstdint>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

namespace lavaflow {
namespace detail {

inline void format_one(std::ostringstream& os, std::string_view spec, const auto& value) {
  using T = std::remove_cvref_t<decltype(value)>;
  std::ostringstream tmp;
  bool left = false;
  std::size_t i = 0;
  if (i < spec.size() && spec[i] == '<') {
    left = true;
    ++i;
  }
  if (i < spec.size() && spec[i] == '#') {
    tmp << std::showbase;
    ++i;
  }
  if (i < spec.size() && spec[i] == '0') {
    tmp << std::setfill('0');
    left = false;
    ++i;
  }
  int width = 0;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') width = width * 10 + (spec[i++] - '0');
  int precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    precision = 0;
    ++i;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') precision = precision * 10 + (spec[i++] - '0');
  }
  if (i < spec.size() && spec[i] == 'x') tmp << std::hex;
  if (i < spec.size() && spec[i] == 'o') tmp << std::oct;
  if (precision >= 0) tmp << std::fixed << std::setprecision(precision);
  if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int8_t>) {
    tmp << static_cast<int>(value);
  } else if constexpr (std::is_enum_v<T>) {
    tmp << static_cast<std::underlying_type_t<T>>(value);
  } else {
    tmp << value;
  }
  std::string s = tmp.str();
  if (static_cast<int>(s.size()) < width) {
    const std::string pad(static_cast<std::size_t>(width) - s.size(),
                          spec.find('0') == 0 || (spec.size() > 1 && spec[spec[0] == '#'] == '0') ? '0' : ' ');
    s = left ? s + pad : (pad[0] == '0' && s.rfind("0x", 0) == 0 ? "0x" + pad + s.substr(2) : pad + s);
  }
  os << s;
}

inline void format_rest(std::ostringstream& os, std::string_view fmt) {
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    if ((fmt[i] == '{' || fmt[i] == '}') && i + 1 < fmt.size() && fmt[i + 1] == fmt[i]) ++i;
    os << fmt[i];
  }
}

template <class First, class... Rest>
void format_rest(std::ostringstream& os, std::string_view fmt, const First& first, const Rest&... rest) {
  for (std::size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if ((c == '{' || c == '}') && i + 1 < fmt.size() && fmt[i + 1] == c) {
      os << c;
      ++i;
      continue;
    }
    if (c == '{') {
      const auto close = fmt.find('}', i);
      if (close == std::string_view::npos) break;
      std::string_view spec = fmt.substr(i + 1, close - i - 1);
      if (!spec.empty() && spec[0] == ':') spec.remove_prefix(1);
      format_one(os, spec, first);
      format_rest(os, fmt.substr(close + 1), rest...);
      return;
    }
    os << c;
  }
}

}  // namespace detail

/// `str_format("{} of {:#x}", a, b)`.
template <class... Args>
[[nodiscard]] std::string str_format(std::string_view fmt, const Args&... args) {
  std::ostringstream os;
  detail::format_rest(os, fmt, args...);
  return os.str();
}

}  // namespace lavaflow
