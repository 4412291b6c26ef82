// SPDX-License-Identifier: MIT
#include "support.hpp"

using namespace lavaflow;

namespace {
ExportDescriptor sample() {
  ExportDescriptor d;
  d.kind = BufferKind::GpuDeviceLocal;
  d.dedicated = true;
  d.allocation_size = 8192;
  d.buffer_size = 4352;
  d.offset = 16;
  d.size = 4000;
  d.memory_type_index = 2;
  d.usage = 0x23;
  d.memory_flags = 1;
  d.device_uuid[3] = 7;
  d.driver_uuid[9] = 8;
  return d;
}
}  // namespace

TEST_CASE("ExportDescriptor round-trips") {
  const auto d = sample();
  const auto bytes = d.serialize();
  CHECK(bytes.size() == ExportDescriptor::kSerializedSize);
  auto e = lftest::ok(ExportDescriptor::deserialize(bytes));
  CHECK(e.kind == d.kind);
  CHECK(e.dedicated);
  CHECK(e.allocation_size == 8192);
  CHECK(e.buffer_size == 4352);
  CHECK(e.offset == 16);
  CHECK(e.size == 4000);
  CHECK(e.memory_type_index == 2);
  CHECK(e.usage == 0x23);
  CHECK(e.device_uuid == d.device_uuid);
  CHECK(e.driver_uuid == d.driver_uuid);
}

TEST_CASE("ExportDescriptor: truncated, wrong version, bad fields are clear errors") {
  const auto bytes = sample().serialize();
  for (std::size_t n = 0; n < bytes.size(); ++n)
    CHECK(lftest::err(ExportDescriptor::deserialize(std::span(bytes).first(n))).code() == Errc::Malformed);
  auto v = bytes;
  v[4] = std::byte{2};
  auto ver = lftest::err(ExportDescriptor::deserialize(v));
  CHECK(ver.code() == Errc::VersionMismatch);
  CHECK(ver.cause().find("version 2") != std::string::npos);

  auto d = sample();
  d.size = 0;
  CHECK(lftest::err(ExportDescriptor::deserialize(d.serialize())).cause().find("size is 0") != std::string::npos);
  d = sample();
  d.offset = 4000;  // 4000 + 4000 > 4352
  CHECK(lftest::err(ExportDescriptor::deserialize(d.serialize())).cause().find("exceeds") != std::string::npos);
  d = sample();
  d.offset = ~0ull;  // overflow attempt
  CHECK_FALSE(ExportDescriptor::deserialize(d.serialize()));
  d = sample();
  d.buffer_size = 10000;  // larger than the allocation
  CHECK_FALSE(ExportDescriptor::deserialize(d.serialize()));
  d = sample();
  d.kind = static_cast<BufferKind>(42);
  CHECK(lftest::err(ExportDescriptor::deserialize(d.serialize())).cause().find("unknown buffer kind") !=
        std::string::npos);
  auto flag = sample().serialize();
  flag[7] = std::byte{5};
  CHECK_FALSE(ExportDescriptor::deserialize(flag));
}
