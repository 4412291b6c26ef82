// SPDX-License-Identifier: MIT
// Helper process for the GL tests: a channel consumer that reads every message through OpenGL.
//   lavaflow_gl_peer consume DIR NAME COUNT
// Imports each ring buffer into GL once (ChannelImports), reads each message with
// glGetNamedBufferSubData and checks it against the demo's per-sequence pattern. Exit 0 when all
// COUNT messages verified and no ring buffer was imported twice; 77 when GL cannot run here.
#include <cstdio>
#include <string>

#include "gl_support.hpp"
#include "lavaflow/transports/local.hpp"
#include "payload.hpp"

using namespace lavaflow;

int main(int argc, char** argv) {
  if (argc != 5 || std::string(argv[1]) != "consume") {
    std::fprintf(stderr, "usage: lavaflow_gl_peer consume DIR NAME COUNT\n");
    return 2;
  }
  const std::uint64_t count = std::stoull(argv[4]);
  auto c = Consumer::open(argv[3], {.connect_timeout = std::chrono::seconds(20), .directory = argv[2]});
  if (!c) return std::fprintf(stderr, "gl_peer: %s\n", c.error().message().c_str()), 1;
  if (!(*c)->vulkan()) return std::fprintf(stderr, "gl_peer: channel is not on the Vulkan transport\n"), 1;
  auto setup = lftest::gl_for(*(*c)->vulkan());
  if (!setup) return std::printf("LAVAFLOW-SKIP: %s\n", setup.error().message().c_str()), 77;
  gl::ChannelImports imports(setup->gl, **c);
  for (std::uint64_t i = 0; i < count; ++i) {
    auto r = (*c)->receive(std::chrono::seconds(20));
    if (!r)
      return std::fprintf(stderr, "gl_peer: message %llu: %s\n", static_cast<unsigned long long>(i),
                          r.error().message().c_str()),
             1;
    if (r->info().sequence != i)
      return std::fprintf(stderr, "gl_peer: sequence %llu, expected %llu\n",
                          static_cast<unsigned long long>(r->info().sequence), static_cast<unsigned long long>(i)),
             1;
    auto buf = imports.buffer(*r);
    if (!buf) return std::fprintf(stderr, "gl_peer: %s\n", buf.error().message().c_str()), 1;
    const auto bytes = lftest::gl_read((*buf)->name(), 0, r->info().size);
    std::vector<std::byte> expected(bytes.size());
    lfapp::fill_message(expected, i);
    if (bytes != expected)
      return std::fprintf(stderr, "gl_peer: message %llu corrupt as read by GL\n", static_cast<unsigned long long>(i)),
             1;
  }
  std::printf(
      "gl_peer: %llu messages verified through GL; %zu ring buffers imported for %u slots; hand-off to GL by %s\n",
      static_cast<unsigned long long>(count), imports.imported(), (*c)->slots(),
      imports.gpu_handoff() ? "a shared semaphore" : "the CPU wait in receive()");
  return imports.imported() <= (*c)->slots() ? 0 : 1;
}
