// SPDX-License-Identifier: MIT
#pragma once
// A tiny JSON writer for the apps' --json output (objects, arrays, strings, numbers, bools).
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace lfapp {

class Json {
 public:
  Json& begin_object(std::string_view key = {}) { return open(key, '{'); }
  Json& end_object() { return close('}'); }
  Json& begin_array(std::string_view key = {}) { return open(key, '['); }
  Json& end_array() { return close(']'); }
  Json& field(std::string_view key, std::string_view v) { return raw(key, quote(v)); }
  Json& field(std::string_view key, const char* v) { return raw(key, quote(v)); }
  Json& field(std::string_view key, bool v) { return raw(key, v ? "true" : "false"); }
  template <class N>
    requires std::is_arithmetic_v<N>
  Json& field(std::string_view key, N v) {
    return raw(key, std::is_floating_point_v<N> ? trim(std::to_string(v)) : std::to_string(v));
  }
  Json& value(std::string_view v) { return raw({}, quote(v)); }
  [[nodiscard]] const std::string& str() const { return out_; }

 private:
  static std::string trim(std::string s) { return s; }
  static std::string quote(std::string_view s) {
    std::string q = "\"";
    for (char c : s) {
      switch (c) {
        case '"': q += "\\\""; break;
        case '\\': q += "\\\\"; break;
        case '\n': q += "\\n"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            q += buf;
          } else {
            q += c;
          }
      }
    }
    return q + "\"";
  }
  void sep() {
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  Json& raw(std::string_view key, std::string_view v) {
    sep();
    if (!key.empty()) out_ += quote(key) + ":";
    out_ += v;
    return *this;
  }
  Json& open(std::string_view key, char c) {
    sep();
    if (!key.empty()) out_ += quote(key) + ":";
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  Json& close(char c) {
    out_ += c;
    first_.pop_back();
    return *this;
  }
  std::string out_;
  std::vector<bool> first_;
};

}  // namespace lfapp
