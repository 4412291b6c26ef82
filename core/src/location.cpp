// SPDX-License-Identifier: MIT
#include "lavaflow/core/location.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/wire.hpp"

namespace lavaflow {

std::string to_string(const Uuid& u) {
  std::string s;
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += str_format("{:02x}", u[i]);
  }
  return s;
}

std::string_view to_string(Scope s) noexcept { return s == Scope::Local ? "local" : "remote"; }

Result<HostIdentity> HostIdentity::detect() {
  utsname u{};
  if (::uname(&u) != 0) return std::unexpected(from_errno(errno, "uname"));
  HostIdentity id{u.nodename, {}};
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, id.boot_id);  // stays empty (unknown) when /proc is not there
  return id;
}

ProcessLocation ProcessLocation::current_with(HostIdentity host, std::vector<DeviceIdentity> devices) {
  ProcessLocation loc;
  loc.host = std::move(host);
  loc.pid = static_cast<std::int32_t>(::getpid());
  loc.uid = ::getuid();
  loc.devices = std::move(devices);
  return loc;
}

Result<ProcessLocation> ProcessLocation::current(std::vector<DeviceIdentity> devices) {
  LF_TRY(HostIdentity host, HostIdentity::detect());
  return current_with(std::move(host), std::move(devices));
}

std::vector<std::byte> ProcessLocation::serialize() const {
  wire::Writer w;
  w.put(kMagic);
  w.put(kVersion);
  w.put_string(host.hostname.substr(0, kMaxString));
  w.put_string(host.boot_id.substr(0, kMaxString));
  w.put(pid);
  w.put(uid);
  w.put(static_cast<std::uint8_t>(mpi_rank.has_value()));
  w.put(mpi_rank.value_or(-1));
  const auto n = std::min(devices.size(), kMaxDevices);
  w.put(static_cast<std::uint16_t>(n));
  for (std::size_t i = 0; i < n; ++i) {
    w.put(devices[i].device_uuid);
    w.put(devices[i].driver_uuid);
    w.put_string(devices[i].name.substr(0, kMaxString));
  }
  return std::move(w).take();
}

Result<ProcessLocation> ProcessLocation::deserialize(std::span<const std::byte> bytes) {
  wire::Reader r(bytes, "ProcessLocation::deserialize");
  LF_TRY(auto magic, r.get<std::uint32_t>());
  if (magic != kMagic)
    return fail(Errc::Malformed, "ProcessLocation::deserialize", str_format("bad magic {:#x}", magic));
  LF_TRY(auto version, r.get<std::uint16_t>());
  if (version != kVersion)
    return fail(Errc::VersionMismatch, "ProcessLocation::deserialize",
                str_format("format version {}, this build reads version {}", version, kVersion));
  ProcessLocation loc;
  LF_TRY(loc.host.hostname, r.get_string(kMaxString));
  LF_TRY(loc.host.boot_id, r.get_string(kMaxString));
  LF_TRY(loc.pid, r.get<std::int32_t>());
  LF_TRY(loc.uid, r.get<std::uint32_t>());
  LF_TRY(auto has_rank, r.get<std::uint8_t>());
  LF_TRY(auto rank, r.get<std::int32_t>());
  if (has_rank > 1) return fail(Errc::Malformed, "ProcessLocation::deserialize", "bad rank flag");
  if (has_rank) loc.mpi_rank = rank;
  LF_TRY(auto n, r.get<std::uint16_t>());
  if (n > kMaxDevices)
    return fail(Errc::Malformed, "ProcessLocation::deserialize", str_format("{} devices exceeds limit", n));
  for (std::uint16_t i = 0; i < n; ++i) {
    DeviceIdentity d;
    LF_TRY_STATUS(r.get(d.device_uuid));
    LF_TRY_STATUS(r.get(d.driver_uuid));
    LF_TRY(d.name, r.get_string(kMaxString));
    loc.devices.push_back(std::move(d));
  }
  LF_TRY_STATUS(r.expect_end());
  return loc;
}

ScopeDecision detect_scope(const ProcessLocation& me, const ProcessLocation& peer) {
  const auto& a = me.host;
  const auto& b = peer.host;
  if (a.hostname.empty() || b.hostname.empty()) return {Scope::Remote, "a hostname is unknown; assuming remote"};
  if (a.hostname != b.hostname)
    return {Scope::Remote, str_format("hostnames differ ({} vs {})", a.hostname, b.hostname)};
  if (a.boot_id.empty() || b.boot_id.empty())
    return {Scope::Remote, str_format("same hostname {} but a boot id is unknown; assuming remote", a.hostname)};
  if (a.boot_id != b.boot_id)
    return {Scope::Remote,
            str_format("same hostname {} but kernel boot ids differ (different machines or a reboot)", a.hostname)};
  return {Scope::Local, str_format("same host {} and kernel boot id", a.hostname)};
}

std::optional<DeviceIdentity> common_device(const ProcessLocation& a, const ProcessLocation& b) {
  for (const auto& d : a.devices)
    for (const auto& e : b.devices)
      if (d == e) return d;
  return std::nullopt;
}

}  // namespace lavaflow
