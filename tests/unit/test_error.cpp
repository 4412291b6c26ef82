// SPDX-License-Identifier: MIT
#include <cerrno>

#include "support.hpp"

using namespace lavaflow;

TEST_CASE("Error names the call, the cause and the class") {
  Error e(Errc::DeviceMismatch, "GpuBuffer::import", "UUID differs");
  CHECK(e.message() == "GpuBuffer::import: UUID differs [device mismatch]");
  CHECK(e.within("Channel::open").call() == "Channel::open > GpuBuffer::import");
}

TEST_CASE("errno is translated in one place") {
  CHECK(from_errno(ENOMEM, "mmap").code() == Errc::OutOfMemory);
  CHECK(from_errno(EPIPE, "sendmsg").code() == Errc::PeerLost);
  CHECK(from_errno(EACCES, "open").code() == Errc::PermissionDenied);
  auto e = from_errno(EBADF, "fstat", "fd 42");
  CHECK(e.call() == "fstat");
  CHECK(e.cause().find("fd 42") != std::string::npos);
  CHECK(e.cause().find("errno 9") != std::string::npos);
}

TEST_CASE("VkResult is translated in one place") {
  auto e = from_vk(VK_ERROR_OUT_OF_DEVICE_MEMORY, "vkAllocateMemory");
  CHECK(e.code() == Errc::OutOfMemory);
  CHECK(e.cause().find("OutOfDeviceMemory") != std::string::npos);
  CHECK(from_vk(VK_ERROR_INVALID_EXTERNAL_HANDLE, "vkAllocateMemory").code() == Errc::InvalidArgument);
  CHECK(from_vk(VK_ERROR_EXTENSION_NOT_PRESENT, "vkCreateDevice").code() == Errc::Unsupported);
}

TEST_CASE("LF_TRY propagates errors") {
  auto inner = [](bool good) -> Result<int> {
    if (good) return 7;
    return fail(Errc::NotFound, "inner", "nothing");
  };
  auto outer = [&](bool good) -> Result<int> {
    LF_TRY(int v, inner(good));
    return v + 1;
  };
  CHECK(*outer(true) == 8);
  CHECK(outer(false).error().code() == Errc::NotFound);
}
