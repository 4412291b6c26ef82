// SPDX-License-Identifier: MIT
// libFuzzer target for the remote channels' wire format: the trailer that ends every message a
// peer rank sends. Trailer::read may refuse input; it must never crash or read out of bounds, and
// what it accepts must be consistent with the bytes received: a trailer no longer than the
// message, a short form only behind at most kShortMax payload bytes, known flags only, an end
// marker alone, and a
// re-encoding that reads back the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "wire.hpp"

using namespace lavaflow::mpi::detail;

namespace {

bool same(const Trailer& a, const Trailer& b) {
  return a.is_short == b.is_short && a.flags == b.flags && a.seq == b.seq && a.total == b.total && a.tag == b.tag &&
         a.timestamp_ns == b.timestamp_ns;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 8) return 0;
  std::uint64_t expected = 0;
  std::memcpy(&expected, data, 8);
  // Exactly the received bytes, in a buffer of their own: any read past them is caught.
  const std::vector<std::byte> msg(reinterpret_cast<const std::byte*>(data + 8),
                                   reinterpret_cast<const std::byte*>(data + size));
  auto t = Trailer::read(msg);
  if (!t) return 0;
  if (t->length() > msg.size()) std::abort();
  if (t->is_short && (t->flags != 0 || msg.size() - 2 > kShortMax || t->seq > kShortSeqMask)) std::abort();
  if (!t->is_short && (t->flags & ~0x3F0Fu) != 0) std::abort();
  // An end marker stands alone: its incarnation in the tag field, no payload, no other flag.
  if ((t->flags & kEnd) != 0 && (t->flags != (kEnd | kHasTag) || msg.size() != t->length())) std::abort();
  (void)t->is_sequence(expected);
  // The producer's encoding of what was accepted reads back the same.
  std::vector<std::byte> again(t->length());
  t->write(again.data());
  auto back = Trailer::read(again);
  if (!back || !same(*back, *t)) std::abort();
  return 0;
}
