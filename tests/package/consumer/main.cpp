// SPDX-License-Identifier: MIT
// A user project of the installed package: find_package(lavaflow), link, allocate and export.
#include <cstdio>
#include <lavaflow/lavaflow.hpp>
#include <lavaflow/transports/local.hpp>
int main() {
  auto ctx = lavaflow::VulkanContext::create();
  if (!ctx) { std::puts(ctx.error().message().c_str()); return 1; }
  auto b = lavaflow::GpuBuffer::allocate(*ctx, {.size = 4096});
  auto ex = b->export_handle();
  std::printf("exported fd %d, %zu transports\n", ex->fd.get(), lavaflow::local_transports().size());
}
