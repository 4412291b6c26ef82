// SPDX-License-Identifier: MIT
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support.hpp"

using namespace lavaflow;

TEST_CASE("exportable GPU buffers: both memory kinds, export, import into another context") {
  auto a = lftest::context_or_skip();
  if (!a.capabilities().memory_fd_export) lftest::skip("device cannot export opaque-fd memory");
  auto b = lftest::ok(VulkanContext::create({.device = a.capabilities().identity.device_uuid}));
  for (auto mem : {GpuMemory::DeviceLocal, GpuMemory::HostVisible}) {
    for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{4093}, std::uint64_t{1} << 20}) {
      INFO("size " << size << " memory " << static_cast<int>(mem));
      auto src = lftest::ok(GpuBuffer::allocate(a, {.size = size, .memory = mem}));
      CHECK(src.size() == size);
      CHECK(src.kind() == (mem == GpuMemory::DeviceLocal ? BufferKind::GpuDeviceLocal : BufferKind::GpuHostVisible));
      auto ex = lftest::ok(src.export_handle());
      CHECK(ex.fd.valid());
      CHECK(ex.descriptor.dedicated);
      CHECK(ex.descriptor.allocation_size >= size + kGpuTailPadding);
      auto dst = lftest::ok(GpuBuffer::import(b, ex.descriptor, std::move(ex.fd)));
      CHECK_FALSE(ex.fd.valid());                        // consumed on success
      if (!src.host_ptr() || !dst.host_ptr()) continue;  // device-local without host mapping
      lftest::fill(src.bytes(), size);
      CHECK(lftest::first_mismatch(dst.bytes(), size) == -1);
      lftest::fill(dst.bytes(), size + 1);
      CHECK(lftest::first_mismatch(src.bytes(), size + 1) == -1);
    }
  }
}

TEST_CASE("imported memory is really shared with the GPU: a Vulkan copy in one context is seen by the other") {
  auto a = lftest::context_or_skip();
  auto b = lftest::ok(VulkanContext::create({.device = a.capabilities().identity.device_uuid}));
  const std::uint64_t n = 65536;
  auto staging = lftest::ok(GpuBuffer::allocate(a, {.size = n, .memory = GpuMemory::HostVisible}));
  auto shared = lftest::ok(GpuBuffer::allocate(a, {.size = n, .memory = GpuMemory::DeviceLocal}));
  lftest::fill(staging.bytes(), 99);
  lftest::vk_copy(a, staging.buffer(), 0, shared.buffer(), 0, n);
  auto ex = lftest::ok(shared.export_handle());
  auto imported = lftest::ok(GpuBuffer::import(b, ex.descriptor, std::move(ex.fd)));
  auto readback = lftest::ok(GpuBuffer::allocate(b, {.size = n, .memory = GpuMemory::HostVisible}));
  lftest::vk_copy(b, imported.buffer(), 0, readback.buffer(), 0, n);
  CHECK(lftest::first_mismatch(readback.bytes(), 99) == -1);
}

TEST_CASE("GPU import refuses bad input before any driver call and leaves the fd with the caller") {
  auto a = lftest::context_or_skip();
  auto src = lftest::ok(GpuBuffer::allocate(a, {.size = 4096}));
  auto ex = lftest::ok(src.export_handle());
  const int raw = ex.fd.get();

  auto d = ex.descriptor;
  d.device_uuid[0] ^= 0xff;
  auto e = lftest::err(GpuBuffer::import(a, d, std::move(ex.fd)));
  CHECK(e.code() == Errc::DeviceMismatch);
  CHECK(e.cause().find("device") != std::string::npos);
  CHECK(ex.fd.get() == raw);
  CHECK(lftest::fd_is_open(raw));

  d = ex.descriptor;
  d.driver_uuid[5] ^= 0x1;
  CHECK(lftest::err(GpuBuffer::import(a, d, std::move(ex.fd))).code() == Errc::DeviceMismatch);

  d = ex.descriptor;
  d.size = d.buffer_size + 1;
  CHECK(lftest::err(GpuBuffer::import(a, d, std::move(ex.fd))).code() == Errc::Malformed);

  // A descriptor mutated to claim more memory than the fd has: named as such whether the size
  // check or the driver notices it (not "out of device memory"). Only where the exported memory is
  // a file with a size to check: NVIDIA's opaque fds are not, and its driver accepts a larger
  // allocationSize (the spec leaves a mismatch undefined), so there the descriptor is trusted.
  struct stat st {};
  const bool sized = ::fstat(raw, &st) == 0 && S_ISREG(st.st_mode);
  for (std::uint64_t extra : {std::uint64_t{64}, ex.descriptor.allocation_size}) {
    if (!sized) break;
    d = ex.descriptor;
    d.allocation_size += extra;
    auto m = lftest::err(GpuBuffer::import(a, d, std::move(ex.fd)));
    CHECK(m.code() == Errc::Malformed);
    CHECK(m.cause().find("does not match the allocation") != std::string::npos);
    CHECK(lftest::fd_is_open(raw));
  }

  d = ex.descriptor;
  d.memory_type_index = 31;
  CHECK(lftest::err(GpuBuffer::import(a, d, std::move(ex.fd))).code() == Errc::DeviceMismatch);

  d = ex.descriptor;
  d.kind = BufferKind::CpuShared;
  CHECK(lftest::err(GpuBuffer::import(a, d, std::move(ex.fd))).code() == Errc::InvalidArgument);
  CHECK(lftest::fd_is_open(raw));

  // Closed and never-open fds.
  UniqueFd closed(::memfd_create("x", MFD_CLOEXEC));
  ::close(closed.get());
  auto bad = lftest::err(GpuBuffer::import(a, ex.descriptor, std::move(closed)));
  CHECK(bad.code() == Errc::InvalidArgument);
  CHECK(bad.cause().find("not an open file descriptor") != std::string::npos);
  (void)closed.release();
  CHECK(lftest::err(GpuBuffer::import(a, ex.descriptor, UniqueFd())).code() == Errc::InvalidArgument);

  // Still importable after all the refusals.
  auto good = lftest::ok(GpuBuffer::import(a, ex.descriptor, std::move(ex.fd)));
  CHECK(good.size() == 4096);
}

TEST_CASE("GPU import checks a memory file's real size and seals before the driver maps it (no SIGBUS)") {
  // A same-user peer can hand over any memfd with a genuine descriptor: one smaller than the
  // descriptor says, one it could shrink after the import, or a real export it truncated.
  auto a = lftest::context_or_skip();
  if (!a.capabilities().memory_fd_export) lftest::skip("device cannot export opaque-fd memory");
  auto src = lftest::ok(GpuBuffer::allocate(a, {.size = 1 << 20, .memory = GpuMemory::HostVisible}));
  auto ex = lftest::ok(src.export_handle());
  struct stat st {};
  REQUIRE(::fstat(ex.fd.get(), &st) == 0);
  if (!S_ISREG(st.st_mode)) lftest::skip("this driver's exported memory is not a file: its import checks the size");

  // The real export is sealed: its producer cannot truncate it under an importer.
  CHECK(::ftruncate(ex.fd.get(), 4096) != 0);
  CHECK((::fcntl(ex.fd.get(), F_GET_SEALS) & F_SEAL_SHRINK) != 0);

  // Smaller than announced.
  UniqueFd small(::memfd_create("short", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(::ftruncate(small.get(), 4096) == 0);
  auto e = lftest::err(GpuBuffer::import(a, ex.descriptor, std::move(small)));
  CHECK(e.code() == Errc::Malformed);
  CHECK(e.cause().find("does not match the allocation") != std::string::npos);
  CHECK(small.valid());

  // Large enough but it cannot be sealed: the sender could shrink it later.
  UniqueFd unsealable(::memfd_create("unsealable", MFD_CLOEXEC));
  REQUIRE(::ftruncate(unsealable.get(), static_cast<off_t>(ex.descriptor.allocation_size) * 2) == 0);
  auto u = lftest::err(GpuBuffer::import(a, ex.descriptor, std::move(unsealable)));
  CHECK(u.code() == Errc::PermissionDenied);
  CHECK(u.cause().find("sealed") != std::string::npos);

  // A sealable one of the right size is sealed by the import's check, so it cannot shrink after.
  UniqueFd sealable(::memfd_create("sealable", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(::ftruncate(sealable.get(), 4096) == 0);
  CHECK(lftest::err(GpuBuffer::import(a, ex.descriptor, std::move(sealable))).code() == Errc::Malformed);
  CHECK(lftest::ok(GpuBuffer::import(a, ex.descriptor, std::move(ex.fd))).size() == std::uint64_t{1} << 20);
}

TEST_CASE("every export of a buffer has its own file offset: concurrent importers cannot disturb each other") {
  // lavapipe's opaque fds are memfds whose import seeks and reads a header through the fd; exports
  // that share one file description (dup) made concurrent imports by several consumers fail.
  auto a = lftest::context_or_skip();
  if (!a.capabilities().memory_fd_export) lftest::skip("device cannot export opaque-fd memory");
  auto b = lftest::ok(VulkanContext::create({.device = a.capabilities().identity.device_uuid}));
  auto src = lftest::ok(GpuBuffer::allocate(a, {.size = 4096, .memory = GpuMemory::HostVisible}));
  auto one = lftest::ok(src.export_handle());
  auto two = lftest::ok(src.export_handle());
  if (::lseek(one.fd.get(), 0, SEEK_CUR) < 0) lftest::skip("this driver's exported fds have no file offset to share");
  CHECK(::lseek(one.fd.get(), 100, SEEK_SET) == 100);
  CHECK(::lseek(two.fd.get(), 0, SEEK_CUR) == 0);  // the other export did not move
  // An import with the first export's offset moved still works, and so does the second.
  auto x = lftest::ok(GpuBuffer::import(b, one.descriptor, std::move(one.fd)));
  auto y = lftest::ok(GpuBuffer::import(b, two.descriptor, std::move(two.fd)));
  lftest::fill(src.bytes(), 4096);
  CHECK(lftest::first_mismatch(x.bytes(), 4096) == -1);
  CHECK(lftest::first_mismatch(y.bytes(), 4096) == -1);
}

TEST_CASE("GPU allocation rejects bad sizes") {
  auto a = lftest::context_or_skip();
  CHECK(lftest::err(GpuBuffer::allocate(a, {.size = 0})).code() == Errc::InvalidArgument);
  auto huge = GpuBuffer::allocate(a, {.size = std::uint64_t{1} << 60});
  REQUIRE_FALSE(huge);
  CHECK((huge.error().code() == Errc::InvalidArgument || huge.error().code() == Errc::OutOfMemory));
}

TEST_CASE("open-fd count is unchanged after 10,000 export/import/destroy cycles") {
  auto a = lftest::context_or_skip();
  auto b = lftest::ok(VulkanContext::create({.device = a.capabilities().identity.device_uuid}));
  auto src = lftest::ok(GpuBuffer::allocate(a, {.size = 4096, .memory = GpuMemory::HostVisible}));
  // Warm up driver-internal fds (lavapipe opens some lazily).
  {
    auto ex = lftest::ok(src.export_handle());
    auto i = lftest::ok(GpuBuffer::import(b, ex.descriptor, std::move(ex.fd)));
  }
  const int before = lftest::steady_fds();
  for (int i = 0; i < 10000; ++i) {
    auto ex = src.export_handle();
    REQUIRE(ex);
    auto imported = GpuBuffer::import(b, ex->descriptor, std::move(ex->fd));
    REQUIRE(imported);
    if (i % 1000 == 0) {
      auto fresh = GpuBuffer::allocate(a, {.size = 1 << 16});
      REQUIRE(fresh);
      auto ex2 = fresh->export_handle();
      REQUIRE(ex2);
    }
  }
  CHECK(lftest::fds_settled(before) <= before);
}
