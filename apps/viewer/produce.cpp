// SPDX-License-Identifier: MIT
// lavaflow-viewer produce: the compute process. Creates the channel, waits for a viewer, and writes
// an animated image into each loaned ring buffer with a Vulkan compute shader (or CUDA, or the CPU
// when the channel routed to shared memory), paced to --fps.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "frame_writer.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/transports/local.hpp"
#include "viewer.hpp"

namespace lfviewer {

using namespace lavaflow;
using namespace std::chrono_literals;

namespace {

int die(const Error& e) { return report_failure("producer", e); }

Result<std::unique_ptr<FrameWriter>> choose_writer(const ProduceOptions& o, const Producer& p) {
  if (o.cuda) return make_cuda_writer(p);
  if (p.vulkan()) return make_vulkan_writer(*p.vulkan());
  return make_cpu_writer();
}

/// Waits for a viewer in short steps (so a signal stops it). False on timeout or stop.
bool wait_for_viewer(Producer& p, double timeout_s) {
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (!stop_requested() && Clock::now() < until)
    if (p.wait_for_consumers(1, 200ms)) return true;
  return false;
}

}  // namespace

int produce_main(const ProduceOptions& o) {
  if (o.channel.empty()) return die(Error(Errc::InvalidArgument, "produce", "--channel NAME is required"));
  if (o.width == 0 || o.height == 0 || o.width > 16384 || o.height > 16384)
    return die(Error(Errc::InvalidArgument, "produce",
                     str_format("--width/--height must be 1..16384 (got {}x{})", o.width, o.height)));
  install_stop_handlers();
  const std::uint64_t frame_bytes = std::uint64_t{o.width} * o.height * 4;
  auto created = Producer::create(o.channel, {.slots = 3,
                                              .slot_size = frame_bytes,
                                              .timestamps = true,
                                              .host_wait_for_gpu_release = false,  // the writers wait on their GPU
                                              .transport = o.transport});
  if (!created) return die(created.error());
  Producer& p = **created;
  std::printf("[producer pid %d] channel \"%s\": route %s — %s\n", ::getpid(), o.channel.c_str(),
              to_string(p.route().transport).data(), p.route().reason.c_str());
  auto writer = choose_writer(o, p);
  if (!writer) return die(writer.error());
  std::printf("[producer] %ux%u RGBA frames, %u ring buffers, written by %s\n", o.width, o.height, p.slots(),
              (*writer)->description().c_str());
  std::fflush(stdout);

  std::uint64_t frame = 0;
  const auto period = o.fps > 0
                          ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / o.fps))
                          : Clock::duration{};
  while (!stop_requested()) {
    std::printf("[producer] waiting for a viewer on \"%s\"…\n", o.channel.c_str());
    std::fflush(stdout);
    if (!wait_for_viewer(p, o.timeout_s)) {
      if (stop_requested()) break;
      return die(Error(Errc::Timeout, "produce", str_format("no viewer connected within {:.0f} s", o.timeout_s)));
    }
    std::printf("[producer] viewer connected\n");
    std::fflush(stdout);
    const std::uint64_t first = frame;
    auto next = Clock::now();
    bool viewer_left = false;
    while (!stop_requested() && (o.frames == 0 || frame < o.frames)) {
      if (p.consumer_count() == 0) {
        viewer_left = true;
        break;
      }
      auto loan = p.loan(200ms);
      if (!loan) {
        if (loan.error().code() == Errc::Timeout) continue;  // the viewer is slow (or gone: checked above)
        return die(loan.error());
      }
      const FrameShape shape{o.width, o.height, static_cast<std::uint32_t>(frame)};
      if (auto ok = (*writer)->write_and_publish(
              p, std::move(*loan), shape, {.size = frame_bytes, .user_tag = frame_tag(o.width, o.height, shape.frame)});
          !ok)
        return die(ok.error());
      ++frame;
      if (period.count() > 0) {
        next += period;
        if (next < Clock::now() - period) next = Clock::now();  // fell behind: do not burst
        std::this_thread::sleep_until(next);
      }
    }
    if (viewer_left) {
      std::printf("[producer] the viewer went away after %llu frames\n",
                  static_cast<unsigned long long>(frame - first));
      std::fflush(stdout);
      if (o.wait) continue;
      return 0;
    }
    break;
  }
  if (stop_requested()) {
    std::printf("[producer] stopped after %llu frames\n", static_cast<unsigned long long>(frame));
    return 0;
  }
  // --frames reached: let the viewer take every frame before the ring goes away.
  if (auto ok = p.flush(10s); !ok && ok.error().code() != Errc::PeerLost) return die(ok.error());
  std::printf("[producer] done: %llu frames\n", static_cast<unsigned long long>(frame));
  return 0;
}

}  // namespace lfviewer
