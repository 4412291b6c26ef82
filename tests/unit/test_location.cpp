// SPDX-License-Identifier: MIT
#include "support.hpp"

using namespace lavaflow;

namespace {
ProcessLocation loc(std::string host, std::string boot) {
  return ProcessLocation::current_with(HostIdentity{std::move(host), std::move(boot)});
}
}  // namespace

TEST_CASE("this host is detected with hostname and boot id") {
  auto me = lftest::ok(ProcessLocation::current());
  CHECK_FALSE(me.host.hostname.empty());
  CHECK(me.host.boot_id.size() == 36);
  CHECK(me.pid == ::getpid());
  auto d = detect_scope(me, me);
  CHECK(d.scope == Scope::Local);
  CHECK(d.reason.find(me.host.hostname) != std::string::npos);
}

TEST_CASE("scope: local only when host and boot id match, remote when unsure") {
  CHECK(detect_scope(loc("a", "b1"), loc("a", "b1")).scope == Scope::Local);
  auto hosts = detect_scope(loc("a", "b1"), loc("c", "b1"));
  CHECK(hosts.scope == Scope::Remote);
  CHECK(hosts.reason.find("hostnames differ") != std::string::npos);
  auto boots = detect_scope(loc("a", "b1"), loc("a", "b2"));
  CHECK(boots.scope == Scope::Remote);
  CHECK(boots.reason.find("boot ids differ") != std::string::npos);
  CHECK(detect_scope(loc("a", ""), loc("a", "b1")).scope == Scope::Remote);
  CHECK(detect_scope(loc("", "b"), loc("", "b")).scope == Scope::Remote);
}

TEST_CASE("ProcessLocation round-trips through bytes") {
  auto a = loc("node-7", "1234");
  a.mpi_rank = 3;
  DeviceIdentity d;
  d.device_uuid[0] = 1;
  d.driver_uuid[15] = 2;
  d.name = "gpu";
  a.devices = {d, d};
  auto b = lftest::ok(ProcessLocation::deserialize(a.serialize()));
  CHECK(b.host == a.host);
  CHECK(b.pid == a.pid);
  CHECK(b.uid == a.uid);
  CHECK(b.mpi_rank == 3);
  REQUIRE(b.devices.size() == 2);
  CHECK(b.devices[0] == d);
  CHECK(b.devices[1].name == "gpu");
  CHECK(common_device(a, b).has_value());
  CHECK_FALSE(common_device(a, loc("x", "y")).has_value());
}

TEST_CASE("ProcessLocation rejects every truncation, bad magic, wrong version, trailing bytes") {
  auto a = loc("host", "boot");
  a.devices.push_back(DeviceIdentity{{}, {}, "dev"});
  const auto bytes = a.serialize();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto r = ProcessLocation::deserialize(std::span(bytes).first(n));
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == Errc::Malformed);
  }
  auto bad = bytes;
  bad[0] = std::byte{0};
  CHECK(lftest::err(ProcessLocation::deserialize(bad)).code() == Errc::Malformed);
  bad = bytes;
  bad[4] = std::byte{99};
  CHECK(lftest::err(ProcessLocation::deserialize(bad)).code() == Errc::VersionMismatch);
  bad = bytes;
  bad.push_back(std::byte{0});
  CHECK(lftest::err(ProcessLocation::deserialize(bad)).cause().find("trailing") != std::string::npos);
}

TEST_CASE("ProcessLocation survives random bytes without crashing") {
  std::uint64_t x = 42;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> junk(static_cast<std::size_t>(x % 200));
    for (auto& b : junk) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<std::byte>(x >> 56);
    }
    if (junk.size() >= 6) {  // valid header so the fields get parsed
      const std::uint32_t magic = ProcessLocation::kMagic;
      std::memcpy(junk.data(), &magic, 4);
      junk[4] = std::byte{1};
      junk[5] = std::byte{0};
    }
    (void)ProcessLocation::deserialize(junk);
  }
  SUCCEED();
}
