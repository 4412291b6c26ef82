// SPDX-License-Identifier: MIT
// lavaflow-bench python: the per-message cost of the Python layer, against the same loop in C++
// in the same run. Both loops publish a message (untimed), then time receive → take the bytes →
// release; Python takes them through DLPack into NumPy (and PyTorch where installed).
//   cpp-receive                 C++: receive, bytes(), release
//   python-dlpack-numpy         Python: receive, numpy.from_dlpack, release
//   python-dlpack-torch         Python: receive, torch.from_dlpack, release
// The overhead is a Python row's p50 minus cpp-receive's p50; the target is ≤ 5 µs.
#include "python.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/lavaflow.hpp"

namespace lfbench {
namespace {

using namespace lavaflow;
using Clock = std::chrono::steady_clock;

constexpr double kTargetOverheadNs = 5000;

struct Row {
  std::string name;
  double p25 = 0, p50 = 0, p75 = 0;
  std::string note;
};

Row quartiles(std::string name, std::vector<double> ns) {
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) { return ns[static_cast<std::size_t>(q * static_cast<double>(ns.size() - 1))]; };
  return {std::move(name), at(0.25), at(0.5), at(0.75), {}};
}

std::filesystem::path scratch_directory() {
  char tmpl[] = "/tmp/lavaflow-bench-py-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d ? d : "";
}

Result<Row> cpp_loop(int messages, const std::filesystem::path& dir) {
  const std::string name = str_format("bench-py-cpp-{}", ::getpid());
  LF_TRY(auto p, Producer::create(name, {.slot_size = 4096, .transport = TransportKind::Shm, .directory = dir}));
  LF_TRY(auto c, Consumer::open(name, {.directory = dir}));
  std::vector<double> ns;
  ns.reserve(static_cast<std::size_t>(messages));
  volatile std::byte sink{};
  for (int i = 0; i < messages; ++i) {
    LF_TRY(auto loan, p->loan());
    LF_TRY_STATUS(p->publish(std::move(loan)));
    const auto t0 = Clock::now();
    LF_TRY(auto r, c->receive());
    sink = r.bytes()[0];
    r.release();
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  }
  (void)sink;
  return quartiles("cpp-receive", std::move(ns));
}

// The same loop in Python; prints one JSON line per loop: {"name", "ns": [...]} or {"name", "skip"}.
constexpr const char* kScript = R"(
import json, os, sys, time
import lavaflow
messages, directory = int(sys.argv[1]), sys.argv[2]
name = "bench-py-%d" % os.getpid()
p = lavaflow.Producer(name, slot_size=4096, transport="shm", directory=directory)
c = lavaflow.Consumer(name, directory=directory)
def loop(label, take):
    ns = []
    clock = time.perf_counter_ns
    for _ in range(messages):
        with p.loan():
            pass
        t0 = clock()
        msg = c.receive()
        x = take(msg)
        msg.release()
        del x
        ns.append(clock() - t0)
    print(json.dumps({"name": label, "ns": ns}), flush=True)
try:
    import numpy
    loop("python-dlpack-numpy", numpy.from_dlpack)
except ImportError as e:
    print(json.dumps({"name": "python-dlpack-numpy", "skip": str(e)}), flush=True)
try:
    import torch
    loop("python-dlpack-torch", torch.from_dlpack)
except ImportError as e:
    print(json.dumps({"name": "python-dlpack-torch", "skip": str(e)}), flush=True)
c.close()
p.close()
)";

/// Where the lavaflow package is: $LAVAFLOW_PYTHONPATH, else the build tree's python/ beside
/// this program's apps/bench/, else wherever the interpreter finds it (an installed package).
std::string python_path() {
  if (const char* e = std::getenv("LAVAFLOW_PYTHONPATH")) return e;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto tree = self.parent_path().parent_path().parent_path() / "python";
    if (std::filesystem::exists(tree / "lavaflow" / "__init__.py", ec)) return tree.string();
  }
  return {};
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::vector<Row> python_loops(int messages, const std::filesystem::path& dir, std::string& note) {
  std::vector<Row> rows;
  const char* env_py = std::getenv("LAVAFLOW_PYTHON");
  const std::string python = env_py ? env_py : LAVAFLOW_BENCH_PYTHON;
  const std::string path = python_path();
  const std::string cmd =
      str_format("{}{} -c {} {} {} 2>&1", path.empty() ? "" : "PYTHONPATH=" + shell_quote(path) + " ",
                 shell_quote(python), shell_quote(kScript), messages, shell_quote(dir.string()));
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) {
    note = "could not start " + python;
    return rows;
  }
  std::string out;
  char buf[1 << 16];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int rc = ::pclose(f);
  std::size_t at = 0;
  while (at < out.size()) {
    const auto end = std::min(out.find('\n', at), out.size());
    const std::string line = out.substr(at, end - at);
    at = end + 1;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name")) {
      note += line + "\n";
      continue;
    }
    if (j.contains("skip")) {
      rows.push_back({j["name"].get<std::string>(), -1, -1, -1, "skipped: " + j["skip"].get<std::string>()});
      continue;
    }
    auto ns = j["ns"].get<std::vector<double>>();
    if (ns.empty()) continue;
    rows.push_back(quartiles(j["name"].get<std::string>(), std::move(ns)));
  }
  if (rc != 0 && rows.empty()) note = str_format("{} failed (status {}): {}", python, rc, note);
  return rows;
}

}  // namespace

int bench_python(const PythonBenchOptions& options) {
  const int messages = options.quick ? 2000 : 20000;
  const auto dir = scratch_directory();
  if (dir.empty()) {
    std::fprintf(stderr, "lavaflow-bench python: no scratch directory in /tmp\n");
    return 1;
  }
  auto cpp = cpp_loop(messages, dir);
  std::string note;
  auto py = cpp ? python_loops(messages, dir, note) : std::vector<Row>{};
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!cpp) {
    std::fprintf(stderr, "lavaflow-bench python: %s\n", cpp.error().message().c_str());
    return 1;
  }
  if (py.empty()) {
    std::printf("no Python rows (the lavaflow package or its interpreter is missing): %s\n", note.c_str());
    return 77;
  }
  const double base = cpp->p50;
  if (options.json) {
    nlohmann::ordered_json j{{"results", nlohmann::ordered_json::array()}};
    j["results"].push_back({{"suite", "python"},
                            {"name", cpp->name},
                            {"p50_ns", cpp->p50},
                            {"p25_ns", cpp->p25},
                            {"p75_ns", cpp->p75},
                            {"samples", messages}});
    for (const auto& r : py) {
      if (r.p50 < 0) {
        j["results"].push_back({{"suite", "python"}, {"name", r.name}, {"skipped", r.note}});
        continue;
      }
      j["results"].push_back({{"suite", "python"},
                              {"name", r.name},
                              {"p50_ns", r.p50},
                              {"p25_ns", r.p25},
                              {"p75_ns", r.p75},
                              {"samples", messages},
                              {"baseline", cpp->name},
                              {"baseline_p50_ns", base},
                              {"overhead_ns", r.p50 - base},
                              {"target_overhead_ns", kTargetOverheadNs},
                              {"met", r.p50 - base <= kTargetOverheadNs}});
    }
    std::puts(j.dump().c_str());
    return 0;
  }
  std::printf("lavaflow-bench python: receive -> take the bytes -> release, %d messages of 4 KiB, shm\n", messages);
  std::printf("%-22s %10s %10s %10s %12s  %s\n", "loop", "p25 ns", "p50 ns", "p75 ns", "overhead", "target <= 5 us");
  std::printf("%-22s %10.0f %10.0f %10.0f %12s\n", cpp->name.c_str(), cpp->p25, cpp->p50, cpp->p75, "baseline");
  for (const auto& r : py) {
    if (r.p50 < 0) {
      std::printf("%-22s %s\n", r.name.c_str(), r.note.c_str());
      continue;
    }
    std::printf("%-22s %10.0f %10.0f %10.0f %10.0f ns  %s\n", r.name.c_str(), r.p25, r.p50, r.p75, r.p50 - base,
                r.p50 - base <= kTargetOverheadNs ? "met" : "NOT met");
  }
  return 0;
}

}  // namespace lfbench
