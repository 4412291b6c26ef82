// SPDX-License-Identifier: MIT
// lavaflow-bench run | compare | report. `run` starts each suite as a child of this program with
// --json — the suites keep their own output (which tests and scripts read) and a suite that
// crashes or hangs on a machine takes only itself down — then normalises the rows (regress.cpp).
#include "run.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "lavaflow/lavaflow.hpp"
#include "regress.hpp"
#if LAVAFLOW_BENCH_INTEROP
#include "lavaflow/cuda/cuda.hpp"
#endif

namespace lfbench {
namespace {

namespace fs = std::filesystem;
using regress::Run;

struct Suite {
  const char* name;
  bool built;
  const char* not_built;           ///< why it is absent from this build
  bool plots;                      ///< takes --plot FILE.png
  std::vector<std::string> quick;  ///< arguments of a quick run
};

/// Every suite `run` knows. Quick runs keep each suite's shape (every row) with fewer samples or
/// a smaller largest size, so that a quick run compares with another quick run.
std::vector<Suite> suites() {
  return {
      {"alloc", true, "", false, {"--reps", "21"}},
      {"local", true, "", true, {"--quick"}},
      {"pool", true, "", false, {"--quick"}},
      {"python", true, "", false, {"--quick"}},
      {"remote",
       LAVAFLOW_BENCH_REMOTE != 0,
       "the MPI transport is not built (LAVAFLOW_WITH_MPI)",
       true,
       {"--max-size", "65536", "--no-staging"}},
      {"collectives",
       LAVAFLOW_BENCH_COLLECTIVES != 0,
       "the mesh's MPI part is not built (LAVAFLOW_WITH_MPI)",
       true,
       {"--max-size", "65536"}},
      {"device-collectives", true, "", false, {"--max-size", "65536"}},
      {"interop",
       LAVAFLOW_BENCH_INTEROP != 0,
       "the CUDA adapter is not built (LAVAFLOW_WITH_CUDA)",
       false,
       {"--size", "67108864", "--rounds", "200", "--frames", "200"}},
  };
}

struct Child {
  int status = -1;  ///< exit status, or -1 when it did not exit normally
  std::string out;  ///< its standard output (its standard error goes to ours)
};

/// Runs `args` with standard output captured.
Child capture(const std::vector<std::string>& args) {
  Child c;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return c;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  std::vector<char*> argv;
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc == 0) {
    char buf[65536];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      c.out.append(buf, static_cast<std::size_t>(n));
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    c.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ::close(fds[0]);
  return c;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string first_line_of(const fs::path& file, std::string_view prefix) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(prefix)) return trim(line.substr(prefix.size()));
  return "";
}

/// A command's first line of output ("" when it fails).
std::string command_line(const std::vector<std::string>& args) {
  auto c = capture(args);
  return c.status == 0 ? trim(c.out.substr(0, c.out.find('\n'))) : "";
}

bool on_path(const char* program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && ::access((fs::path(d) / program).c_str(), X_OK) == 0) return true;
  return false;
}

/// What the figures depend on: the machine, the build, the code.
nlohmann::ordered_json environment() {
  nlohmann::ordered_json e;
  e["cpu"] = first_line_of("/proc/cpuinfo", "model name\t: ");
  e["cpus"] = std::to_string(std::max(1u, std::thread::hardware_concurrency()));
  auto os = first_line_of("/etc/os-release", "PRETTY_NAME=");
  std::erase(os, '"');
  e["os"] = os;
  utsname u{};
  if (::uname(&u) == 0) e["kernel"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  if (auto vk = lavaflow::VulkanContext::create())
    e["vulkan"] = vk->capabilities().identity.name + " (" + vk->capabilities().driver_name + ")";
  else
    e["vulkan"] = "none";
  std::string gpu = "none";
#if LAVAFLOW_BENCH_INTEROP
  if (auto devs = lavaflow::cuda::devices(); devs && !devs->empty()) gpu = devs->front().name;
#endif
  e["cuda_gpu"] = gpu;
  const auto nv = first_line_of("/proc/driver/nvidia/version", "NVRM version: ");
  e["nvidia_driver"] = nv.empty() ? "none" : nv;
#if defined(__clang__)
  e["compiler"] = std::string("clang ") + __clang_version__;
#else
  e["compiler"] = std::string("g++ ") + __VERSION__;
#endif
  e["build_type"] = LAVAFLOW_BENCH_BUILD_TYPE;
  // The checkout run from (the bench is run from the source tree it was built from).
  const auto head = command_line({"/usr/bin/env", "git", "rev-parse", "--short=12", "HEAD"});
  const auto dirty = capture({"/usr/bin/env", "git", "status", "--porcelain", "--untracked-files=no"});
  e["commit"] = head.empty() ? "unknown" : head + (dirty.status == 0 && !dirty.out.empty() ? " (modified)" : "");
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
  e["date"] = date;
  return e;
}

/// The run file: one row per line, so that a refreshed baseline diffs row by row.
std::string format_run(const Run& run) {
  auto j = regress::to_json(run);
  std::string s = "{\n";
  bool first = true;
  for (const auto& [k, v] : j.items()) {
    s += first ? "" : ",\n";
    first = false;
    s += "  " + nlohmann::ordered_json(k).dump() + ": ";
    if ((k == "rows" || k == "suites") && !v.empty()) {
      s += "[\n";
      for (std::size_t i = 0; i < v.size(); ++i) s += "    " + v[i].dump() + (i + 1 < v.size() ? ",\n" : "\n");
      s += "  ]";
    } else {
      s += v.dump();
    }
  }
  return s + "\n}\n";
}

}  // namespace

std::vector<std::string> run_suites() {
  std::vector<std::string> names;
  for (const auto& s : suites()) names.emplace_back(s.name);
  return names;
}

int bench_run(const RunOptions& o) {
  std::error_code ec;
  const auto raw_dir = fs::path(o.out) / "raw";
  fs::create_directories(raw_dir, ec);
  if (ec) {
    std::fprintf(stderr, "lavaflow-bench run: --out %s: %s\n", o.out.c_str(), ec.message().c_str());
    return 2;
  }
  Run run;
  run.quick = o.quick;
  run.repeats = o.repeats;
  run.environment = environment();
  const bool gnuplot = on_path("gnuplot");
  std::vector<Suite> todo;
  for (auto& s : suites())
    if (o.suites.empty() || std::find(o.suites.begin(), o.suites.end(), s.name) != o.suites.end())
      todo.push_back(std::move(s));
  int rc = 0;
  for (std::size_t i = 0; i < todo.size(); ++i) {
    const Suite& s = todo[i];
    regress::SuiteStatus st{.suite = s.name, .status = "ran"};
    std::fprintf(stderr, "lavaflow-bench run: [%zu/%zu] %s ...\n", i + 1, todo.size(), s.name);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<nlohmann::json> reps;
    if (!s.built) {
      st.status = "skipped";
      st.reason = s.not_built;
    }
    for (std::uint64_t rep = 0; s.built && rep < o.repeats; ++rep) {
      std::vector<std::string> args{"/proc/self/exe", s.name, "--json"};
      if (o.quick) args.insert(args.end(), s.quick.begin(), s.quick.end());
      if (s.plots && gnuplot && rep == 0) {
        st.plot = std::string(s.name) + ".png";
        args.insert(args.end(), {"--plot", (fs::path(o.out) / st.plot).string()});
      }
      const auto child = capture(args);
      if (child.status == 77) {  // the suite's own "skipped" (no GPU, no CUDA device…), with its reason
        st = {.suite = s.name, .status = "skipped", .reason = trim(child.out)};
        break;
      }
      const auto brace = child.out.rfind("\n{");
      const std::string text = child.out.substr(brace == std::string::npos ? 0 : brace + 1);
      const auto doc = nlohmann::json::parse(text, nullptr, false);
      if (child.status != 0 || doc.is_discarded()) {
        st.status = "failed";
        st.reason = child.status != 0 ? "exited with status " + std::to_string(child.status) + " (its errors above)"
                                      : "printed no JSON";
        break;
      }
      // The suite's own output, every field of it (targets, p99…), for whoever wants more than rows.
      std::ofstream(raw_dir / (std::string(s.name) + "." + std::to_string(rep + 1) + ".json")) << text;
      reps.push_back(doc);
    }
    if (st.status == "ran") {
      auto rows = regress::normalise(s.name, reps);
      if (!rows) {
        st.status = "failed";
        st.reason = rows.error();
      } else {
        run.rows.insert(run.rows.end(), rows->begin(), rows->end());
        st.reason = std::to_string(rows->size()) + " rows";
      }
    }
    if (st.status != "ran") st.plot.clear();
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "lavaflow-bench run: [%zu/%zu] %s: %s in %.1f s%s%s\n", i + 1, todo.size(), s.name,
                 st.status.c_str(), st.seconds, st.reason.empty() ? "" : ": ", st.reason.c_str());
    if (st.status == "failed") rc = 1;
    run.suites.push_back(std::move(st));
  }
  if (!gnuplot) std::fprintf(stderr, "lavaflow-bench run: gnuplot not found: no plots\n");
  const auto file = fs::path(o.out) / "run.json";
  std::ofstream out(file);
  out << format_run(run);
  out.close();
  if (!out) {
    std::fprintf(stderr, "lavaflow-bench run: cannot write %s\n", file.c_str());
    return 2;
  }
  std::fprintf(stderr, "lavaflow-bench run: %zu rows written to %s\n", run.rows.size(), file.c_str());
  return rc;
}

int bench_compare(const CompareCommand& cmd) {
  auto base = regress::load_run(cmd.base);
  auto now = base ? regress::load_run(cmd.now) : base;
  if (!base || !now) {
    std::fprintf(stderr, "lavaflow-bench compare: %s\n", (!base ? base : now).error().c_str());
    return 2;
  }
  const regress::CompareOptions options{.threshold = cmd.threshold_percent / 100, .ratios_only = cmd.ratios_only};
  const auto c = regress::compare(*base, *now, options);
  std::size_t judged = 0;
  for (const auto& x : c.rows) judged += x.verdict != regress::Verdict::Skipped;
  if (c.rows.empty() || judged == 0) {
    std::fprintf(stderr, "lavaflow-bench compare: %s and %s have no rows in common%s: nothing to compare\n",
                 cmd.base.c_str(), cmd.now.c_str(),
                 c.rows.empty() ? "" : " that can be compared (--ratios-only: none has a same-run baseline)");
    return 2;
  }
  std::fputs(regress::format_comparison(c, options).c_str(), stdout);
  return c.regressions ? 1 : 0;
}

int bench_report(const std::vector<std::string>& paths, const std::string& out) {
  std::vector<regress::ReportInput> runs;
  std::string command = "lavaflow-bench report";
  for (const auto& p : paths) {
    auto run = regress::load_run(p);
    if (!run) {
      std::fprintf(stderr, "lavaflow-bench report: %s\n", run.error().c_str());
      return 2;
    }
    std::error_code ec;
    runs.push_back({p, fs::absolute(p, ec), std::move(*run)});
    command += " " + p;
  }
  if (out != "-") command += " --out " + out;
  std::error_code ec;
  const fs::path out_dir = out == "-" ? fs::current_path(ec) : fs::absolute(out, ec).parent_path();
  if (ec || out.empty()) {
    std::fprintf(stderr, "lavaflow-bench report: --out '%s': not a usable path\n", out.c_str());
    return 2;
  }
  const auto md = regress::markdown_report(runs, out_dir, command);
  if (out == "-") {
    std::fputs(md.c_str(), stdout);
    return 0;
  }
  std::ofstream f(out);
  f << md;
  f.close();
  if (!f) {
    std::fprintf(stderr, "lavaflow-bench report: --out %s: cannot write\n", out.c_str());
    return 2;
  }
  return 0;
}

}  // namespace lfbench
