// SPDX-License-Identifier: MIT
// Exportable images, shareable semaphores and re-export of imported memory (lavaflow::core).
#include <sys/mman.h>
#include <unistd.h>

#include "support.hpp"

using namespace lavaflow;

TEST_CASE("exportable images: pixels written in one context are read in another, odd sizes and formats") {
  auto a = lftest::context_or_skip();
  auto b = lftest::ok(VulkanContext::create({.device = a.capabilities().identity.device_uuid}));
  for (auto fmt : {PixelFormat::Rgba8, PixelFormat::R8, PixelFormat::R32f, PixelFormat::Rgba16f}) {
    for (auto [w, h] : {std::pair{1u, 1u}, std::pair{333u, 77u}, std::pair{640u, 480u}}) {
      INFO(to_string(fmt) << " " << w << "x" << h);
      auto img = lftest::ok(GpuImage::allocate(a, {.width = w, .height = h, .format = fmt}));
      const auto px = lftest::pattern(img.descriptor().packed_size(), w * 31 + h);
      lftest::ok(upload_image(a, img, px));
      auto ex = lftest::ok(img.export_handle());
      auto round = lftest::ok(ImageDescriptor::deserialize(ex.descriptor.serialize()));
      CHECK(round.serialize() == ex.descriptor.serialize());
      auto imported = lftest::ok(GpuImage::import(b, round, std::move(ex.fd)));
      CHECK_FALSE(ex.fd.valid());
      std::vector<std::byte> back(px.size());
      lftest::ok(download_image(b, imported, back));
      CHECK(back == px);
    }
  }
}

TEST_CASE("image import refuses other devices, malformed descriptors and wrong sizes, keeping the fd") {
  auto a = lftest::context_or_skip();
  auto img = lftest::ok(GpuImage::allocate(a, {.width = 64, .height = 64}));
  auto ex = lftest::ok(img.export_handle());
  const int raw = ex.fd.get();
  auto d = ex.descriptor;
  d.device_uuid[3] ^= 1;
  CHECK(lftest::err(GpuImage::import(a, d, std::move(ex.fd))).code() == Errc::DeviceMismatch);
  CHECK(lftest::fd_is_open(raw));
  d = ex.descriptor;
  d.width = 0;
  CHECK(lftest::err(GpuImage::import(a, d, std::move(ex.fd))).code() == Errc::Malformed);
  d = ex.descriptor;
  d.allocation_size = 16;
  CHECK(lftest::err(GpuImage::import(a, d, std::move(ex.fd))).code() == Errc::Malformed);
  CHECK(ex.fd.get() == raw);
  // A memory file smaller than the image's allocation: refused before the driver maps it.
  UniqueFd small(::memfd_create("short-image", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(::ftruncate(small.get(), 64) == 0);
  auto e = lftest::err(GpuImage::import(a, ex.descriptor, std::move(small)));
  CHECK(e.code() == Errc::Malformed);
  CHECK(e.cause().find("does not match the allocation") != std::string::npos);
  auto bytes = ex.descriptor.serialize();
  for (std::size_t n = 0; n < bytes.size(); ++n) CHECK_FALSE(ImageDescriptor::deserialize(std::span(bytes).first(n)));
  bytes[6] = std::byte{9};  // unknown pixel format
  CHECK(lftest::err(ImageDescriptor::deserialize(bytes)).code() == Errc::Malformed);
  std::vector<std::byte> wrong(100);
  CHECK(lftest::err(upload_image(a, img, wrong)).code() == Errc::InvalidArgument);
}

TEST_CASE("imported memory can be handed on: export_handle of an imported buffer shares the same bytes") {
  auto a = lftest::context_or_skip();
  auto b = lftest::ok(VulkanContext::create({.device = a.capabilities().identity.device_uuid}));
  auto src = lftest::ok(GpuBuffer::allocate(a, {.size = 10007, .memory = GpuMemory::HostVisible}));
  auto ex = lftest::ok(src.export_handle());
  auto first = lftest::ok(GpuBuffer::import(b, ex.descriptor, std::move(ex.fd)));
  auto again = lftest::ok(first.export_handle());
  auto second = lftest::ok(GpuBuffer::import(a, again.descriptor, std::move(again.fd)));
  lftest::fill(src.bytes(), 5);
  CHECK(lftest::first_mismatch(second.bytes(), 5) == -1);
  const int before = lftest::steady_fds();
  for (int i = 0; i < 200; ++i) {
    auto e = lftest::ok(first.export_handle());
    auto imp = lftest::ok(GpuBuffer::import(a, e.descriptor, std::move(e.fd)));
  }
  CHECK(lftest::fds_settled(before) <= before);
}

TEST_CASE("shareable semaphores: timeline value crosses contexts, or a clear Unsupported naming the gap") {
  auto a = lftest::context_or_skip();
  auto b = lftest::ok(VulkanContext::create({.device = a.capabilities().identity.device_uuid}));
  auto sem = GpuSemaphore::create(a, SemaphoreKind::Timeline, 5);
  if (!sem) {
    CHECK(sem.error().code() == Errc::Unsupported);
    CHECK(sem.error().cause().find(a.capabilities().identity.name) != std::string::npos);
    lftest::skip("no exportable timeline semaphores on this device: " + sem.error().message());
  }
  CHECK(lftest::ok(sem->value()) == 5);
  auto fd = lftest::ok(sem->export_fd());
  auto imported = lftest::ok(GpuSemaphore::import(b, SemaphoreKind::Timeline, std::move(fd)));
  lftest::ok(sem->signal(9));
  lftest::ok(imported.wait(9, std::chrono::seconds(5)));
  CHECK(lftest::err(imported.wait(10, std::chrono::milliseconds(20))).code() == Errc::Timeout);
  lftest::ok(imported.signal(12));
  CHECK(lftest::ok(sem->value()) == 12);
  auto bin = lftest::ok(GpuSemaphore::create(a, SemaphoreKind::Binary));
  CHECK(lftest::err(bin.value()).code() == Errc::InvalidArgument);
}
