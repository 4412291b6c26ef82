// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Channels: one producer, any number of consumers (fan-out: each sees every message).
/// `loan()` → write → `publish()`; `receive()` → read → release (RAII). The same Producer and
/// Consumer types serve every route: made by name (Producer::create / Consumer::open) they connect
/// processes of one host; made between MPI ranks (lavaflow::mpi::open_producer / open_consumer)
/// they take the route the job's Communicator chooses, local or over MPI to another host.
///
/// On one host a ring of N buffers is allocated once by the producer and shared once, at connect
/// time (fds over a Unix socket, SCM_RIGHTS). Per message only a slot descriptor moves, through a
/// lock-free ring in shared memory.
///
/// Rendezvous is by name among processes of one user: the producer owns a socket in a 0700
/// directory of that user and holds a lock file for its lifetime, so a crashed producer's name is
/// reclaimed safely by the next one. A peer's death is seen through its socket hanging up.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <vulkan/vulkan.hpp>

#include "lavaflow/core/duration.hpp"
#include "lavaflow/core/gpu_semaphore.hpp"
#include "lavaflow/transports/detail/channel_hot.hpp"
#include "lavaflow/transports/transport.hpp"

namespace lavaflow {

class MemoryPool;

enum class FullPolicy : std::uint8_t {
  Block,       ///< producer waits for a free slot (default)
  DropOldest,  ///< the oldest message a lagging consumer has not taken yet is dropped for it
  /// loan() reports WouldBlock at once; also for the moment a consumer takes to join, should the
  /// producer run a whole ring ahead during it
  FailFast,
};

/// How a channel's GPU work is ordered across processes (design note 0015).
enum class GpuSyncKind : std::uint8_t {
  /// Timeline semaphores: every API waits on them on the GPU (Vulkan, CUDA, OpenGL, OpenCL).
  Semaphore,
  /// 64-bit counters in GPU memory that CUDA streams write and wait on (cuStreamWriteValue64 /
  /// cuStreamWaitValue64): the fastest hand-off between CUDA processes. Other APIs cannot wait on
  /// them on the GPU; the host can (receive(), loan() and wait_on_host()).
  Flag,
};

struct ProducerOptions {
  /// The longest ring: its buffers' fds, the control block's and two counters' go to a consumer
  /// in one message.
  static constexpr std::uint32_t kMaxSlots = 62;
  static constexpr std::uint32_t kHostSlots = 8;
  static constexpr std::uint32_t kGpuSlots = kMaxSlots;
  /// Ring length N (1..kMaxSlots); 0 chooses: kGpuSlots for a ring in GPU memory, kHostSlots otherwise.
  /// A GPU ring is deeper because a GPU time-slices between processes: the deeper the ring, the
  /// more frames each side handles per context switch (design note 0015 has the trade of ring
  /// memory for throughput).
  std::uint32_t slots = 0;
  std::uint64_t slot_size = 1 << 20;  ///< bytes per ring buffer
  std::uint32_t max_consumers = 16;   ///< 1..16
  FullPolicy policy = FullPolicy::Block;
  WaitMode wait = WaitMode::SpinThenBlock;
  /// Stamp each message with CLOCK_MONOTONIC at publish (MessageInfo::timestamp_ns). It costs a
  /// vDSO clock read on the hand-off path, a large share of a busy-polled message, so it is opt-in.
  bool timestamps = false;
  /// Channels whose consumers release messages on the GPU (Received::gpu_release): loan() waits on
  /// the host until the consumers' GPU work on the slot's previous message is done, so bytes() may
  /// be written at once. Producers that write on the GPU set this false and put Loan::gpu_waits()
  /// in their own queue submission instead: then no CPU waits for any GPU.
  bool host_wait_for_gpu_release = true;
  /// What GPU-ordered channels (Vulkan transport) order their GPU work with. Flag needs only the
  /// Vulkan transport; Semaphore needs a device that exports timeline semaphores (else the
  /// channel falls back to CPU fence waits, and says so in its route).
  GpuSyncKind gpu_sync = GpuSyncKind::Semaphore;
  std::optional<TransportKind> transport;  ///< unset: route automatically; else force this one
  TransportSet transports;                 ///< in preference order; empty: lavaflow::local_transports()
  const VulkanContext* vulkan = nullptr;   ///< for the Vulkan transport; null = make one when needed
  std::optional<ProcessLocation> peer;     ///< the consumer, when known in advance (routing uses it)
  std::optional<HostIdentity> host;        ///< override of this host's identity (tests, containers)
  std::filesystem::path directory;         ///< rendezvous directory; empty = the user's default
  /// Where the ring's buffers come from: null, fresh memory of the channel's own; else rented from
  /// this pool (CpuShared on the shm transport, GpuDeviceLocal on the Vulkan transport, whose pool
  /// must be on `vulkan`'s context) and returned when the producer ends with no consumer attached,
  /// so that a channel made again with the same shape reuses the memory (with a consumer still
  /// attached, which may hold messages, the ring's blocks are retired instead: never rented
  /// again). Consumers map the whole segment that holds a ring buffer, and may keep a mapping:
  /// give a pool whose other buffers the consumers may see (e.g. one for the channels among
  /// trusting processes), never one shared with memory others must not reach. Loan::buffer() is
  /// then a PooledBuffer (gpu_buffer() and gpu_offset() for Vulkan work).
  MemoryPool* pool = nullptr;
  /// Point-to-point channels (e.g. between two MPI ranks): loan() first waits, within its
  /// timeout, until this many consumers are attached, and once they were, a channel with fewer is
  /// Errc::PeerLost (a consumer closed or died). 0: messages go to whoever is attached.
  std::uint32_t await_consumers = 0;
};

struct ConsumerOptions {
  WaitMode wait = WaitMode::SpinThenBlock;
  /// Vulkan transport with a shared timeline semaphore: receive() waits on the host until the
  /// producer's GPU work on the message is done, so bytes() are complete. Consumers that read on
  /// the GPU set this false and wait on Received::gpu_wait() in their own queue instead.
  bool host_wait_for_gpu = true;
  Duration connect_timeout = std::chrono::seconds(10);  ///< wait this long for the producer to appear
  TransportSet transports;  ///< must contain the producer's transport; empty: lavaflow::local_transports()
  const VulkanContext* vulkan = nullptr;  ///< for importing Vulkan rings; null = make one when needed
  std::optional<HostIdentity> host;
  std::filesystem::path directory;
};

/// Optional per-message header.
struct MessageInfo {
  std::uint64_t size = 0;  ///< bytes used (≤ slot size); publish(): 0 means the whole slot
  std::uint64_t user_tag = 0;
  std::uint64_t timestamp_ns = 0;  ///< CLOCK_MONOTONIC at publish, when the producer stamps (else 0)
  std::uint64_t sequence = 0;      ///< 0, 1, 2, … per channel (set by publish)
};

/// A point on one of the channel's GPU counters: GPU work raises the counter to `value` (producer:
/// the message is written; consumer: its read is done) or waits until it gets there. The counter is
/// a timeline semaphore (Vulkan transport on devices that export them as opaque fds), or on flag
/// channels a 64-bit word in GPU memory (GpuSyncKind::Flag).
struct GpuSync {
  vk::Semaphore semaphore;  ///< null for a flag
  std::uint64_t value = 0;
  /// The semaphore's owner, from which other APIs import it (GpuSemaphore::export_fd, once).
  const GpuSemaphore* source = nullptr;
  /// A flag: the word at `flag_offset` of this buffer (import the buffer to reach it from CUDA).
  /// Raise it in the order of `value` (one stream, or streams ordered among themselves).
  const Buffer* flag_buffer = nullptr;
  std::uint64_t flag_offset = 0;
  /// In Loan::gpu_waits(): a later value of the same counter whose signal is promised already
  /// (0 when none). Waiting for it instead costs the slot a little of the ring's slack and covers
  /// the waits of the loans that follow, which an adapter that remembers its waits then skips
  /// (cuda::ChannelImports does).
  std::uint64_t ahead = 0;
  [[nodiscard]] GpuSyncKind kind() const { return flag_buffer ? GpuSyncKind::Flag : GpuSyncKind::Semaphore; }
};

/// The host's side of a GpuSync, for either kind: the counter's value now; a wait of at most
/// `timeout` until it reaches `sync.value` (Timeout otherwise); and raising it to `sync.value` for
/// work the host did itself (a flag only ever moves up: a lower value leaves it as it is).
[[nodiscard]] Result<std::uint64_t> gpu_sync_value(const GpuSync& sync);
[[nodiscard]] Status wait_on_host(const GpuSync& sync, Duration timeout);
[[nodiscard]] Status signal_on_host(const GpuSync& sync);

/// The route a channel took, and why.
struct ChannelRoute {
  TransportKind transport = TransportKind::Shm;
  std::string reason;
};

/// Default rendezvous directory: $XDG_RUNTIME_DIR/lavaflow or /tmp/lavaflow-<uid>.
[[nodiscard]] std::filesystem::path default_channel_directory();

class Producer;
class Consumer;
namespace detail {
struct ProducerState;  // the channel's ring, control block and sockets (transports/src/channel.cpp)
struct ConsumerState;
struct LinkAccess;  // transports that move messages themselves (detail/link.hpp)
}  // namespace detail

/// A loaned ring buffer. Write into `bytes()`, then `Producer::publish(std::move(loan))`.
/// Dropping a Loan unpublished gives the slot back.
///
/// Ownership: a Loan refers to its Producer's ring, never to the Producer object. A Loan that
/// outlives its Producer keeps the ring mapped (bytes() stays valid, publish is impossible
/// without the Producer) and frees it when dropped; the channel itself closes with the Producer.
/// A Producer and its Loan are used by one thread at a time (they may move between threads).
class Loan {
 public:
  // Moves and the destructor are inline: a loan is made and moved on every message.
  Loan(Loan&& o) noexcept
      : impl_(std::exchange(o.impl_, nullptr)), seq_(o.seq_), slot_(o.slot_), gpu_signaled_(o.gpu_signaled_) {}
  Loan& operator=(Loan&&) noexcept;
  ~Loan() {
    if (impl_) abandon();
  }
  [[nodiscard]] std::span<std::byte> bytes() const;  ///< empty when the buffer is not host-visible
  [[nodiscard]] Buffer& buffer() const;              ///< the ring buffer itself (e.g. a GpuBuffer)
  [[nodiscard]] std::uint64_t sequence() const { return seq_; }
  /// The signal that the GPU work writing this buffer must perform (add it to that queue
  /// submission); publish() then hands off without any CPU wait and consumers wait on the GPU.
  /// Values only increase with the sequence: submit GPU-ordered messages in publish order on one
  /// queue. Messages published without calling this (CPU-written, or finished with a fence) do
  /// not touch the semaphore at all.
  /// Empty when the channel has no shared timeline semaphore (e.g. lavapipe): then finish the GPU
  /// work with a fence and call publish(loan, fence).
  [[nodiscard]] std::optional<GpuSync> gpu_signal();
  /// What gpu_signal() returns, without promising the signal: adapters queue the signal first and
  /// then call gpu_signal(), so that a failure to queue it leaves no consumer waiting for it.
  [[nodiscard]] std::optional<GpuSync> gpu_signal_point() const;
  /// What the GPU work writing this buffer must wait on first: the release signals of consumers
  /// whose GPU was still reading the slot's previous message when it was loaned. Empty when the
  /// producer waits for them on the host (ProducerOptions::host_wait_for_gpu_release, the default)
  /// or no consumer released that message on its GPU.
  [[nodiscard]] std::span<const GpuSync> gpu_waits() const;

 private:
  friend class Producer;
  friend struct detail::LinkAccess;
  Loan(detail::ProducerHot* state, std::uint64_t seq, std::uint32_t slot) : impl_(state), seq_(seq), slot_(slot) {}
  void abandon();  ///< gives the unpublished slot back
  [[nodiscard]] detail::ProducerState& state() const;
  detail::ProducerHot* impl_ = nullptr;
  std::uint64_t seq_ = 0;
  std::uint32_t slot_ = 0;
  bool gpu_signaled_ = false;
};

/// A received message; released (slot returned) when destroyed.
///
/// Ownership: a Received refers to its Consumer's ring, never to the Consumer object. Messages
/// still held when their Consumer is destroyed keep the ring mapped and their slots taken (their
/// bytes stay valid and unchanged); the last one released ends the connection. After release()
/// bytes() is empty. A Consumer and its Received are used by one thread at a time.
class Received {
 public:
  // Moves and the destructor are inline: a message is received and moved on every hand-off.
  Received(Received&& o) noexcept
      : impl_(std::exchange(o.impl_, nullptr)),
        info_(o.info_),
        missed_(o.missed_),
        slot_(o.slot_),
        gpu_ordered_(o.gpu_ordered_),
        gpu_released_(o.gpu_released_) {}
  Received& operator=(Received&&) noexcept;
  ~Received() {
    if (impl_) release();
  }
  [[nodiscard]] std::span<const std::byte> bytes() const;  ///< the used bytes (info().size)
  [[nodiscard]] Buffer& buffer() const;
  [[nodiscard]] const MessageInfo& info() const { return info_; }
  /// Messages this consumer missed just before this one (DropOldest policy), else 0.
  [[nodiscard]] std::uint64_t missed() const { return missed_; }
  [[gnu::always_inline]] void release() {
    if (!impl_) return;
    detail::ConsumerHot& m = *std::exchange(impl_, nullptr);
    // A CPU release on the ring: inline, no call (every message's path). Anything else (a link,
    // a closed or orphaned consumer, a release on the GPU) goes out of line.
    if (m.plain && !gpu_released_) [[likely]] {
      --m.held;
      m.mark_released(slot_);
      if (m.store_released()) wake_producer(m);
      return;
    }
    release_slow(m, slot_, gpu_released_ ? info_.sequence + 1 : 0);
  }
  /// What the consumer's GPU work must wait on before reading this buffer (see
  /// ConsumerOptions::host_wait_for_gpu); empty when the producer did not order this message
  /// through the timeline (CPU-written or fence-finished: nothing to wait for).
  [[nodiscard]] std::optional<GpuSync> gpu_wait() const;
  /// The signal that ends this consumer's GPU work on the message (add it to the submission that
  /// reads the buffer last). The message may then be released at once: the producer's GPU (or its
  /// loan(), see ProducerOptions::host_wait_for_gpu_release) waits for the signal before the slot
  /// is written again, so no CPU waits for the read. Values only increase with the sequence:
  /// release in receive order, on one queue; calling it again returns the same point. Unsupported
  /// when the channel has no shared timeline (then finish the read before releasing);
  /// InvalidArgument when out of order or already released.
  [[nodiscard]] Result<GpuSync> gpu_release();
  /// What gpu_release() returns (with its errors), without promising the signal: adapters queue
  /// the signal first and then call gpu_release(), so that a failure to queue it leaves the
  /// message released on the CPU (the caller finishes its read first) rather than owed.
  [[nodiscard]] Result<GpuSync> gpu_release_point() const;

 private:
  friend class Consumer;
  friend struct detail::LinkAccess;
  Received(detail::ConsumerHot* state, MessageInfo info, std::uint64_t missed, std::uint32_t slot, bool gpu_ordered)
      : impl_(state), info_(info), missed_(missed), slot_(slot), gpu_ordered_(gpu_ordered) {}
  [[nodiscard]] detail::ConsumerState& state() const;
  static void release_slow(detail::ConsumerHot& m, std::uint32_t slot, std::uint64_t gpu_release);
  static void wake_producer(detail::ConsumerHot& m);
  detail::ConsumerHot* impl_ = nullptr;
  MessageInfo info_;
  std::uint64_t missed_ = 0;
  std::uint32_t slot_ = 0;
  bool gpu_ordered_ = false;
  bool gpu_released_ = false;
};

class Producer {
 public:
  /// Creates channel `name` (letters, digits, '-', '_', '.'; ≤ 64) and starts accepting consumers.
  /// Fails with PermissionDenied/"in use" when a live producer holds the name.
  [[nodiscard]] static Result<std::unique_ptr<Producer>> create(const std::string& name, ProducerOptions options = {});
  ~Producer();

  /// A free ring buffer, waiting at most `timeout` under the Block policy.
  [[nodiscard, gnu::always_inline]] Result<Loan> loan(Duration timeout = kForever) {
    // The common case, inline (every message's path): a ring with a free slot and nothing else to
    // do; everything else goes out of line.
    detail::ProducerHot& m = *hot_;
    if (m.loans_plain && !m.loan_out && m.write_seq - m.min_released < m.ring_slots) [[likely]] {
      m.loan_out = true;
      return Result<Loan>(std::in_place, Loan(&m, m.write_seq, m.write_slot));
    }
    return loan_general(timeout);
  }
  /// Never waits: WouldBlock when the ring is full for some consumer.
  [[nodiscard]] Result<Loan> try_loan();
  /// Hands the buffer to every consumer (atomic: consumers never see a half-published message).
  [[nodiscard, gnu::always_inline]] Result<MessageInfo> publish(Loan&& loan, MessageInfo info = {}) {
    // The common case, inline (every message's path): this producer's current loan on the ring,
    // of a valid size; everything else (and every error) goes out of line.
    detail::ProducerHot& m = *hot_;
    const std::uint64_t size = info.size == 0 ? m.ring_slot_size : info.size;
    if (m.plain && loan.impl_ == &m && loan.seq_ == m.write_seq && size <= m.ring_slot_size) [[likely]] {
      // The answer is assembled from scalars rather than by updating `info` in place: a copy of a
      // struct just partly rewritten stalls on store forwarding.
      const std::uint64_t tag = info.user_tag, seq = loan.seq_;
      const bool wake = m.hand_off(loan.slot_, seq, size, tag, 0, 0);
      loan.impl_ = nullptr;
      if (wake) wake_consumers();
      if (m.write_seq - m.min_released >= m.ring_slots) [[unlikely]]
        look_for_room();
      return MessageInfo{.size = size, .user_tag = tag, .timestamp_ns = 0, .sequence = seq};
    }
    return publish_general(std::move(loan), info);
  }
  /// Waits (CPU, at most `timeout`) for `gpu_done` — the fence of the GPU work that wrote the
  /// buffer — then publishes. For drivers without exportable timeline semaphores.
  [[nodiscard]] Result<MessageInfo> publish(Loan&& loan, vk::Fence gpu_done, MessageInfo info = {},
                                            Duration timeout = std::chrono::seconds(10));
  /// Whether GPU work is ordered through a shared timeline semaphore. False on flag channels,
  /// whose GPU work is ordered by flags (gpu_sync() says which), and without GPU ordering.
  [[nodiscard]] bool has_gpu_timeline() const;
  /// What orders GPU work on this channel; empty when nothing does (GPU writes are finished with
  /// CPU fence waits).
  [[nodiscard]] std::optional<GpuSyncKind> gpu_sync() const;
  /// The shared timeline itself (null without one): export_fd() hands it to CUDA or another API.
  [[nodiscard]] const GpuSemaphore* gpu_timeline() const;

  [[nodiscard]] const ChannelRoute& route() const;
  [[nodiscard]] const std::string& name() const;
  [[nodiscard]] std::uint32_t slots() const;
  [[nodiscard]] std::uint64_t slot_size() const;
  [[nodiscard]] std::uint32_t consumer_count() const;
  /// The Vulkan context the ring lives in (Vulkan transport), else null.
  [[nodiscard]] const VulkanContext* vulkan() const;
  /// Waits until every connected consumer has released every published message.
  [[nodiscard]] Status flush(Duration timeout = kForever);
  /// Waits until at least `n` consumers are connected.
  [[nodiscard]] Status wait_for_consumers(std::uint32_t n, Duration timeout);
  /// Ends the channel now: consumers see PeerLost after the messages already published, nobody
  /// new connects, the name is free again. The ring stays mapped until the Producer is destroyed,
  /// so pointers into published buffers stay valid; loan() and publish() fail from now on. Over
  /// MPI too: the consumer receives an end marker after the last message.
  void close();
  [[nodiscard]] bool closed() const;

 private:
  friend struct detail::LinkAccess;
  explicit Producer(std::unique_ptr<detail::ProducerState> state);
  Result<Loan> loan_general(Duration timeout);  ///< loan() when it may wait or check GPU work
  Result<MessageInfo> publish_general(Loan&& loan, MessageInfo info);
  void wake_consumers();
  /// Re-reads the consumers' released counts once the cached one says the ring is full: right
  /// after a publish, while the message travels, rather than in the next loan, where the read (a
  /// cache line from each consumer) would delay the next hand-off.
  void look_for_room();
  std::unique_ptr<detail::ProducerState> impl_;
  detail::ProducerHot* hot_;  // impl_'s, for the inline paths
};

class Consumer {
 public:
  /// Connects to channel `name`, waiting up to `connect_timeout` for its producer to appear.
  [[nodiscard]] static Result<std::unique_ptr<Consumer>> open(const std::string& name, ConsumerOptions options = {});
  ~Consumer();

  /// Hangs up now: the producer stops counting this consumer (its unreleased messages no longer
  /// hold the producer back). The ring stays mapped until the Consumer is destroyed, so pointers
  /// into received buffers stay valid (their slots may be written again); receive() fails from now on.
  /// Over MPI the producer is told too: its next wait for room, and a flush with messages
  /// unreleased, are PeerLost.
  void close();
  [[nodiscard]] bool closed() const;

  /// The next message, waiting at most `timeout`. PeerLost once the producer is gone and every
  /// message it published has been received.
  [[nodiscard, gnu::always_inline]] Result<Received> receive(Duration timeout = kForever) {
    // The common case, inline (every message's path): the ring's next message, CPU-written and of
    // a valid size. Waiting for it is one call, and a receive that arrives first, as in a
    // ping-pong, still takes the message here; everything else goes out of line.
    detail::ConsumerHot& m = *hot_;
    if (m.plain && m.held < m.slots) [[likely]] {
      std::uint64_t n = 0;
      std::uint32_t k = 0;
      LazyDeadline deadline(timeout);
      if (!m.message_ready(n, k)) {
        const bool spin = m.busy_poll && timeout > Duration::zero();
        if (!(spin && m.arrives_soon(n, k))) {
          if (Status waited = wait_message(deadline, n, k, spin ? m.kInlineSpins : 0); !waited)
            return std::unexpected(std::move(waited.error()));
        }
      }
      const auto& slot = m.slot_headers[k];
      const std::uint64_t size = slot.size.load(std::memory_order_relaxed);
      if (slot.flags.load(std::memory_order_relaxed) == 0 && size <= m.slot_size) [[likely]] {
        const MessageInfo info{size, slot.tag.load(std::memory_order_relaxed),
                               slot.timestamp_ns.load(std::memory_order_relaxed), n};
        m.next_word->store(n + 1, std::memory_order_release);
        const std::uint64_t missed = m.take(n, k);
        return Result<Received>(std::in_place, Received(&m, info, missed, k, false));
      }
      return receive_general(deadline.left());
    }
    return receive_general(timeout);
  }
  [[nodiscard]] Result<Received> try_receive();

  [[nodiscard]] const ChannelRoute& route() const;
  [[nodiscard]] std::uint32_t slots() const;
  [[nodiscard]] std::uint64_t slot_size() const;
  [[nodiscard]] std::int32_t producer_pid() const;
  /// The Vulkan context the ring was imported into (Vulkan transport), else null.
  [[nodiscard]] const VulkanContext* vulkan() const;
  [[nodiscard]] bool has_gpu_timeline() const;
  [[nodiscard]] std::optional<GpuSyncKind> gpu_sync() const;
  /// The shared timeline itself (null without one): export_fd() hands it to CUDA or another API.
  [[nodiscard]] const GpuSemaphore* gpu_timeline() const;
  /// This consumer's release timeline (Received::gpu_release signals it), null without one.
  [[nodiscard]] const GpuSemaphore* gpu_release_timeline() const;

  /// A message that has not arrived yet, for GPU work queued ahead of it.
  struct Upcoming {
    std::uint64_t sequence = 0;
    Buffer* buffer = nullptr;  ///< the ring buffer it will be written into
    GpuSync gpu_wait;          ///< met once the producer's GPU has written it
  };
  /// GPU-resident consumers: where message `sequence` (not received yet) will be and what its
  /// producer's GPU signals once it is written, so that GPU work reading it can be queued before
  /// the producer has even published it; no CPU takes part in the hand-off itself. receive()
  /// still hands the message over later (its CPU release frees the slot; release it on the GPU,
  /// Received::gpu_release, as the queued work ends). For channels whose producer orders every
  /// message on the GPU (Loan::gpu_signal): ahead of a message published otherwise the queued
  /// work waits for the next GPU-ordered one. Unsupported without GPU ordering and under
  /// FullPolicy::DropOldest (the producer may skip the slot); InvalidArgument for a message
  /// already received, or one at least slots − slots/4 beyond the oldest message this consumer
  /// has not released (its slot may still hold that message, and a producer's GPU may wait for
  /// releases up to a quarter of the ring ahead: GpuSync::ahead).
  /// Should the producer die first, the queued work is let go (what it reads is then undefined;
  /// the next receive() says PeerLost).
  [[nodiscard]] Result<Upcoming> upcoming(std::uint64_t sequence);
  /// The sequence the next receive() returns (when nothing is dropped).
  [[nodiscard]] std::uint64_t next_sequence() const;

 private:
  friend struct detail::LinkAccess;
  explicit Consumer(std::unique_ptr<detail::ConsumerState> state);
  Result<Received> receive_general(Duration timeout);  ///< receive() when it may wait or check GPU work
  /// Waits for the next message (sets its sequence `n` and slot `k`), `spun` tests of it made.
  Status wait_message(LazyDeadline& deadline, std::uint64_t& n, std::uint32_t& k, std::uint64_t spun);
  std::unique_ptr<detail::ConsumerState> impl_;
  detail::ConsumerHot* hot_;  // impl_'s, for the inline paths
};

/// The seed's form: a producer for a known peer (route from both locations). The consumer opens
/// `producer->name()`.
struct Channel {
  [[nodiscard]] static Result<std::unique_ptr<Producer>> create(const VulkanContext* vulkan, const ProcessLocation& me,
                                                                const ProcessLocation& peer,
                                                                ProducerOptions options = {});
};

/// Typed channels for trivially copyable T: one T per message.
template <class T>
requires std::is_trivially_copyable_v<T>
class TypedProducer {
 public:
  explicit TypedProducer(std::unique_ptr<Producer> p) : p_(std::move(p)) {}
  [[nodiscard]] Result<MessageInfo> send(const T& value, Duration timeout = kForever) {
    LF_TRY(Loan loan, p_->loan(timeout));
    auto b = loan.bytes();
    if (b.empty() && p_->slot_size() >= sizeof(T))
      return fail(Errc::Unsupported, "TypedProducer::send",
                  "ring buffers are device-local GPU memory without a host mapping");
    if (b.size() < sizeof(T)) return fail(Errc::InvalidArgument, "TypedProducer::send", "slot smaller than T");
    std::memcpy(b.data(), &value, sizeof(T));
    return p_->publish(std::move(loan), {.size = sizeof(T)});
  }
  [[nodiscard]] Producer& untyped() { return *p_; }

 private:
  std::unique_ptr<Producer> p_;
};

template <class T>
requires std::is_trivially_copyable_v<T>
class TypedConsumer {
 public:
  explicit TypedConsumer(std::unique_ptr<Consumer> c) : c_(std::move(c)) {}
  [[nodiscard]] Result<T> receive(Duration timeout = kForever) {
    LF_TRY(Received r, c_->receive(timeout));
    if (r.bytes().size() != sizeof(T))
      return fail(Errc::Malformed, "TypedConsumer::receive", "message size differs from sizeof(T)");
    T value;
    std::memcpy(&value, r.bytes().data(), sizeof(T));
    return value;
  }
  [[nodiscard]] Consumer& untyped() { return *c_; }

 private:
  std::unique_ptr<Consumer> c_;
};

}  // namespace lavaflow
