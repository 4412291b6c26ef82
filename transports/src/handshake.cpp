// SPDX-License-Identifier: MIT
#include "handshake.hpp"

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/wire.hpp"

namespace lavaflow::detail {
namespace {

constexpr std::size_t kMaxText = 1024;
// The Welcome's semaphore byte: which semaphore fds follow the ring buffers.
constexpr std::uint8_t kHasTimeline = 1;
constexpr std::uint8_t kHasReleaseTimeline = 2;
constexpr std::uint8_t kHasFlagBlock = 4;

wire::Writer start(MessageType t) {
  wire::Writer w;
  w.put(kHandshakeMagic);
  w.put(kHandshakeVersion);
  w.put(t);
  return w;
}

void put_blob(wire::Writer& w, const std::vector<std::byte>& b) {
  w.put(static_cast<std::uint32_t>(b.size()));
  for (auto x : b) w.put(static_cast<std::uint8_t>(x));
}

Result<std::vector<std::byte>> get_blob(wire::Reader& r, std::size_t max) {
  LF_TRY(auto n, r.get<std::uint32_t>());
  if (n > max || n > r.remaining())
    return fail(Errc::Malformed, "handshake",
                str_format("blob of {} bytes (limit {}, {} left)", n, max, r.remaining()));
  std::vector<std::byte> out(n);
  for (auto& b : out) {
    LF_TRY(auto v, r.get<std::uint8_t>());
    b = static_cast<std::byte>(v);
  }
  return out;
}

}  // namespace

std::vector<std::byte> encode(const Hello& m) {
  auto w = start(MessageType::Hello);
  put_blob(w, m.location.serialize());
  return std::move(w).take();
}

std::vector<std::byte> encode(const Welcome& m) {
  auto w = start(MessageType::Welcome);
  w.put(m.consumer_index);
  w.put(m.slots);
  w.put(m.slot_size);
  w.put(m.producer_pid);
  w.put_string(m.transport.substr(0, 64));
  w.put_string(m.route_reason.substr(0, kMaxText));
  w.put(static_cast<std::uint8_t>((m.timeline ? kHasTimeline : 0) | (m.release_timeline ? kHasReleaseTimeline : 0) |
                                  (m.flag_block ? kHasFlagBlock : 0)));
  put_blob(w, m.control.serialize());
  for (const auto& d : m.ring) put_blob(w, d.serialize());
  if (m.flag_block) {
    put_blob(w, m.flag_block->serialize());
    put_blob(w, m.release_block.value_or(ExportDescriptor{}).serialize());
    w.put(m.release_offset);
  }
  return std::move(w).take();
}

std::vector<std::byte> encode(const Refuse& m) {
  auto w = start(MessageType::Refuse);
  w.put_string(m.reason.substr(0, kMaxText));
  return std::move(w).take();
}

Result<Handshake> decode(std::span<const std::byte> bytes, std::size_t fd_count) {
  constexpr const char* call = "channel handshake";
  wire::Reader r(bytes, call);
  LF_TRY(auto magic, r.get<std::uint32_t>());
  if (magic != kHandshakeMagic)
    return fail(Errc::Malformed, call, str_format("bad magic {:#x}: not a lava-flow channel", magic));
  LF_TRY(auto version, r.get<std::uint16_t>());
  if (version != kHandshakeVersion)
    return fail(Errc::VersionMismatch, call,
                str_format("peer speaks handshake version {}, this build {}", version, kHandshakeVersion));
  LF_TRY(auto type, r.get<std::uint8_t>());
  auto expect_fds = [&](std::size_t n) -> Status {
    if (fd_count != n)
      return fail(Errc::Malformed, call, str_format("message carries {} fds, expected {}", fd_count, n));
    return {};
  };
  switch (static_cast<MessageType>(type)) {
    case MessageType::Hello: {
      LF_TRY_STATUS(expect_fds(0));
      LF_TRY(auto blob, get_blob(r, 64 * 1024));
      LF_TRY(auto loc, ProcessLocation::deserialize(blob));
      LF_TRY_STATUS(r.expect_end());
      return Hello{std::move(loc)};
    }
    case MessageType::Welcome: {
      Welcome m;
      LF_TRY(m.consumer_index, r.get<std::uint32_t>());
      LF_TRY(m.slots, r.get<std::uint32_t>());
      LF_TRY(m.slot_size, r.get<std::uint64_t>());
      LF_TRY(m.producer_pid, r.get<std::int32_t>());
      if (m.consumer_index >= kMaxConsumers)
        return fail(Errc::Malformed, call, str_format("consumer index {} out of range", m.consumer_index));
      if (m.slots == 0 || m.slots > kMaxSlots)
        return fail(Errc::Malformed, call, str_format("{} slots out of range", m.slots));
      if (m.slot_size == 0 || m.slot_size > kMaxSlotSize)
        return fail(Errc::Malformed, call, str_format("slot size {} out of range", m.slot_size));
      LF_TRY(m.transport, r.get_string(64));
      LF_TRY(m.route_reason, r.get_string(kMaxText));
      LF_TRY(auto sems, r.get<std::uint8_t>());
      if ((sems & ~(kHasTimeline | kHasReleaseTimeline | kHasFlagBlock)) != 0)
        return fail(Errc::Malformed, call, str_format("unknown semaphore flags {:#x}", sems));
      m.timeline = (sems & kHasTimeline) != 0;
      m.release_timeline = (sems & kHasReleaseTimeline) != 0;
      const bool flags = (sems & kHasFlagBlock) != 0;
      if (m.release_timeline && !m.timeline)
        return fail(Errc::Malformed, call, "a release timeline without the channel's timeline");
      if (flags && m.timeline) return fail(Errc::Malformed, call, "both a timeline and a flag block");
      LF_TRY_STATUS(expect_fds(1 + m.slots + (m.timeline ? 1 : 0) + (m.release_timeline ? 1 : 0) + (flags ? 2 : 0)));
      LF_TRY(auto cblob, get_blob(r, ExportDescriptor::kSerializedSize));
      LF_TRY(m.control, ExportDescriptor::deserialize(cblob));
      if (is_gpu(m.control.kind)) return fail(Errc::Malformed, call, "control block is not CPU shared memory");
      for (std::uint32_t i = 0; i < m.slots; ++i) {
        LF_TRY(auto blob, get_blob(r, ExportDescriptor::kSerializedSize));
        LF_TRY(auto d, ExportDescriptor::deserialize(blob));
        if (d.size < m.slot_size)
          return fail(Errc::Malformed, call,
                      str_format("ring buffer {} has {} bytes, slots are {}", i, d.size, m.slot_size));
        m.ring.push_back(d);
      }
      if (flags) {
        LF_TRY(auto blob, get_blob(r, ExportDescriptor::kSerializedSize));
        LF_TRY(auto d, ExportDescriptor::deserialize(blob));
        if (!is_gpu(d.kind)) return fail(Errc::Malformed, call, "the flag block is not GPU memory");
        if (d.size < kFlagBlockSize)
          return fail(Errc::Malformed, call,
                      str_format("the flag block has {} bytes, {} needed", d.size, kFlagBlockSize));
        m.flag_block = d;
        LF_TRY(auto rblob, get_blob(r, ExportDescriptor::kSerializedSize));
        LF_TRY(auto rd, ExportDescriptor::deserialize(rblob));
        if (!is_gpu(rd.kind)) return fail(Errc::Malformed, call, "the release block is not GPU memory");
        LF_TRY(m.release_offset, r.get<std::uint64_t>());
        if (m.release_offset % kFlagStride != 0 || m.release_offset >= rd.size || rd.size - m.release_offset < 8)
          return fail(Errc::Malformed, call,
                      str_format("release counter at offset {} is not an aligned word of the {}-byte release block",
                                 m.release_offset, rd.size));
        m.release_block = rd;
      }
      LF_TRY_STATUS(r.expect_end());
      return m;
    }
    case MessageType::Refuse: {
      LF_TRY_STATUS(expect_fds(0));
      LF_TRY(auto reason, r.get_string(kMaxText));
      LF_TRY_STATUS(r.expect_end());
      return Refuse{std::move(reason)};
    }
  }
  return fail(Errc::Malformed, call, str_format("unknown message type {}", type));
}

}  // namespace lavaflow::detail
