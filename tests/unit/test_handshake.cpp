// SPDX-License-Identifier: MIT
#include "handshake.hpp"
#include "support.hpp"

using namespace lavaflow;
using namespace lavaflow::detail;

namespace {
Welcome sample() {
  Welcome w;
  w.consumer_index = 3;
  w.slots = 2;
  w.slot_size = 4096;
  w.producer_pid = 42;
  w.transport = "shm";
  w.route_reason = "same host";
  w.control.kind = BufferKind::CpuShared;
  w.control.allocation_size = w.control.buffer_size = w.control.size = 8192;
  for (int i = 0; i < 2; ++i) {
    ExportDescriptor d;
    d.kind = BufferKind::CpuShared;
    d.allocation_size = d.buffer_size = d.size = 4096;
    w.ring.push_back(d);
  }
  return w;
}
}  // namespace

TEST_CASE("handshake messages round-trip") {
  auto hello = lftest::ok(decode(encode(Hello{ProcessLocation::current_with({"h", "b"})}), 0));
  CHECK(std::get<Hello>(hello).location.host.hostname == "h");
  auto w = std::get<Welcome>(lftest::ok(decode(encode(sample()), 3)));
  CHECK(w.consumer_index == 3);
  CHECK(w.ring.size() == 2);
  CHECK(w.transport == "shm");
  CHECK(std::get<Refuse>(lftest::ok(decode(encode(Refuse{"go away"}), 0))).reason == "go away");
}

TEST_CASE("handshake decoder refuses wrong fd counts, bad geometry, truncation and junk") {
  const auto bytes = encode(sample());
  CHECK(lftest::err(decode(bytes, 2)).cause().find("carries 2 fds, expected 3") != std::string::npos);
  CHECK_FALSE(decode(encode(Refuse{"x"}), 1));
  for (std::size_t n = 0; n < bytes.size(); ++n) CHECK_FALSE(decode(std::span(bytes).first(n), 3));
  auto w = sample();
  w.slots = 63;
  CHECK(lftest::err(decode(encode(w), 64)).cause().find("slots out of range") != std::string::npos);
  w = sample();
  w.ring[1].size = 100;  // smaller than a slot
  w.ring[1].buffer_size = w.ring[1].allocation_size = 100;
  CHECK(lftest::err(decode(encode(w), 3)).code() == Errc::Malformed);
  w = sample();
  w.consumer_index = 99;
  CHECK_FALSE(decode(encode(w), 3));
  auto v = bytes;
  v[4] = std::byte{9};
  CHECK(lftest::err(decode(v, 3)).code() == Errc::VersionMismatch);
  auto t = bytes;
  t[6] = std::byte{77};
  CHECK(lftest::err(decode(t, 3)).cause().find("unknown message type") != std::string::npos);
}

TEST_CASE("handshake: a flag channel's blocks are two more fds, GPU memory of their size, never beside a timeline") {
  auto w = sample();
  ExportDescriptor block;
  block.kind = BufferKind::GpuHostVisible;
  block.allocation_size = block.buffer_size = block.size = kFlagBlockSize;
  w.flag_block = block;
  ExportDescriptor release = block;
  release.allocation_size = release.buffer_size = release.size = kReleaseBlockSize;
  w.release_block = release;
  w.release_offset = 2 * kFlagStride;
  auto back = std::get<Welcome>(lftest::ok(decode(encode(w), 5)));
  REQUIRE(back.flag_block.has_value());
  REQUIRE(back.release_block.has_value());
  CHECK(back.flag_block->size == kFlagBlockSize);
  CHECK(back.release_block->size == kReleaseBlockSize);
  CHECK(back.release_offset == 2 * kFlagStride);
  CHECK(lftest::err(decode(encode(w), 4)).cause().find("expected 5") != std::string::npos);
  auto both = w;
  both.timeline = true;
  CHECK(lftest::err(decode(encode(both), 6)).cause().find("both a timeline and a flag block") != std::string::npos);
  auto cpu = w;
  cpu.flag_block->kind = BufferKind::CpuShared;
  CHECK(lftest::err(decode(encode(cpu), 5)).cause().find("not GPU memory") != std::string::npos);
  auto cpu_release = w;
  cpu_release.release_block->kind = BufferKind::CpuShared;
  CHECK(lftest::err(decode(encode(cpu_release), 5)).cause().find("release block is not GPU memory") !=
        std::string::npos);
  auto small = w;
  small.flag_block->size = small.flag_block->buffer_size = small.flag_block->allocation_size = 32;
  CHECK(lftest::err(decode(encode(small), 5)).cause().find("the flag block has 32 bytes") != std::string::npos);
  for (const std::uint64_t bad : {std::uint64_t{8}, kReleaseBlockSize, ~std::uint64_t{0} - 63}) {
    auto off = w;
    off.release_offset = bad;
    CHECK(lftest::err(decode(encode(off), 5)).cause().find("not an aligned word") != std::string::npos);
  }
}
