// SPDX-License-Identifier: MIT
// lavaflow-demo: two processes on this machine share one exportable Vulkan buffer.
// The producer allocates it, writes a known pattern and sends descriptor + fd over a Unix socket
// (SCM_RIGHTS); the consumer imports it into its own Vulkan context and verifies every byte.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lavaflow/core/format.hpp"
#include "lavaflow/lavaflow.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kNoDevice = 77;

std::byte pattern(std::uint64_t i) { return static_cast<std::byte>((i * 2654435761u) >> 13); }

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::string describe(const VulkanContext& ctx) {
  const auto& c = ctx.capabilities();
  return format("{} ({}, driver {}, device UUID {})", c.identity.name, device_type_name(c.type), c.driver_name,
                to_string(c.identity.device_uuid));
}

int consumer(int sock) {
  auto m = recv_message(sock, 60s);
  if (!m) {
    std::fprintf(stderr, "consumer: %s\n", m.error().message().c_str());
    return 1;
  }
  const auto t0 = Clock::now();
  auto desc = ExportDescriptor::deserialize(m->payload);
  std::string verdict;
  if (!desc || m->fds.size() != 1) {
    verdict = desc ? "expected one fd" : desc.error().message();
  } else if (auto ctx = VulkanContext::create({.device = desc->device_uuid}); !ctx) {
    verdict = ctx.error().message();
  } else {
    std::printf("[consumer pid %d] own Vulkan context on %s\n", ::getpid(), describe(*ctx).c_str());
    auto buf = GpuBuffer::import(*ctx, *desc, std::move(m->fds[0]));
    if (!buf) {
      verdict = buf.error().message();
    } else {
      const double import_ms = ms_since(t0);
      std::vector<std::byte> data(buf->size());
      const auto t1 = Clock::now();
      if (auto s = download(*ctx, *buf, data); !s) verdict = s.error().message();
      for (std::uint64_t i = 0; verdict.empty() && i < data.size(); ++i)
        if (data[i] != pattern(i)) verdict = format("byte {} is {:#x}, expected {:#x}", i, data[i], pattern(i));
      if (verdict.empty()) {
        std::printf("[consumer pid %d] imported in %.2f ms, read and verified %llu bytes in %.2f ms\n", ::getpid(),
                    import_ms, static_cast<unsigned long long>(data.size()), ms_since(t1));
        verdict = "ok";
      }
    }
  }
  (void)send_message(sock, std::as_bytes(std::span(verdict)));
  if (verdict != "ok") std::fprintf(stderr, "[consumer] FAILED: %s\n", verdict.c_str());
  return verdict == "ok" ? 0 : 1;
}

int producer(int sock, pid_t child, std::uint64_t size) {
  const auto t0 = Clock::now();
  auto ctx = VulkanContext::create();
  if (!ctx) {
    std::fprintf(stderr, "producer: %s\n", ctx.error().message().c_str());
    return kNoDevice;
  }
  std::printf("[producer pid %d] Vulkan context on %s\n", ::getpid(), describe(*ctx).c_str());
  auto buf = GpuBuffer::allocate(*ctx, {.size = size, .memory = GpuMemory::DeviceLocal});
  if (!buf) {
    std::fprintf(stderr, "producer: %s\n", buf.error().message().c_str());
    return 1;
  }
  std::vector<std::byte> data(size);
  for (std::uint64_t i = 0; i < size; ++i) data[i] = pattern(i);
  if (auto s = upload(*ctx, *buf, data); !s) {
    std::fprintf(stderr, "producer: %s\n", s.error().message().c_str());
    return 1;
  }
  auto ex = buf->export_handle();
  if (!ex) {
    std::fprintf(stderr, "producer: %s\n", ex.error().message().c_str());
    return 1;
  }
  std::printf("[producer pid %d] allocated %llu bytes (%s, dedicated, memory type %u), wrote the pattern, exported fd %d\n",
              ::getpid(), static_cast<unsigned long long>(size), std::string(to_string(buf->kind())).c_str(),
              ex->descriptor.memory_type_index, ex->fd.get());
  int fds[] = {ex->fd.get()};
  if (auto s = send_message(sock, ex->descriptor.serialize(), fds); !s) {
    std::fprintf(stderr, "producer: %s\n", s.error().message().c_str());
    return 1;
  }
  ex->fd.reset();  // the consumer holds its own reference now
  std::printf("[producer pid %d] sent descriptor (%zu bytes) + fd over a Unix socket (SCM_RIGHTS) to pid %d\n", ::getpid(),
              ExportDescriptor::kSerializedSize, child);
  auto reply = recv_message(sock, 120s);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!reply) {
    std::fprintf(stderr, "producer: consumer gave no answer: %s\n", reply.error().message().c_str());
    return 1;
  }
  std::string verdict(reinterpret_cast<const char*>(reply->payload.data()), reply->payload.size());
  if (verdict != "ok" || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "FAILED: consumer says: %s\n", verdict.c_str());
    return 1;
  }
  std::printf("OK: consumer verified %llu bytes of the producer's Vulkan memory, zero copies between processes, %.1f ms in all\n",
              static_cast<unsigned long long>(size), ms_since(t0));
  return 0;
}

void usage() {
  std::puts(
      "usage: lavaflow-demo [--size BYTES]\n"
      "Starts a producer and a consumer process. The producer allocates an exportable Vulkan buffer\n"
      "(default 64 MiB) and writes a pattern; the consumer imports it through descriptor + fd over a\n"
      "Unix socket into its own Vulkan context and verifies every byte. Exit status 0 on success,\n"
      "1 on any failure, 77 when this machine has no usable Vulkan device.");
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t size = 64ull << 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--size") && i + 1 < argc) {
      char* end = nullptr;
      size = std::strtoull(argv[++i], &end, 10);
      if (!end || *end || size == 0) {
        std::fprintf(stderr, "lavaflow-demo: --size needs a positive byte count, got %s\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "lavaflow-demo: unknown argument %s\n", argv[i]);
      usage();
      return 2;
    }
  }
  auto pair = socket_pair();
  if (!pair) {
    std::fprintf(stderr, "lavaflow-demo: %s\n", pair.error().message().c_str());
    return 1;
  }
  std::fflush(stdout);
  // Fork before either side touches Vulkan: each process builds its own context.
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    pair->first.reset();
    std::_Exit(consumer(pair->second.get()));
  }
  pair->second.reset();
  return producer(pair->first.get(), pid, size);
}
