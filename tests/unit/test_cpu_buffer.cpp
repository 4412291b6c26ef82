// SPDX-License-Identifier: MIT
#include <sys/mman.h>

#include "support.hpp"

using namespace lavaflow;

namespace {
CpuTopology one_node() {
  CpuTopology t;
  t.numa_library = true;
  t.numa_nodes = 1;
  return t;
}
}  // namespace

TEST_CASE("strategy choice states its reason and falls back where the machine lacks a feature") {
  auto t = one_node();
  auto c = choose_cpu_strategy(t, {.size = 4096});
  CHECK(c.strategy == CpuStrategy::SharedMemory);
  CHECK(c.reason.find("one NUMA node") != std::string::npos);

  c = choose_cpu_strategy(t, {.size = 4096, .strategy = CpuStrategy::NumaBound});
  CHECK(c.strategy == CpuStrategy::SharedMemory);
  CHECK(c.reason.find("1 NUMA node") != std::string::npos);

  c = choose_cpu_strategy(t, {.size = 4096, .strategy = CpuStrategy::HugePages});
  CHECK(c.strategy == CpuStrategy::SharedMemory);
  CHECK(c.reason.find("no huge pages reserved") != std::string::npos);

  c = choose_cpu_strategy(t, {.size = 4096, .strategy = CpuStrategy::GpuPinned});
  CHECK(c.strategy == CpuStrategy::SharedMemory);
  CHECK(c.reason.find("no Vulkan context") != std::string::npos);

  auto multi = t;
  multi.numa_nodes = 2;
  CHECK(choose_cpu_strategy(multi, {.size = 4096}).strategy == CpuStrategy::NumaBound);
  CHECK(choose_cpu_strategy(multi, {.size = 4096, .strategy = CpuStrategy::NumaBound, .numa_node = 5}).strategy ==
        CpuStrategy::SharedMemory);

  auto huge = t;
  huge.huge_page_size = 2 << 20;
  huge.huge_pages_total = huge.huge_pages_free = 4;
  CHECK(choose_cpu_strategy(huge, {.size = 4 << 20}).strategy == CpuStrategy::HugePages);
  CHECK(choose_cpu_strategy(huge, {.size = 4096}).strategy == CpuStrategy::SharedMemory);
  auto few = choose_cpu_strategy(huge, {.size = 64 << 20, .strategy = CpuStrategy::HugePages});
  CHECK(few.strategy == CpuStrategy::SharedMemory);
  CHECK(few.reason.find("32 huge pages needed") != std::string::npos);
}

TEST_CASE("strict mode turns a fallback into an Unsupported error") {
  auto e =
      lftest::err(CpuBuffer::allocate({.size = 4096, .strategy = CpuStrategy::NumaBound, .strict = true}, one_node()));
  CHECK(e.code() == Errc::Unsupported);
  CHECK(e.cause().find("NUMA") != std::string::npos);
}

TEST_CASE("shared-memory CPU buffer: write, export, import elsewhere, same bytes") {
  const int before = lftest::open_fds();
  {
    auto a = lftest::ok(CpuBuffer::allocate({.size = 10000, .strategy = CpuStrategy::SharedMemory}));
    CHECK(a.kind() == BufferKind::CpuShared);
    CHECK(a.size() == 10000);
    lftest::fill(a.bytes(), 5);
    auto ex = lftest::ok(a.export_handle());
    auto b = lftest::ok(CpuBuffer::import(ex.descriptor, std::move(ex.fd)));
    CHECK_FALSE(ex.fd.valid());
    CHECK(b.host_ptr() != a.host_ptr());
    CHECK(lftest::first_mismatch(b.bytes(), 5) == -1);
    lftest::fill(b.bytes(), 6);
    CHECK(lftest::first_mismatch(a.bytes(), 6) == -1);
  }
  CHECK(lftest::open_fds() == before);
}

TEST_CASE("the machine's own topology: NUMA and huge pages fall back or work, never fail") {
  const auto topo = CpuTopology::detect();
  for (auto s : {CpuStrategy::Auto, CpuStrategy::SharedMemory, CpuStrategy::NumaBound, CpuStrategy::HugePages}) {
    auto b = lftest::ok(CpuBuffer::allocate({.size = 3 << 20, .strategy = s}, topo));
    INFO(to_string(s) << ": " << b.reason());
    CHECK_FALSE(b.reason().empty());
    lftest::fill(b.bytes(), 1);
    CHECK(lftest::first_mismatch(b.bytes(), 1) == -1);
  }
}

TEST_CASE("huge pages for real, when the machine reserves them") {
  const auto topo = CpuTopology::detect();
  if (topo.huge_pages_free == 0) lftest::skip("no huge pages reserved on this machine (vm.nr_hugepages=0)");
  auto b = lftest::ok(
      CpuBuffer::allocate({.size = topo.huge_page_size, .strategy = CpuStrategy::HugePages, .strict = true}, topo));
  CHECK(b.kind() == BufferKind::CpuHugePages);
  lftest::fill(b.bytes(), 2);
  CHECK(lftest::first_mismatch(b.bytes(), 2) == -1);
}

TEST_CASE("NUMA binding for real, when the machine has several nodes") {
  const auto topo = CpuTopology::detect();
  if (topo.numa_nodes < 2) lftest::skip("this machine has " + std::to_string(topo.numa_nodes) + " NUMA node(s)");
  auto b = lftest::ok(
      CpuBuffer::allocate({.size = 1 << 20, .strategy = CpuStrategy::NumaBound, .numa_node = 1, .strict = true}, topo));
  CHECK(b.kind() == BufferKind::CpuNuma);
}

TEST_CASE("GPU-pinned CPU memory is read by the GPU directly") {
  auto ctx = lftest::context_or_skip();
  if (!ctx.capabilities().memory_host_import) lftest::skip("device lacks VK_EXT_external_memory_host");
  const std::uint64_t n = 1 << 16;
  auto pinned = lftest::ok(CpuBuffer::allocate({.size = n, .strategy = CpuStrategy::Auto, .gpu = &ctx}));
  CHECK(pinned.strategy() == CpuStrategy::GpuPinned);
  CHECK(pinned.gpu_buffer());
  lftest::fill(pinned.bytes(), 77);
  auto dst = lftest::ok(GpuBuffer::allocate(ctx, {.size = n, .memory = GpuMemory::HostVisible}));
  lftest::vk_copy(ctx, pinned.gpu_buffer(), 0, dst.buffer(), 0, n);
  CHECK(lftest::first_mismatch(dst.bytes(), 77) == -1);
  // ... and it is still a shareable memfd.
  auto ex = lftest::ok(pinned.export_handle());
  auto again = lftest::ok(CpuBuffer::import(ex.descriptor, std::move(ex.fd)));
  CHECK(lftest::first_mismatch(again.bytes(), 77) == -1);
}

TEST_CASE("CPU import refuses bad fds, short files, unsealed files, GPU descriptors") {
  auto a = lftest::ok(CpuBuffer::allocate({.size = 8192}));
  auto ex = lftest::ok(a.export_handle());

  auto d = ex.descriptor;
  d.allocation_size = d.buffer_size = 1 << 20;
  d.size = 1 << 20;
  auto e = lftest::err(CpuBuffer::import(d, std::move(ex.fd)));
  CHECK(e.code() == Errc::Malformed);
  CHECK(e.cause().find("fd holds") != std::string::npos);
  CHECK(ex.fd.valid());

  d = ex.descriptor;
  d.kind = BufferKind::GpuDeviceLocal;
  CHECK(lftest::err(CpuBuffer::import(d, std::move(ex.fd))).code() == Errc::InvalidArgument);

  UniqueFd unsealed(::memfd_create("u", MFD_CLOEXEC));
  REQUIRE(::ftruncate(unsealed.get(), 8192) == 0);
  auto u = lftest::err(CpuBuffer::import(ex.descriptor, std::move(unsealed)));
  CHECK(u.code() == Errc::PermissionDenied);
  CHECK(unsealed.valid());

  CHECK(lftest::err(CpuBuffer::import(ex.descriptor, UniqueFd(-1))).code() == Errc::InvalidArgument);
  CHECK(lftest::err(CpuBuffer::allocate({.size = 0})).code() == Errc::InvalidArgument);
  CHECK(lftest::ok(CpuBuffer::import(ex.descriptor, std::move(ex.fd))).size() == 8192);
}
