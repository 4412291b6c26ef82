// SPDX-License-Identifier: MIT
#include <sys/mman.h>

#include "support.hpp"

using namespace lavaflow;

TEST_CASE("UniqueFd closes once, moves ownership, releases on request") {
  const int before = lftest::open_fds();
  int raw;
  {
    UniqueFd a(::memfd_create("t", MFD_CLOEXEC));
    raw = a.get();
    REQUIRE(lftest::fd_is_open(raw));
    UniqueFd b = std::move(a);
    CHECK_FALSE(a.valid());
    CHECK(b.get() == raw);
    auto c = lftest::ok(b.dup());
    CHECK(c.get() != raw);
    CHECK(lftest::open_fds() == before + 2);
  }
  CHECK_FALSE(lftest::fd_is_open(raw));
  CHECK(lftest::open_fds() == before);

  UniqueFd d(::memfd_create("t", MFD_CLOEXEC));
  int released = d.release();
  CHECK_FALSE(d.valid());
  CHECK(lftest::fd_is_open(released));
  ::close(released);
  CHECK(lftest::err(UniqueFd().dup()).code() == Errc::InvalidArgument);
}
