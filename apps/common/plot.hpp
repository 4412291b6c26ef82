// SPDX-License-Identifier: MIT
#pragma once
// lavaflow-bench --plot: latency against message size, one line per transport and baseline, drawn
// by gnuplot (Debian's gnuplot-nox; the plot is a PNG). Series with a single size (baselines that
// do not depend on it) are drawn as a horizontal line across the plot.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "lavaflow/core/error.hpp"

namespace lfapp {

struct PlotSeries {
  std::string label;
  std::vector<std::pair<std::uint64_t, double>> points;  ///< (size in bytes, value)
  bool baseline = false;                                 ///< drawn dashed
};

/// Writes `png` with log-log axes (x: message size, y: `y_label`). Fails naming the cause when
/// gnuplot is missing or fails.
[[nodiscard]] lavaflow::Status plot_vs_size(const std::filesystem::path& png, const std::string& title,
                                            const std::string& y_label, const std::vector<PlotSeries>& series);

}  // namespace lfapp
