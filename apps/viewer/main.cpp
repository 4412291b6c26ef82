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
#include <string>
#include <vector>

#include "cli.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "viewer.hpp"

namespace lfviewer {

namespace {
std::atomic<bool> g_stop{false};  // written by the signal handler only: the one process-wide flag
void on_signal(int) { g_stop.store(true); }
}  // namespace

bool stop_requested() { return g_stop.load(); }

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace lfviewer

namespace {

using lavaflow::str_format;

/// The default: this process shows, a child process computes. Returns the viewer's status (the
/// producer's when the viewer succeeded but the producer did not).
int run_both(const lfviewer::DisplayOptions& d, const std::vector<std::string>& producer_args) {
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
  lfviewer::ProduceOptions p;
  lfviewer::DisplayOptions d;
  bool no_verify = false;
  std::optional<double> timeout;
  std::string transport = "auto";
  CLI::App app{
      "lavaflow-viewer: a GL window fed by a compute process over a lava-flow channel, zero copy.\n"
      "Without --channel: starts the compute process (lavaflow-viewer produce) on a private channel and\n"
      "shows its frames; with --channel: the window only, for a producer started elsewhere. The title\n"
      "shows frames per second, the publish->drawn latency and the route. Exit status: 0 success,\n"
      "1 failure, 2 bad usage, 77 no usable Vulkan/GL device here.",
      "lavaflow-viewer"};
  app.set_help_all_flag("--help-all", "help for the produce subcommand too");
  auto frames_flag = [](CLI::App& cmd, std::uint64_t& frames) {
    lfapp::add_whole(cmd, "--frames", frames, "stop after N frames (0: until closed or the other side leaves)", 0,
                     1ull << 40);
  };
  auto shape_flags = [&](CLI::App& cmd) {
    lfapp::add_whole(cmd, "--width", p.width, "frame width", 1, 16384);
    lfapp::add_whole(cmd, "--height", p.height, "frame height", 1, 16384);
    cmd.add_option("--fps", p.fps, "the producer's pace (0: as fast as the viewer takes frames)")
        ->check(lfapp::real(0, 10'000));
    cmd.add_flag("--cuda", p.cuda, "draw frames with a CUDA kernel instead of a Vulkan compute shader");
    cmd.add_option("--transport", transport, "auto, shm or vulkan")->check(CLI::IsMember({"auto", "shm", "vulkan"}));
  };
  auto timeout_flag = [&](CLI::App& cmd) {
    cmd.add_option("--timeout", timeout, "seconds to wait for the other side")->check(lfapp::real(0, 7 * 24 * 3600));
  };
  app.add_option("--channel", d.channel, "show the frames of this channel's producer");
  frames_flag(app, d.frames);
  app.add_option("--screenshot", d.screenshot, "write the last frame drawn as PNG and check every pixel");
  app.add_flag("--headless", d.headless, "draw with EGL, no window (also chosen when there is no display)");
  app.add_flag("--wait", d.wait, "when the producer leaves, wait for a new one");
  app.add_flag("--no-verify", no_verify, "do not check the screenshot's pixels");
  timeout_flag(app);
  shape_flags(app);
  auto* produce = app.add_subcommand("produce", "the compute process only: draws an animated image into the channel");
  produce->add_option("--channel", p.channel, "channel name")->required();
  frames_flag(*produce, p.frames);
  produce->add_flag("--wait", p.wait, "when the viewer leaves, wait for the next one");
  timeout_flag(*produce);
  shape_flags(*produce);
  app.require_subcommand(0, 1);
  if (auto rc = lfapp::parse(app, argc, argv)) return *rc;

  if (transport != "auto") p.transport = *lavaflow::parse_transport(transport);
  if (produce->parsed()) {
    p.timeout_s = timeout.value_or(60);
    return lfviewer::produce_main(p);
  }
  d.verify = !no_verify;
  d.timeout_s = timeout.value_or(30);
  if (!d.channel.empty()) return lfviewer::display_main(d);
  // No channel: run the compute process too, on a private channel.
  d.channel = str_format("viewer-{}", ::getpid());
  std::vector<std::string> pargs{"--width", std::to_string(p.width), "--height",    std::to_string(p.height),
                                 "--fps",   str_format("{}", p.fps), "--transport", transport};
  if (p.cuda) pargs.push_back("--cuda");
  return run_both(d, pargs);
}
