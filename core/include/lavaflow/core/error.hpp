// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The one error model of lava-flow: every fallible call returns `Result<T>`, i.e.
/// `std::expected<T, Error>`. An Error names the failing call and the cause. Foreign codes
/// (errno, VkResult) are translated in exactly one place each (`from_errno`, `from_vk`).

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace lavaflow {

/// Broad class of a failure, stable enough to branch on.
enum class Errc : std::uint8_t {
  InvalidArgument,   ///< caller passed a bad value (size, index, option)
  Malformed,         ///< bytes from outside (socket, shared memory, file) failed validation
  VersionMismatch,   ///< descriptor / wire format of another version
  DeviceMismatch,    ///< handle comes from another device or driver than the importer
  Unsupported,       ///< the driver, device or machine lacks what is needed
  OutOfMemory,       ///< host or device memory exhausted
  NotFound,          ///< no such device, name, peer
  Timeout,           ///< a bounded wait ran out
  WouldBlock,        ///< a non-blocking call could not proceed
  PeerLost,          ///< the other process died or hung up
  PermissionDenied,  ///< peer of another uid, or OS refused
  Unreachable,       ///< peer is on another host for a node-local mechanism
  System,            ///< an OS call failed (see message for errno)
  Driver,            ///< a graphics/compute driver call failed
  Internal,          ///< a bug in lava-flow
};

/// Human-readable name of an error class.
[[nodiscard]] std::string_view to_string(Errc code) noexcept;

/// A failure: what kind, which call failed, and why.
class Error {
 public:
  Error(Errc code, std::string call, std::string cause)
      : code_(code), call_(std::move(call)), cause_(std::move(cause)) {}

  [[nodiscard]] Errc code() const noexcept { return code_; }
  /// The API or system call that failed, e.g. "vkAllocateMemory" or "GpuBuffer::import".
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  /// Why it failed, in words.
  [[nodiscard]] const std::string& cause() const noexcept { return cause_; }
  /// "call: cause [code]".
  [[nodiscard]] std::string message() const;

  /// Prefixes the call with the context it happened in ("GpuBuffer::import > vkAllocateMemory").
  [[nodiscard]] Error within(std::string_view outer) const;

 private:
  Errc code_;
  std::string call_;
  std::string cause_;
};

template <class T>
using Result = std::expected<T, Error>;
using Status = std::expected<void, Error>;

/// Builds an unexpected Error in one expression: `return fail(Errc::InvalidArgument, "f", "why");`
[[nodiscard]] inline std::unexpected<Error> fail(Errc code, std::string call, std::string cause) {
  return std::unexpected(Error(code, std::move(call), std::move(cause)));
}

/// Translates an errno value (the only place errno becomes an Error).
[[nodiscard]] Error from_errno(int err, std::string call, std::string_view detail = {});

/// Translates a VkResult value (the only place VkResult becomes an Error).
[[nodiscard]] Error from_vk(std::int32_t vk_result, std::string call, std::string_view detail = {});

}  // namespace lavaflow

/// Propagates an error from a Result/Status expression: `LF_TRY(auto x, f());` or `LF_TRY_STATUS(g());`
#define LF_CONCAT_INNER(a, b) a##b
#define LF_CONCAT(a, b) LF_CONCAT_INNER(a, b)
#define LF_TRY(decl, expr) LF_TRY_IMPL(LF_CONCAT(lf_try_, __LINE__), decl, expr)
#define LF_TRY_IMPL(tmp, decl, expr)                        \
  auto tmp = (expr);                                        \
  if (!tmp) return std::unexpected(std::move(tmp).error()); \
  decl = std::move(*tmp)
#define LF_TRY_STATUS(expr)                                                         \
  do {                                                                              \
    auto lf_try_status_ = (expr);                                                   \
    if (!lf_try_status_) return std::unexpected(std::move(lf_try_status_).error()); \
  } while (0)
