// SPDX-License-Identifier: MIT
// Reads a PNG written by lavaflow-viewer --screenshot with an independent decoder (zlib, CRCs
// checked) and compares every pixel with the viewer's formula for the frame named in its tEXt
// chunk: the file must be a valid PNG showing the producer's content, not a blank or stale frame.
//   lavaflow_png_check FILE.png
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "pattern.h"

namespace {

int fail(const std::string& why) {
  std::fprintf(stderr, "png_check: FAILED: %s\n", why.c_str());
  return 1;
}

std::uint32_t be32(const std::uint8_t* p) { return (std::uint32_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3]; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: lavaflow_png_check FILE.png");
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<std::uint8_t> f((std::istreambuf_iterator<char>(in)), {});
  static const std::uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (f.size() < 8 || !std::equal(sig, sig + 8, f.begin())) return fail("not a PNG file");
  std::uint32_t w = 0, h = 0;
  std::vector<std::uint8_t> idat;
  std::map<std::string, std::string> text;
  bool end = false;
  for (std::size_t pos = 8; !end;) {
    if (pos + 12 > f.size()) return fail("truncated chunk");
    const std::uint32_t len = be32(&f[pos]);
    if (len > f.size() - pos - 12) return fail("chunk length beyond the file");
    const std::string type(reinterpret_cast<const char*>(&f[pos + 4]), 4);
    const std::uint8_t* data = &f[pos + 8];
    if (crc32(0, &f[pos + 4], len + 4) != be32(&f[pos + 8 + len])) return fail("bad CRC in chunk " + type);
    if (type == "IHDR") {
      if (len != 13 || data[8] != 8 || data[9] != 6 || data[12] != 0)
        return fail("expected an 8-bit RGBA non-interlaced image");
      w = be32(data);
      h = be32(data + 4);
    } else if (type == "IDAT") {
      idat.insert(idat.end(), data, data + len);
    } else if (type == "tEXt") {
      const std::string t(reinterpret_cast<const char*>(data), len);
      const auto nul = t.find('\0');
      if (nul != std::string::npos) text[t.substr(0, nul)] = t.substr(nul + 1);
    } else if (type == "IEND") {
      end = true;
    }
    pos += 12 + len;
  }
  if (w == 0 || h == 0) return fail("no IHDR");
  const std::size_t row = std::size_t{w} * 4;
  std::vector<std::uint8_t> raw((row + 1) * h);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, idat.data(), idat.size()) != Z_OK || raw_len != raw.size())
    return fail("image data does not inflate to " + std::to_string(raw.size()) + " bytes");
  if (!text.count("lavaflow-frame")) return fail("no lavaflow-frame tEXt chunk");
  const auto frame = static_cast<unsigned>(std::stoul(text["lavaflow-frame"]));
  std::set<std::uint32_t> colours;
  for (std::uint32_t y = 0; y < h; ++y) {
    if (raw[y * (row + 1)] != 0)
      return fail("row " + std::to_string(y) + " uses a PNG filter this checker does not undo");
    for (std::uint32_t x = 0; x < w; ++x) {
      const std::uint8_t* p = &raw[y * (row + 1) + 1 + x * 4];
      const std::uint32_t px = p[0] | (p[1] << 8) | (p[2] << 16) | (std::uint32_t{p[3]} << 24);
      colours.insert(px);
      if (px != lf_pattern(x, y, w, h, frame)) {
        char msg[160];
        std::snprintf(msg, sizeof msg, "pixel (%u, %u) is %#010x; frame %u has %#010x", x, y, px, frame,
                      lf_pattern(x, y, w, h, frame));
        return fail(msg);
      }
    }
  }
  if (colours.size() < 256)
    return fail("only " + std::to_string(colours.size()) + " distinct colours: not the producer's image");
  std::printf(
      "png_check: OK: %ux%u, frame %u, %zu distinct colours, every pixel as the producer computes it (route: %s)\n", w,
      h, frame, colours.size(), text["lavaflow-route"].c_str());
  return 0;
}
