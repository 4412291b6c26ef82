// SPDX-License-Identifier: MIT
#include "png.hpp"

#include <array>
#include <cstdio>
#include <memory>

#include "lavaflow/core/detail/format.hpp"

namespace lfviewer {

namespace {

std::uint32_t crc32(std::span<const std::uint8_t> bytes, std::uint32_t crc = 0) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
      std::uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (auto b : bytes) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

void put32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

void chunk(std::vector<std::uint8_t>& out, const char (&type)[5], std::span<const std::uint8_t> data) {
  put32(out, static_cast<std::uint32_t>(data.size()));
  const std::size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put32(out, crc32(std::span(out).subspan(start)));
}

/// A zlib stream of stored (uncompressed) deflate blocks.
std::vector<std::uint8_t> zlib_stored(std::span<const std::uint8_t> raw) {
  std::vector<std::uint8_t> z{0x78, 0x01};
  std::uint32_t a = 1, b = 0;
  for (auto byte : raw) {
    a = (a + byte) % 65521;
    b = (b + a) % 65521;
  }
  std::size_t pos = 0;
  do {
    const std::size_t n = std::min<std::size_t>(raw.size() - pos, 65535);
    const bool last = pos + n == raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(static_cast<std::uint8_t>(n));
    z.push_back(static_cast<std::uint8_t>(n >> 8));
    z.push_back(static_cast<std::uint8_t>(~n));
    z.push_back(static_cast<std::uint8_t>(~n >> 8));
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(pos),
             raw.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
  } while (pos < raw.size());
  put32(z, (b << 16) | a);
  return z;
}

}  // namespace

lavaflow::Status write_png(const std::filesystem::path& path, std::uint32_t width, std::uint32_t height,
                           std::span<const std::uint8_t> rgba,
                           const std::vector<std::pair<std::string, std::string>>& text) {
  using lavaflow::Errc;
  const std::uint64_t row = std::uint64_t{width} * 4;
  if (width == 0 || height == 0 || rgba.size() != row * height)
    return lavaflow::fail(Errc::InvalidArgument, "write_png",
                          lavaflow::str_format("{} bytes for a {}x{} RGBA image (expected {})", rgba.size(), width,
                                               height, row * height));
  std::vector<std::uint8_t> out{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<std::uint8_t> ihdr;
  put32(ihdr, width);
  put32(ihdr, height);
  ihdr.insert(ihdr.end(), {8, 6, 0, 0, 0});  // 8 bits, RGBA, deflate, no filter method, no interlace
  chunk(out, "IHDR", ihdr);
  for (const auto& [key, value] : text) {
    std::vector<std::uint8_t> t(key.begin(), key.end());
    t.push_back(0);
    t.insert(t.end(), value.begin(), value.end());
    chunk(out, "tEXt", t);
  }
  std::vector<std::uint8_t> raw;
  raw.reserve((row + 1) * height);
  for (std::uint32_t y = 0; y < height; ++y) {
    raw.push_back(0);  // filter: none
    const auto line = rgba.subspan(y * row, row);
    raw.insert(raw.end(), line.begin(), line.end());
  }
  chunk(out, "IDAT", zlib_stored(raw));
  chunk(out, "IEND", {});
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f || std::fwrite(out.data(), 1, out.size(), f.get()) != out.size() || std::fflush(f.get()) != 0)
    return lavaflow::fail(Errc::System, "write_png", lavaflow::str_format("cannot write {}", path.string()));
  return {};
}

}  // namespace lfviewer
