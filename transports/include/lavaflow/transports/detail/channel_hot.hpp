// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The part of a channel end's state that a message's loan, publish, receive and release touch
/// when the message goes through the shared-memory ring and nothing else applies. Producer and
/// Consumer run those paths inline, in the caller's code, so that a hand-off makes no call;
/// channel.cpp's ProducerState and ConsumerState derive from these and do everything else. Not for
/// applications: the layout changes with the library.

#include <atomic>
#include <cstdint>
#include <vector>

#include "lavaflow/core/detail/wait.hpp"

namespace lavaflow::detail {

/// A ring slot's header in the shared control block (part of the control block's layout, which
/// channel.cpp defines around it).
struct alignas(64) SharedSlot {
  std::atomic<std::uint64_t> seq;  // sequence + 1 once published (0: never); the hand-off word
  std::atomic<std::uint64_t> size;
  std::atomic<std::uint64_t> tag;
  std::atomic<std::uint64_t> timestamp_ns;
  std::atomic<std::uint64_t> flags;  // kGpuOrdered: wait for the written counter's value seq + 1 before reading
};
inline constexpr std::uint64_t kGpuOrdered = 1;

/// A producer's side.
struct ProducerHot {
  // Set while a message needs nothing but the ring: no link, not closed, no consumers to await,
  // no GPU counters, no timestamps. The inline paths take nothing else; a loan takes `loans_plain`,
  // the same but for timestamps (which only publish() writes).
  bool plain = false;
  bool loans_plain = false;
  bool loan_out = false;
  std::uint32_t ring_slots = 0;
  std::uint32_t write_slot = 0;  // write_seq % slots, kept incrementally (no division per message)
  std::uint64_t ring_slot_size = 0;
  std::uint64_t write_seq = 0;     // mirror of the control block's; the producer is its only writer
  std::uint64_t min_released = 0;  // cached lower bound of every active consumer's `released`
  // In the control block (set with `plain`): the slots' headers, the published count, and the
  // counts of consumers that may sleep and of those asleep, which say whether a publish must wake.
  SharedSlot* slot_headers = nullptr;
  std::atomic<std::uint64_t>* published_word = nullptr;
  const std::atomic<std::uint32_t>* blocking_consumers = nullptr;
  const std::atomic<std::uint32_t>* consumers_waiting = nullptr;

  /// Publishes message `seq`, the current loan, in `slot`: its header, then the hand-off store that
  /// makes it (written before it) visible to every consumer. Returns whether a consumer sleeps and
  /// must be woken.
  bool hand_off(std::uint32_t slot, std::uint64_t seq, std::uint64_t size, std::uint64_t tag, std::uint64_t stamp,
                std::uint64_t flags) {
    auto& header = slot_headers[slot];
    header.size.store(size, std::memory_order_relaxed);
    header.tag.store(tag, std::memory_order_relaxed);
    header.timestamp_ns.store(stamp, std::memory_order_relaxed);
    header.flags.store(flags, std::memory_order_relaxed);
    // A consumer that may sleep needs the hand-off ordered before the check of its waiting flag
    // (seq_cst on both sides); with only busy-polling consumers a release store is enough. The two
    // stores are spelled out: compilers treat an order chosen at run time as seq_cst (a locked
    // exchange on x86).
    const bool wake = blocking_consumers->load(std::memory_order_relaxed) != 0;
    if (wake)
      header.seq.store(seq + 1, std::memory_order_seq_cst);
    else
      header.seq.store(seq + 1, std::memory_order_release);
    published_word->store(seq + 1, std::memory_order_release);
    ++write_seq;
    if (++write_slot == ring_slots) write_slot = 0;
    loan_out = false;
    return wake && consumers_waiting->load(std::memory_order_seq_cst) != 0;
  }
};

/// A consumer's side: its place in the ring and its release bookkeeping (messages may be released
/// in any order; `released` advances over the contiguous prefix).
struct ConsumerHot {
  // Set while messages need nothing but the ring: no link, not closed, not orphaned, and only this
  // consumer moves its `next` (not DropOldest). The inline paths take nothing else.
  bool plain = false;
  bool producer_may_sleep = false;  // the producer's control block says it may sleep for room
  bool busy_poll = false;           // WaitMode::BusyPoll: receive() spins a while inline first
  std::uint32_t slots = 0;
  std::uint32_t held = 0;
  std::uint32_t released_slot = 0;  // released % slots
  std::uint32_t cursor_slot = 0;    // cursor % slots
  std::uint64_t slot_size = 0;
  std::uint64_t expected = 0;  // sequence following the last received
  std::uint64_t released = 0;
  std::uint64_t cursor = 0;        // a sequence whose slot is known without dividing: the next to receive
  std::vector<std::uint8_t> done;  // by slot
  // In the control block (set with `plain`): the slots' headers, and this consumer's `next` and
  // `released` words and the producer's waiting flag.
  SharedSlot* slot_headers = nullptr;
  std::atomic<std::uint64_t>* next_word = nullptr;
  std::atomic<std::uint64_t>* released_word = nullptr;
  const std::atomic<std::uint32_t>* producer_waiting = nullptr;

  /// The slot of message `seq`: known without dividing unless DropOldest skipped messages.
  [[nodiscard]] std::uint32_t slot_of(std::uint64_t seq) {
    if (seq != cursor) [[unlikely]] {
      cursor = seq;
      cursor_slot = static_cast<std::uint32_t>(seq % slots);
    }
    return cursor_slot;
  }

  /// Whether this consumer's next message is published; sets `n` (its sequence) and `k` (its slot).
  [[nodiscard]] bool message_ready(std::uint64_t& n, std::uint32_t& k) {
    n = next_word->load(std::memory_order_acquire);
    k = slot_of(n);
    return slot_headers[k].seq.load(std::memory_order_seq_cst) == n + 1;
  }

  /// Whether message `n` arrives in slot `k` within a short spin. Tested inline, in the caller's
  /// code, so that a busy-polling hand-off (a ping-pong's) goes from the spin straight on to the
  /// message's header, with no call and no return through the general wait. `n` needs no
  /// re-reading meanwhile: while `plain`, only this consumer moves it.
  [[nodiscard]] bool arrives_soon(std::uint64_t n, std::uint32_t k) const {
    const auto& word = slot_headers[k].seq;
    for (std::uint64_t i = 0; i < kInlineSpins; ++i)
      if (word.load(std::memory_order_acquire) == n + 1) return true;
    return false;
  }
  /// The spin's tests: those a busy-polling wait makes before it first pauses, less the one that
  /// pauses; the out-of-line wait that follows counts them (SpinPlan::tests_done), so a receive
  /// pauses and reads the clock as soon as it would without this spin.
  static constexpr std::uint64_t kInlineSpins = kSpinsWithoutPause - 1;

  /// Books message n (in slot k) as held; returns how many messages were skipped before it.
  std::uint64_t take(std::uint64_t n, std::uint32_t k) {
    if (held == 0) {  // everything before n was released by us or dropped for us
      released = n;
      released_slot = k;
    }
    const std::uint64_t missed = n - expected;
    expected = n + 1;
    cursor = n + 1;
    cursor_slot = k + 1 == slots ? 0 : k + 1;
    ++held;
    return missed;
  }

  /// Marks the message in `slot` released and moves `released` over every message released in a
  /// row from there.
  void mark_released(std::uint32_t slot) {
    done[slot] = 1;
    while (released < expected && done[released_slot]) {
      done[released_slot] = 0;
      ++released;
      if (++released_slot == slots) released_slot = 0;
    }
  }

  /// Stores `released` where the producer reads it; returns whether the producer sleeps for room
  /// and must be woken.
  bool store_released() {
    if (!producer_may_sleep) {  // a busy-polling producer: no fence, nobody to wake
      released_word->store(released, std::memory_order_release);
      return false;
    }
    released_word->store(released, std::memory_order_seq_cst);
    return producer_waiting->load(std::memory_order_seq_cst) != 0;
  }
};

}  // namespace lavaflow::detail
