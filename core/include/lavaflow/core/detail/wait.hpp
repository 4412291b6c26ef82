// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The one wait loop of lava-flow (internal): every call that waits for a condition — a message,
/// room in a ring, an MPI request, a GPU counter, a consumer to attach — waits through wait_for(),
/// which spins, then sleeps, with one clock and one Deadline. What differs between the waits is
/// data: how often the clock is read while spinning, how long to spin, what stops a wait early,
/// and how to sleep (a futex that the other side wakes, or a nap when nothing can wake the waiter).
#include <time.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "lavaflow/core/duration.hpp"
#include "lavaflow/core/error.hpp"

namespace lavaflow::detail {

/// A pause between two tests of a cache line another core writes (it spares the writer's line).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// BusyPoll waits test this many times before they start pausing between tests: a pause takes
/// longer than a hand-off on recent cores, so pausing sooner would add one to most hand-offs.
inline constexpr std::uint64_t kSpinsWithoutPause = 4096;

/// Paused tests between clock reads, at most (see wait_for).
inline constexpr std::uint64_t kPausedTestsPerClock = 64;

/// How the spinning part of a wait goes.
struct SpinPlan {
  /// Tests between clock reads while spinning (rounded up to a power of two). A clock read costs as much as a
  /// fast hand-off: a cheap test reads the clock rarely, an expensive one (an MPI_Test) often.
  std::uint64_t clock_every = 64;
  bool relax = true;  ///< pause between tests (see kSpinsWithoutPause)
  /// SpinThenBlock: spin this long before sleeping.
  Duration spin_for = std::chrono::microseconds(20);
  /// How often stop() runs while spinning (zero: at every clock read); it runs before every sleep.
  Duration check_every = Duration::zero();
  /// Tests the caller made before this wait, without pausing (an inline spin): they count towards
  /// kSpinsWithoutPause and the first clock read.
  std::uint64_t tests_done = 0;
};

/// A sleeper that nothing wakes: naps of at most `nap`, then the condition is tested again.
struct Nap {
  Duration nap;
  struct Token {};
  [[nodiscard]] Token arm() const { return {}; }
  void disarm(Token) const {}
  void sleep(Token, Duration left) const {
    const auto d = std::min(nap, left);
    timespec ts{static_cast<time_t>(d.count() / 1'000'000'000), static_cast<long>(d.count() % 1'000'000'000)};
    ::nanosleep(&ts, nullptr);
  }
};

/// A sleeper for waits that share cores with their peers (more ranks than cores): it gives the
/// core away `yields` times, then naps.
struct YieldThenNap {
  std::uint64_t yields;
  Duration nap;
  std::uint64_t given = 0;
  struct Token {};
  [[nodiscard]] Token arm() const { return {}; }
  void disarm(Token) const {}
  void sleep(Token, Duration left) {
    if (given++ < yields)
      std::this_thread::yield();
    else
      Nap{nap}.sleep({}, left);
  }
};

/// Nothing stops the wait early.
inline Result<bool> never_stop() { return false; }

/// Waits until `ready()` holds, at most `timeout`.
/// - ready(): bool, or Result<bool> (an error ends the wait with it).
/// - stop(): Result<bool>; an error ends the wait with it (a peer is gone), true ends it as if
///   ready (a last test after noticing a peer's exit found what it waited for). It runs every
///   plan.check_every (zero: at every clock read and before every sleep); with a zero timeout,
///   once, unless plan.check_every says it is not cheap.
/// - sleeper: arm() returns a token, then sleep(token, left) or disarm(token). The condition is
///   tested after arm(), so a wake-up between that test and the sleep is not lost.
/// - on_timeout(): the Error to return when the deadline passes.
/// The deadline starts at the first clock read (a LazyDeadline): a wait whose condition holds at
/// once, or within a few tests, reads no clock.
/// The deadline may be one the caller started already, or will go on using afterwards.
template <class Ready, class Stop, class Sleeper, class OnTimeout>
Status wait_for(Ready&& ready, Stop&& stop, Sleeper&& sleeper, WaitMode mode, LazyDeadline& deadline,
                const SpinPlan& plan, OnTimeout&& on_timeout) {
  std::optional<Error> failed;
  auto test = [&]() -> bool {
    if constexpr (std::is_same_v<std::decay_t<decltype(ready())>, bool>) {
      return ready();
    } else {
      auto r = ready();
      if (!r) {
        failed = std::move(r.error());
        return true;
      }
      return *r;
    }
  };
  auto done = [&]() -> Status {
    if (failed) return std::unexpected(std::move(*failed));
    return {};
  };
  // An error or an early end from stop(), else nothing.
  auto stopped = [&]() -> std::optional<Status> {
    auto s = stop();
    if (!s) return Status(std::unexpected(std::move(s.error())));
    if (*s) return Status{};
    return std::nullopt;
  };
  auto timed_out = [&]() -> Status { return std::unexpected(Error(on_timeout())); };

  if (test()) return done();
  if (deadline.none_left()) {
    if (plan.check_every == Duration::zero())
      if (auto s = stopped()) return *s;
    return timed_out();
  }
  // The spin's own start: the deadline may have been started by the caller before this wait.
  Clock::time_point start{}, checked{};
  bool clock_read = false;
  const std::uint64_t every = std::bit_ceil(std::max<std::uint64_t>(plan.clock_every, 1));
  // A paused test takes as long as a clock read or longer: once tests pause, the clock comes round
  // at least every kPausedTestsPerClock of them, so that a short timeout ends near its time.
  const std::uint64_t paused_every = std::min(every, kPausedTestsPerClock);
  if (mode != WaitMode::Block) {
    for (std::uint64_t i = plan.tests_done + 1;; ++i) {
      if (test()) return done();
      const bool pausing = plan.relax && (mode != WaitMode::BusyPoll || i >= kSpinsWithoutPause);
      if (pausing) cpu_relax();
      if ((i & ((pausing ? paused_every : every) - 1)) != 0) continue;
      const auto now = Clock::now();
      if (!clock_read) {
        start = checked = now;
        clock_read = true;
      }
      if (now - checked >= plan.check_every) {
        checked = now;
        if (auto s = stopped()) return *s;
      }
      if (deadline.get(now).passed(now)) return timed_out();
      if (mode == WaitMode::SpinThenBlock && now - start >= plan.spin_for) break;
    }
  }
  for (;;) {
    auto token = sleeper.arm();
    if (test()) {
      sleeper.disarm(token);
      return done();
    }
    const auto now = Clock::now();
    if (now - checked >= plan.check_every) {
      checked = now;
      if (auto s = stopped()) {
        sleeper.disarm(token);
        return *s;
      }
    }
    const Deadline& dl = deadline.get(now);
    if (dl.passed(now)) {
      sleeper.disarm(token);
      return timed_out();
    }
    sleeper.sleep(token, dl.left(now));
  }
}

template <class Ready, class Stop, class Sleeper, class OnTimeout>
Status wait_for(Ready&& ready, Stop&& stop, Sleeper&& sleeper, WaitMode mode, Duration timeout, const SpinPlan& plan,
                OnTimeout&& on_timeout) {
  LazyDeadline deadline(timeout);
  return wait_for(std::forward<Ready>(ready), std::forward<Stop>(stop), std::forward<Sleeper>(sleeper), mode, deadline,
                  plan, std::forward<OnTimeout>(on_timeout));
}

}  // namespace lavaflow::detail
