// SPDX-License-Identifier: MIT
// Helper process for the cross-process tests: `lavaflow_test_peer MODE SOCKET_FD`.
//   gpu-import : receive descriptor+fd, import, check seed 1, write seed 2, reply "ok"
//   gpu-export : allocate, write seed 3, send descriptor+fd, wait for "check", check seed 4
//   cpu-import : like gpu-import for a CPU buffer
// Channel modes: `lavaflow_test_peer MODE NAME DIR ARG SOCKET_FD`
//   chan-produce N   : create NAME in DIR (shm), wait for a consumer, publish N checksummed
//                      messages, reply "published", then wait to be killed
//   chan-hold        : open NAME in DIR, receive one message and hold it, reply "holding", wait
//   chan-open-as-uid U : setuid(U), try to open NAME in DIR, reply with the error (or "opened")
// Every failure is replied as text and gives exit code 1.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "lavaflow/transports/local.hpp"
#include "payload.hpp"
#include "vk_helpers.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;

namespace {

int reply(int sock, const std::string& text) {
  auto bytes = std::as_bytes(std::span(text));
  (void)send_message(sock, bytes);
  if (text != "ok") std::fprintf(stderr, "peer: %s\n", text.c_str());
  return text == "ok" ? 0 : 1;
}

std::string text_of(const SocketMessage& m) {
  return std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size());
}

}  // namespace

int channel_mode(const std::string& mode, const std::string& name, const std::string& dir, const std::string& arg,
                 int sock) {
  if (mode == "chan-produce") {
    auto p = Producer::create(name, {.slots = 8, .slot_size = 4096, .transport = TransportKind::Shm, .directory = dir});
    if (!p) return reply(sock, p.error().message());
    if (auto ok = (*p)->wait_for_consumers(1, 30s); !ok) return reply(sock, ok.error().message());
    const std::uint64_t n = std::stoull(arg);
    for (std::uint64_t seq = 0; seq < n; ++seq) {
      auto loan = (*p)->loan(10s);
      if (!loan) return reply(sock, loan.error().message());
      auto b = loan->bytes().first(1000);
      lfapp::fill_message(b, seq);
      if (auto pub = (*p)->publish(std::move(*loan), {.size = b.size(), .user_tag = lfapp::checksum(b)}); !pub)
        return reply(sock, pub.error().message());
    }
    (void)send_message(sock, std::as_bytes(std::span(std::string_view("published"))));
    for (;;) ::pause();
  }
  if (mode == "chan-hold") {
    auto c = Consumer::open(name, {.connect_timeout = 30s, .directory = dir});
    if (!c) return reply(sock, c.error().message());
    auto r = (*c)->receive(30s);
    if (!r) return reply(sock, r.error().message());
    (void)send_message(sock, std::as_bytes(std::span(std::string_view("holding"))));
    for (;;) ::pause();
  }
  if (mode == "chan-open-as-uid") {
    if (::setgid(static_cast<gid_t>(std::stoul(arg))) != 0 || ::setuid(static_cast<uid_t>(std::stoul(arg))) != 0)
      return reply(sock, "setuid failed");
    auto c = Consumer::open(name, {.connect_timeout = 2s, .directory = dir});
    const std::string text = c ? "opened" : c.error().message();
    (void)send_message(sock, std::as_bytes(std::span(text)));
    return 0;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}

int main(int argc, char** argv) {
  if (argc == 6) return channel_mode(argv[1], argv[2], argv[3], argv[4], std::stoi(argv[5]));
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s gpu-import|gpu-export|cpu-import SOCKET_FD\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int sock = std::stoi(argv[2]);

  if (mode == "gpu-import" || mode == "cpu-import") {
    auto m = recv_message(sock, 30s);
    if (!m) return reply(sock, m.error().message());
    if (m->fds.size() != 1) return reply(sock, "expected exactly one fd");
    auto d = ExportDescriptor::deserialize(m->payload);
    if (!d) return reply(sock, d.error().message());
    if (mode == "cpu-import") {
      auto b = CpuBuffer::import(*d, std::move(m->fds[0]));
      if (!b) return reply(sock, b.error().message());
      if (auto i = lftest::first_mismatch(b->bytes(), 1); i >= 0)
        return reply(sock, "byte " + std::to_string(i) + " differs");
      lftest::fill(b->bytes(), 2);
      return reply(sock, "ok");
    }
    auto ctx = VulkanContext::create({.device = d->device_uuid});
    if (!ctx) return reply(sock, ctx.error().message());
    auto b = GpuBuffer::import(*ctx, *d, std::move(m->fds[0]));
    if (!b) return reply(sock, b.error().message());
    if (auto e = lftest::gpu_check(*ctx, *b, 1); !e.empty()) return reply(sock, e);
    if (auto e = lftest::gpu_fill(*ctx, *b, 2); !e.empty()) return reply(sock, e);
    return reply(sock, "ok");
  }
  if (mode == "gpu-export") {
    auto ctx = VulkanContext::create();
    if (!ctx) return reply(sock, ctx.error().message());
    auto b = GpuBuffer::allocate(*ctx, {.size = 1'000'003});
    if (!b) return reply(sock, b.error().message());
    if (auto e = lftest::gpu_fill(*ctx, *b, 3); !e.empty()) return reply(sock, e);
    auto ex = b->export_handle();
    if (!ex) return reply(sock, ex.error().message());
    int fds[] = {ex->fd.get()};
    if (auto s = send_message(sock, ex->descriptor.serialize(), fds); !s) return reply(sock, s.error().message());
    ex->fd.reset();  // the peer has its own copy now
    auto m = recv_message(sock, 30s);
    if (!m) return reply(sock, m.error().message());
    if (text_of(*m) != "check") return reply(sock, "unexpected request " + text_of(*m));
    if (auto e = lftest::gpu_check(*ctx, *b, 4); !e.empty()) return reply(sock, e);
    return reply(sock, "ok");
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
