// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Bounds-checked little-endian byte writer/reader for lava-flow's wire formats (descriptors,
/// locations, handshakes). A reader never reads past its span: every get reports Malformed.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "lavaflow/core/error.hpp"

namespace lavaflow::wire {

static_assert(std::endian::native == std::endian::little, "lava-flow wire formats assume little endian");

class Writer {
 public:
  template <class T>
  requires std::is_integral_v<T> || std::is_enum_v<T>
  void put(T v) { append(&v, sizeof v); }
  template <std::size_t N>
  void put(const std::array<std::uint8_t, N>& a) {
    append(a.data(), N);
  }
  /// Length-prefixed (u16) string; longer strings are an InvalidArgument at the caller's check.
  void put_string(std::string_view s) {
    put(static_cast<std::uint16_t>(s.size()));
    append(s.data(), s.size());
  }
  [[nodiscard]] std::vector<std::byte> take() && { return std::move(bytes_); }
  [[nodiscard]] std::size_t size() const { return bytes_.size(); }

 private:
  // Byte by byte (messages here are a few hundred bytes): GCC 12 at -O3 reports a false
  // -Wstringop-overflow inside an inlined vector::insert or resize of a byte range, which failed a
  // Release build with LAVAFLOW_WERROR.
  void append(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    for (std::size_t i = 0; i < n; ++i) bytes_.push_back(b[i]);
  }
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  Reader(std::span<const std::byte> bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}

  template <class T>
  requires std::is_integral_v<T> || std::is_enum_v<T>
  [[nodiscard]] Result<T> get() {
    if (remaining() < sizeof(T)) return short_read(sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  template <std::size_t N>
  [[nodiscard]] Status get(std::array<std::uint8_t, N>& out) {
    if (remaining() < N) return short_read(N);
    std::memcpy(out.data(), bytes_.data() + pos_, N);
    pos_ += N;
    return {};
  }
  [[nodiscard]] Result<std::string> get_string(std::size_t max_len) {
    auto len = get<std::uint16_t>();
    if (!len) return std::unexpected(len.error());
    if (*len > max_len)
      return fail(Errc::Malformed, what_,
                  "string length " + std::to_string(*len) + " exceeds limit " + std::to_string(max_len));
    if (remaining() < *len) return short_read(*len);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), *len);
    pos_ += *len;
    return s;
  }
  [[nodiscard]] std::size_t remaining() const { return bytes_.size() - pos_; }
  /// Fails when bytes are left over (a strict format has no trailing garbage).
  [[nodiscard]] Status expect_end() const {
    if (remaining() != 0) return fail(Errc::Malformed, what_, std::to_string(remaining()) + " trailing bytes");
    return {};
  }

 private:
  [[nodiscard]] std::unexpected<Error> short_read(std::size_t want) const {
    return fail(Errc::Malformed, what_,
                "truncated: need " + std::to_string(want) + " more bytes at offset " + std::to_string(pos_) +
                    ", have " + std::to_string(remaining()));
  }
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
  std::string what_;
};

}  // namespace lavaflow::wire
