// SPDX-License-Identifier: MIT
#pragma once
// lavaflow-viewer's two halves: the compute process that produces frames into a channel, and the
// window (or headless GL context) that shows them.
#include <cstdint>
#include <cstdio>
#include <string>

#include "lavaflow/transports/channel.hpp"

namespace lfviewer {

inline constexpr int kSkip = 77;  ///< no Vulkan device / GL context able to run this here

struct ProduceOptions {
  std::string channel;
  std::uint32_t width = 640, height = 360;
  double fps = 60;                                   ///< 0 = as fast as the viewer takes them
  std::uint64_t frames = 0;                          ///< 0 = until stopped
  std::optional<lavaflow::TransportKind> transport;  ///< unset: automatic
  bool cuda = false;      ///< write frames with a CUDA kernel into the imported Vulkan memory
  bool wait = false;      ///< when the viewer leaves, wait for the next one
  double timeout_s = 60;  ///< how long to wait for a viewer
};

struct DisplayOptions {
  std::string channel;
  std::uint64_t frames = 0;  ///< 0 = until the window is closed or the producer leaves
  std::string screenshot;    ///< PNG of the last frame
  bool headless = false;     ///< EGL, no window
  bool wait = false;         ///< when the producer leaves, wait for the next one
  bool verify = true;        ///< compare the screenshot with the producer's formula
  double timeout_s = 30;     ///< how long to wait for a producer
};

/// The frame's shape and number ride in MessageInfo::user_tag.
inline std::uint64_t frame_tag(std::uint32_t width, std::uint32_t height, std::uint32_t frame) {
  return (std::uint64_t{width} << 48) | (std::uint64_t{height & 0xFFFF} << 32) | frame;
}
struct FrameTag {
  std::uint32_t width, height, frame;
};
inline FrameTag parse_tag(std::uint64_t tag) {
  return {static_cast<std::uint32_t>(tag >> 48), static_cast<std::uint32_t>((tag >> 32) & 0xFFFF),
          static_cast<std::uint32_t>(tag)};
}

/// Prints `who`'s failure and gives the exit status: 77 (skip) when this machine lacks the device
/// or feature, else 1.
inline int report_failure(const char* who, const lavaflow::Error& e) {
  std::fprintf(stderr, "[%s] FAILED: %s\n", who, e.message().c_str());
  return e.code() == lavaflow::Errc::NotFound || e.code() == lavaflow::Errc::Unsupported ? kSkip : 1;
}

int produce_main(const ProduceOptions& o);
int display_main(const DisplayOptions& o);

/// Set by SIGINT/SIGTERM: both halves stop cleanly (the channel name is released).
bool stop_requested();
void install_stop_handlers();

}  // namespace lfviewer
