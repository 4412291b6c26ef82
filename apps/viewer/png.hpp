// SPDX-License-Identifier: MIT
#pragma once
// A minimal PNG writer (RGBA8, deflate "stored" blocks: no compression library needed). The
// files are valid PNG that any reader opens; they are simply not compressed.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lavaflow/core/error.hpp"

namespace lfviewer {

/// Writes `rgba` (width x height pixels, 4 bytes each, row 0 at the top) to `path`, with the
/// given tEXt key/value pairs.
[[nodiscard]] lavaflow::Status write_png(const std::filesystem::path& path, std::uint32_t width, std::uint32_t height,
                                         std::span<const std::uint8_t> rgba,
                                         const std::vector<std::pair<std::string, std::string>>& text = {});

}  // namespace lfviewer
