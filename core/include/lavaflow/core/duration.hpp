// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// How long a blocking call may wait — every blocking call in lava-flow takes a Duration — and
/// the one clock and deadline type that every wait measures with.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace lavaflow {

using Duration = std::chrono::nanoseconds;
inline constexpr Duration kForever = Duration::max();
/// The longest timeout that runs out: anything longer, kForever among them, never does.
inline constexpr Duration kLongestTimeout = std::chrono::hours(24 * 365);
/// Whether `timeout` never runs out.
[[nodiscard]] constexpr bool endless(Duration timeout) noexcept { return timeout > kLongestTimeout; }

/// The clock of every timeout and of message timestamps (CLOCK_MONOTONIC).
using Clock = std::chrono::steady_clock;

/// CLOCK_MONOTONIC in nanoseconds: message timestamps, comparable across processes of one host.
[[nodiscard]] inline std::uint64_t now_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

/// How a wait spends its time.
enum class WaitMode : std::uint8_t {
  BusyPoll,       ///< spin; lowest latency, burns a core
  Block,          ///< sleep at once (on a futex where the other side can wake it)
  SpinThenBlock,  ///< spin briefly, then sleep (default)
};

/// The moment a timeout runs out. An endless() one never does (and never overflows the clock).
class Deadline {
 public:
  explicit Deadline(Duration timeout, Clock::time_point now = Clock::now())
      : forever_(endless(timeout)),
        at_(forever_ ? Clock::time_point::max() : now + std::max(timeout, Duration::zero())) {}
  [[nodiscard]] bool forever() const { return forever_; }
  [[nodiscard]] bool passed(Clock::time_point now = Clock::now()) const { return !forever_ && now >= at_; }
  /// What is left of the timeout: kForever for a deadline that never passes.
  [[nodiscard]] Duration left(Clock::time_point now = Clock::now()) const {
    return forever_ ? kForever : std::max(Duration::zero(), Duration(at_ - now));
  }
  [[nodiscard]] Clock::time_point at() const { return at_; }

 private:
  bool forever_;
  Clock::time_point at_;
};

/// A Deadline that starts when it is first asked rather than when it is made: a call that needs
/// no wait never reads the clock (a clock read is a good share of a fast hand-off), and one that
/// waits starts its timeout a few tests late.
class LazyDeadline {
 public:
  explicit LazyDeadline(Duration timeout = kForever) : timeout_(timeout) {}
  [[nodiscard]] bool started() const { return started_; }
  /// The deadline, started `now` if it was not yet.
  [[nodiscard]] const Deadline& get(Clock::time_point now) {
    if (!started_) {
      at_ = Deadline(timeout_, now);
      started_ = true;
    }
    return at_;
  }
  [[nodiscard]] const Deadline& get() { return started_ ? at_ : get(Clock::now()); }
  [[nodiscard]] Duration left() { return get().left(); }
  [[nodiscard]] bool passed() { return get().passed(); }
  /// A zero (or negative) timeout, or a started deadline that has passed; reads no clock when
  /// not started.
  [[nodiscard]] bool none_left() { return started_ ? get().passed() : timeout_ <= Duration::zero(); }

 private:
  Duration timeout_;
  bool started_ = false;
  Deadline at_{kForever, Clock::time_point{}};
};

}  // namespace lavaflow
