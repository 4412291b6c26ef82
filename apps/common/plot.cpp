// SPDX-License-Identifier: MIT
#include "plot.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "lavaflow/core/detail/format.hpp"

namespace lfapp {

using lavaflow::Errc;
using lavaflow::fail;
using lavaflow::str_format;

namespace {

std::string quoted(const std::string& s) {  // a gnuplot string literal
  std::string q = "\"";
  for (char c : s) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

}  // namespace

lavaflow::Status plot_vs_size(const std::filesystem::path& png, const std::string& title, const std::string& y_label,
                              const std::vector<PlotSeries>& series) {
  std::uint64_t lo = ~0ull, hi = 0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      if (x == 0) continue;  // a size-independent baseline
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
  if (hi == 0) return fail(Errc::InvalidArgument, "--plot", "no results to plot");
  if (lo == hi) hi = lo * 2;
  const double x0 = static_cast<double>(lo) / 1.5, x1 = static_cast<double>(hi) * 1.5;
  char tmpl[] = "/tmp/lavaflow-plot-XXXXXX";
  if (!::mkdtemp(tmpl)) return fail(Errc::System, "mkdtemp", std::strerror(errno));
  const std::filesystem::path dir(tmpl);
  std::ofstream script(dir / "plot.gp");
  script << "set terminal pngcairo size 1100,650 noenhanced font 'sans,10'\n"
         << "set output " << quoted(std::filesystem::absolute(png).string()) << "\n"
         << "set title " << quoted(title) << "\n"
         << "set logscale xy\nset grid xtics ytics mytics\n"
         << "set xlabel 'message size (bytes)'\nset ylabel " << quoted(y_label) << "\n"
         << "set key outside right top\n"
         << "set xrange [" << x0 << ":" << x1 << "]\n"
         << "set format x '%.0s%cB'\n"
         << "plot ";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    const auto data = dir / str_format("s{}.dat", i);
    std::ofstream d(data);
    if (s.points.size() == 1) {  // does not depend on size: a line across the plot
      d << x0 << " " << s.points[0].second << "\n" << x1 << " " << s.points[0].second << "\n";
    } else {
      for (const auto& [x, y] : s.points)
        if (x > 0) d << x << " " << y << "\n";
    }
    script << (i ? ", " : "") << quoted(data.string()) << " using 1:2 with "
           << (s.points.size() == 1 ? "lines" : "linespoints") << " lw 2" << (s.baseline ? " dt 2" : "") << " title "
           << quoted(s.label);
  }
  script << "\n";
  script.close();
  const std::string script_path = (dir / "plot.gp").string();
  char* argv[] = {const_cast<char*>("gnuplot"), const_cast<char*>(script_path.c_str()), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv, environ);
  int status = 0;
  if (rc == 0) ::waitpid(pid, &status, 0);
  std::filesystem::remove_all(dir);
  if (rc != 0)
    return fail(Errc::Unsupported, "--plot",
                str_format("cannot run gnuplot ({}): install it (Debian: apt install gnuplot-nox)", std::strerror(rc)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return fail(Errc::System, "gnuplot",
                str_format("exited with status {} while drawing {}", WEXITSTATUS(status), png.string()));
  return {};
}

}  // namespace lfapp
