// SPDX-License-Identifier: MIT
// lavaflow-viewer — a window showing frames computed by a separate process, over a lava-flow channel.
//   lavaflow-viewer [--frames N] [--screenshot out.png] [--headless] [--cuda] [--width W --height H]
//       starts the compute process itself (a private channel) and shows its frames
//   lavaflow-viewer --channel NAME [--wait] …       the window only, for a producer started elsewhere
//   lavaflow-viewer produce --channel NAME [--cuda] [--fps F] [--frames N] [--wait] …
//       the compute process only
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "viewer.hpp"

namespace lfviewer {

namespace {
std::atomic<bool> g_stop{false};  // written by the signal handler only: the one process-wide flag
void on_signal(int) { g_stop.store(true); }
}  // namespace

bool stop_requested() { return g_stop.load(); }

void install_stop_handlers() {
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace lfviewer

namespace {

using lavaflow::str_format;

void usage() {
  std::puts(
      "usage:\n"
      "  lavaflow-viewer [--frames N] [--screenshot FILE.png] [--headless] [--cuda] [--width W] [--height H] [--fps F]\n"
      "      starts the compute process (lavaflow-viewer produce) on a private channel and shows its frames\n"
      "  lavaflow-viewer --channel NAME [--frames N] [--screenshot FILE.png] [--headless] [--wait] [--timeout S]\n"
      "      the window only: shows the frames of a producer started elsewhere (either side may start first)\n"
      "  lavaflow-viewer produce --channel NAME [--width W] [--height H] [--fps F] [--frames N] [--cuda]\n"
      "                          [--transport auto|shm|vulkan] [--wait] [--timeout S]\n"
      "      the compute process only: a Vulkan compute shader (or, with --cuda, a CUDA kernel) draws an\n"
      "      animated image into the channel's ring buffers\n"
      "options:\n"
      "  --frames N          stop after N frames (0 = until the window closes or the other side leaves)\n"
      "  --screenshot FILE   write the last frame drawn as PNG and check every pixel against the producer's formula\n"
      "  --headless          draw with EGL, no window (also chosen when there is no display)\n"
      "  --wait              when the other side leaves, wait for a new one instead of exiting\n"
      "  --fps F             the producer's pace (default 60; 0 = as fast as the viewer takes frames)\n"
      "The window title shows frames per second, the publish->drawn latency and the channel's route.\n"
      "Exit status: 0 success, 1 failure, 2 bad usage, 77 no usable Vulkan/GL device here.");
}

struct Args {
  std::string command;
  std::map<std::string, std::string> opts;
  std::vector<std::string> flags;
  bool has(const std::string& f) const { return std::find(flags.begin(), flags.end(), f) != flags.end(); }
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = opts.find(k);
    return it == opts.end() ? def : it->second;
  }
};

bool number(const Args& a, const std::string& key, double& out) {
  auto it = a.opts.find(key);
  if (it == a.opts.end()) return true;
  char* end = nullptr;
  out = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end || out < 0) {
    std::fprintf(stderr, "lavaflow-viewer: --%s needs a non-negative number, got \"%s\"\n", key.c_str(), it->second.c_str());
    return false;
  }
  return true;
}

/// The default: this process shows, a child process computes. Returns the viewer's status (the
/// producer's when the viewer succeeded but the producer did not).
int run_both(const Args& a, const lfviewer::DisplayOptions& d, const std::vector<std::string>& producer_args) {
  std::vector<std::string> args{"lavaflow-viewer", "produce", "--channel", d.channel, "--timeout", "30"};
  args.insert(args.end(), producer_args.begin(), producer_args.end());
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  pid_t child = -1;
  if (::posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
    std::perror("posix_spawn");
    return 1;
  }
  (void)a;
  const int rc = lfviewer::display_main(d);
  // The viewer has left the channel: the producer notices and exits; make sure of it.
  int status = 0;
  for (int i = 0; i < 100 && ::waitpid(child, &status, WNOHANG) == 0; ++i) ::usleep(50'000);
  if (::waitpid(child, &status, WNOHANG) == 0) {
    ::kill(child, SIGTERM);
    ::waitpid(child, &status, 0);
  }
  const int prc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (rc == 0 && prc != 0) std::fprintf(stderr, "lavaflow-viewer: the compute process exited with %d\n", prc);
  return rc != 0 ? rc : prc;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  int i = 1;
  if (argc > 1 && argv[1][0] != '-') a.command = argv[i++];
  static const char* kFlags[] = {"--headless", "--wait", "--cuda", "--no-verify"};
  for (; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      usage();
      return 0;
    }
    if (std::find_if(std::begin(kFlags), std::end(kFlags), [&](const char* f) { return k == f; }) != std::end(kFlags)) {
      a.flags.push_back(k.substr(2));
      continue;
    }
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) {
      std::fprintf(stderr, "lavaflow-viewer: unexpected argument %s\n", k.c_str());
      usage();
      return 2;
    }
    static const char* kOptions[] = {"channel", "frames", "screenshot", "width", "height", "fps", "timeout", "transport"};
    if (std::find_if(std::begin(kOptions), std::end(kOptions), [&](const char* o) { return k.substr(2) == o; }) == std::end(kOptions)) {
      std::fprintf(stderr, "lavaflow-viewer: unknown option %s\n", k.c_str());
      usage();
      return 2;
    }
    a.opts[k.substr(2)] = argv[++i];
  }
  std::optional<lavaflow::TransportKind> transport;
  if (const auto t = a.get("transport", "auto"); t != "auto") {
    auto kind = lavaflow::parse_transport(t);
    if (!kind || *kind == lavaflow::TransportKind::Mpi) {
      std::fprintf(stderr, "lavaflow-viewer: --transport must be auto, shm or vulkan\n");
      return 2;
    }
    transport = *kind;
  }
  double width = 640, height = 360, fps = 60, frames = 0, timeout = -1;
  if (!number(a, "width", width) || !number(a, "height", height) || !number(a, "fps", fps) || !number(a, "frames", frames) ||
      !number(a, "timeout", timeout))
    return 2;
  if (a.command == "produce") {
    lfviewer::ProduceOptions p{.channel = a.get("channel"), .width = static_cast<std::uint32_t>(width),
                               .height = static_cast<std::uint32_t>(height), .fps = fps, .frames = static_cast<std::uint64_t>(frames),
                               .transport = transport, .cuda = a.has("cuda"),
                               .wait = a.has("wait"), .timeout_s = timeout < 0 ? 60 : timeout};
    return lfviewer::produce_main(p);
  }
  if (!a.command.empty()) {
    std::fprintf(stderr, "lavaflow-viewer: unknown command %s\n", a.command.c_str());
    usage();
    return 2;
  }
  lfviewer::DisplayOptions d{.channel = a.get("channel"), .frames = static_cast<std::uint64_t>(frames), .screenshot = a.get("screenshot"),
                             .headless = a.has("headless"), .wait = a.has("wait"), .verify = !a.has("no-verify"),
                             .timeout_s = timeout < 0 ? 30 : timeout};
  if (!d.channel.empty()) return lfviewer::display_main(d);
  // No channel: run the compute process too, on a private channel.
  d.channel = str_format("viewer-{}", ::getpid());
  std::vector<std::string> pargs{"--width", a.get("width", "640"), "--height", a.get("height", "360"), "--fps", a.get("fps", "60")};
  if (a.has("cuda")) pargs.push_back("--cuda");
  if (auto t = a.get("transport"); !t.empty()) pargs.insert(pargs.end(), {"--transport", t});
  return run_both(a, d, pargs);
}
