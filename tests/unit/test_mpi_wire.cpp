// SPDX-License-Identifier: MIT
// The remote channels' message trailers (transports/mpi/src/wire.hpp), decoded without MPI:
// malformed trailers are refused with the cause, sequences are checked, nothing reads past the
// bytes received.
#include <cstring>
#include <vector>

#include "support.hpp"
#include "wire.hpp"

using namespace lavaflow::mpi::detail;

namespace {

std::vector<std::byte> message(std::size_t payload, const Trailer& t) {
  std::vector<std::byte> m(payload + t.length(), std::byte{0x5a});
  t.write(m.data() + payload);
  return m;
}

}  // namespace

TEST_CASE("MPI trailers: each form round-trips and carries its sequence") {
  const Trailer shorty{0, true, 77, 0, 0, 0};
  auto s = message(8, shorty);
  CHECK(s.size() == 10);
  auto back = Trailer::read(s);
  REQUIRE(back);
  CHECK(back->is_short);
  CHECK(back->is_sequence(77));
  CHECK(back->is_sequence(77 + kShortSeqMask + 1));  // the short form keeps the low 14 bits only
  CHECK_FALSE(back->is_sequence(78));

  const Trailer full{kHasTag | kHasTime, false, 123456789, 0, 42, 987654321};
  auto f = message(100, full);
  back = Trailer::read(f);
  REQUIRE(back);
  CHECK_FALSE(back->is_short);
  CHECK(back->tag == 42);
  CHECK(back->timestamp_ns == 987654321);
  CHECK(back->length() == full.length());
  CHECK(back->is_sequence(123456789));
}

TEST_CASE("MPI trailers: malformed, truncated or oversized messages are refused with the cause") {
  CHECK_FALSE(Trailer::read({}));
  std::vector<std::byte> one(1);
  CHECK(Trailer::read(one).error().find("shorter than a message trailer") != std::string::npos);

  // A short trailer behind more payload than the short form allows.
  auto big = message(kShortMax + 1, Trailer{0, true, 5, 0, 0, 0});
  CHECK(Trailer::read(big).error().find("before a short trailer") != std::string::npos);

  // Wrong magic, another wire version, unknown flags.
  auto f = message(16, Trailer{kHasTag, false, 9, 0, 1, 0});
  auto bad = f;
  bad.back() = std::byte{0x12};
  CHECK(Trailer::read(bad).error().find("magic") != std::string::npos);
  bad = f;
  bad[bad.size() - 2] = std::byte{0x03};  // version 3, 'L'
  CHECK(Trailer::read(bad).error().find("wire version") != std::string::npos);
  bad = f;
  bad[bad.size() - 4] = std::byte{0x80};  // flag bit 7: unknown
  CHECK(Trailer::read(bad).error().find("flags") != std::string::npos);

  // Every truncation of a full trailer with all fields: refused or decoded inside the bytes.
  auto all = message(0, Trailer{kChunked | kHasTag | kHasTime | (20u << 8), false, 1, 1 << 22, 2, 3});
  for (std::size_t n = 0; n < all.size(); ++n) {
    std::vector<std::byte> cut(all.begin(), all.begin() + static_cast<long>(n));
    if (auto t = Trailer::read(cut)) CHECK(t->length() <= n);
  }
}
