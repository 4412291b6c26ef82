// SPDX-License-Identifier: MIT
#include "lavaflow/core/error.hpp"

#include <cerrno>
#include <cstring>
#include <vulkan/vulkan.hpp>

#include "lavaflow/core/detail/format.hpp"

namespace lavaflow {

std::string_view to_string(Errc code) noexcept {
  switch (code) {
    case Errc::InvalidArgument:
      return "invalid argument";
    case Errc::Malformed:
      return "malformed input";
    case Errc::VersionMismatch:
      return "version mismatch";
    case Errc::DeviceMismatch:
      return "device mismatch";
    case Errc::Unsupported:
      return "unsupported";
    case Errc::OutOfMemory:
      return "out of memory";
    case Errc::NotFound:
      return "not found";
    case Errc::Timeout:
      return "timeout";
    case Errc::WouldBlock:
      return "would block";
    case Errc::PeerLost:
      return "peer lost";
    case Errc::PermissionDenied:
      return "permission denied";
    case Errc::Unreachable:
      return "unreachable";
    case Errc::System:
      return "system error";
    case Errc::Driver:
      return "driver error";
    case Errc::Internal:
      return "internal error";
  }
  return "unknown";
}

std::string Error::message() const { return str_format("{}: {} [{}]", call_, cause_, to_string(code_)); }

Error Error::within(std::string_view outer) const { return Error(code_, str_format("{} > {}", outer, call_), cause_); }

Error from_errno(int err, std::string call, std::string_view detail) {
  Errc code = Errc::System;
  switch (err) {
    case EINVAL:
      code = Errc::InvalidArgument;
      break;
    case ENOMEM:
      code = Errc::OutOfMemory;
      break;
    case ENOENT:
    case ESRCH:
      code = Errc::NotFound;
      break;
    case ETIMEDOUT:
      code = Errc::Timeout;
      break;
    case EAGAIN:
      code = Errc::WouldBlock;
      break;
    case EPIPE:
    case ECONNRESET:
    case ECONNREFUSED:
    case ENOTCONN:
      code = Errc::PeerLost;
      break;
    case EACCES:
    case EPERM:
      code = Errc::PermissionDenied;
      break;
    case EBADF:
      code = Errc::InvalidArgument;
      break;
    case ENOSYS:
    case EOPNOTSUPP:
      code = Errc::Unsupported;
      break;
    default:
      break;
  }
  char buf[128];
  const char* text = strerror_r(err, buf, sizeof buf);  // GNU variant
  std::string cause =
      detail.empty() ? str_format("{} (errno {})", text, err) : str_format("{}: {} (errno {})", detail, text, err);
  return Error(code, std::move(call), std::move(cause));
}

Error from_vk(std::int32_t vk_result, std::string call, std::string_view detail) {
  const auto r = static_cast<VkResult>(vk_result);
  Errc code = Errc::Driver;
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
      code = Errc::OutOfMemory;
      break;
    case VK_ERROR_INVALID_EXTERNAL_HANDLE:
      code = Errc::InvalidArgument;
      break;
    case VK_ERROR_EXTENSION_NOT_PRESENT:
    case VK_ERROR_FEATURE_NOT_PRESENT:
    case VK_ERROR_FORMAT_NOT_SUPPORTED:
    case VK_ERROR_INCOMPATIBLE_DRIVER:
      code = Errc::Unsupported;
      break;
    case VK_ERROR_DEVICE_LOST:
      code = Errc::Driver;
      break;
    case VK_TIMEOUT:
      code = Errc::Timeout;
      break;
    default:
      break;
  }
  std::string name = vk::to_string(static_cast<vk::Result>(r));
  std::string cause = detail.empty() ? name : str_format("{}: {}", detail, name);
  return Error(code, std::move(call), std::move(cause));
}

}  // namespace lavaflow
