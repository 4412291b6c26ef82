// SPDX-License-Identifier: MIT
// lavaflow::core from the installed package: a CPU buffer allocated, exported and imported.
#include <cstdio>
#include <lavaflow/core/cpu_buffer.hpp>

int main() {
  auto b = lavaflow::CpuBuffer::allocate({.size = 4096});
  auto ex = b ? b->export_handle() : std::unexpected(b.error());
  auto again = ex ? lavaflow::CpuBuffer::import(ex->descriptor, std::move(ex->fd)) : std::unexpected(ex.error());
  if (!again) return std::printf("core: %s\n", again.error().message().c_str()), 1;
  std::printf("core: exported and imported %llu bytes\n", static_cast<unsigned long long>(again->size()));
}
