// SPDX-License-Identifier: MIT
// lavaflow::transports from the installed package: a shared-memory channel with default options.
#include <unistd.h>

#include <cstdio>
#include <lavaflow/lavaflow.hpp>

int main() {
  const std::string name = "package-test-" + std::to_string(::getpid());
  auto p = lavaflow::Producer::create(name, {.slots = 2, .slot_size = 64, .transport = lavaflow::TransportKind::Shm});
  auto c = p ? lavaflow::Consumer::open(name) : std::unexpected(p.error());
  if (!c) return std::printf("transports: %s\n", c.error().message().c_str()), 1;
  auto loan = (*p)->loan(std::chrono::seconds(5));
  if (!loan || !(*p)->publish(std::move(*loan), {.size = 8, .user_tag = 42})) return 1;
  auto msg = (*c)->receive(std::chrono::seconds(5));
  if (!msg || msg->info().user_tag != 42) return 1;
  std::printf("transports: one message over %s\n", lavaflow::to_string((*c)->route().transport).data());
}
