// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Where a process runs, and whether two processes can share node-local handles (Local) or must
/// move bytes (Remote). No global state: a location is a value the caller builds and passes on.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lavaflow/core/error.hpp"

namespace lavaflow {

using Uuid = std::array<std::uint8_t, 16>;

/// "0123abcd-..." form of a UUID.
[[nodiscard]] std::string to_string(const Uuid& uuid);

/// The identity of the host a process runs on. Two processes are on one host only when both
/// fields match; an empty boot id means "unknown".
struct HostIdentity {
  std::string hostname;
  std::string boot_id;  ///< /proc/sys/kernel/random/boot_id; changes with every boot

  /// Reads this machine's identity (uname + /proc). Tests and containers construct their own.
  [[nodiscard]] static Result<HostIdentity> detect();
  friend bool operator==(const HostIdentity&, const HostIdentity&) = default;
};

/// One Vulkan device as seen by a process: enough to decide whether a peer can import our memory.
struct DeviceIdentity {
  Uuid device_uuid{};
  Uuid driver_uuid{};
  std::string name;
  friend bool operator==(const DeviceIdentity& a, const DeviceIdentity& b) {
    return a.device_uuid == b.device_uuid && a.driver_uuid == b.driver_uuid;
  }
};

/// A process's location: host, pid, uid, its Vulkan devices and (in MPI jobs) its rank.
struct ProcessLocation {
  static constexpr std::uint32_t kMagic = 0x4c464c43;  // "CLFL"
  static constexpr std::uint16_t kVersion = 1;
  static constexpr std::size_t kMaxDevices = 64;
  static constexpr std::size_t kMaxString = 255;

  HostIdentity host;
  std::int32_t pid = 0;
  std::uint32_t uid = 0;
  std::vector<DeviceIdentity> devices;
  std::optional<std::int32_t> mpi_rank;

  /// This process on this host, with the given devices (from VulkanContext / enumerate).
  [[nodiscard]] static Result<ProcessLocation> current(std::vector<DeviceIdentity> devices = {});
  /// This process, with a host identity supplied by the caller (tests, containers).
  [[nodiscard]] static ProcessLocation current_with(HostIdentity host, std::vector<DeviceIdentity> devices = {});

  [[nodiscard]] std::vector<std::byte> serialize() const;
  /// Validates everything (magic, version, lengths, counts); malformed bytes are an Errc::Malformed.
  [[nodiscard]] static Result<ProcessLocation> deserialize(std::span<const std::byte> bytes);
};

enum class Scope : std::uint8_t { Local, Remote };
[[nodiscard]] std::string_view to_string(Scope s) noexcept;

struct ScopeDecision {
  Scope scope = Scope::Remote;
  std::string reason;
};

/// Local when hostname and boot id both match (and are known); Remote otherwise — including when
/// unsure. The reason says which fact decided.
[[nodiscard]] ScopeDecision detect_scope(const ProcessLocation& me, const ProcessLocation& peer);

/// The first device the two locations have in common (same device and driver UUID), if any.
[[nodiscard]] std::optional<DeviceIdentity> common_device(const ProcessLocation& a, const ProcessLocation& b);

}  // namespace lavaflow
