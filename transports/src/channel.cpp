// SPDX-License-Identifier: MIT
#include "lavaflow/transports/channel.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <new>
#include <thread>

#include "handshake.hpp"
#include "lavaflow/core/cpu_buffer.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/private_dir.hpp"
#include "lavaflow/core/detail/process_fence.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "lavaflow/core/detail/wait.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/pool.hpp"
#include "lavaflow/core/published_stats.hpp"
#include "lavaflow/core/unix_socket.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/transports/detail/link.hpp"
#include "lavaflow/transports/local.hpp"

namespace lavaflow {
namespace {

using namespace std::chrono_literals;
using detail::kMaxConsumers;
using detail::kMaxSlots;

/// How long a connecting consumer has to say Hello, and how many may be saying it at once.
constexpr auto kHelloTimeout = std::chrono::seconds(2);
constexpr std::size_t kMaxPending = 64;

// ---------------------------------------------------------------------------------------------
// The shared control block. Fixed layout; every field a peer could have scribbled on is checked
// before it is used as a size or an index.

constexpr std::uint32_t kControlMagic = 0x52434c46;  // "FLCR"
constexpr std::uint32_t kControlVersion = 5;

struct alignas(64) SharedConsumer {
  // 0 free, 1 active; written by the producer's service thread only. Read with `released` when the
  // ring looks full: on a line of its own, so that this read leaves the consumer's per-message
  // store to `next` where it is.
  std::atomic<std::uint32_t> state;
  alignas(64) std::atomic<std::uint64_t> next;  // next sequence to receive (consumer claims; DropOldest skips by CAS)
  // Read by the producer when the ring looks full: its own cache line, so that the consumer's
  // per-message store to `next` never waits for the line to come back from the producer.
  alignas(64) std::atomic<std::uint64_t> released;  // every sequence below this is released
  // By slot: sequence + 1 of the last message in that slot that this consumer released on its GPU
  // (its release timeline reaches that value when the read is done). Written before `released`
  // moves past the message. The producer only waits on the value it expects for the slot, so a
  // scribbled entry can only skip a wait (harming only its writer) or add one for a read this
  // consumer announced; should the consumer go away owing it, the producer signals it itself.
  alignas(64) std::atomic<std::uint64_t> gpu_release[kMaxSlots];
};

using detail::kGpuOrdered;
using detail::SharedSlot;  // the slots' headers: channel_hot.hpp, where the inline paths read them

struct ControlBlock {
  std::uint32_t magic;
  std::uint32_t version;
  std::uint32_t slots;
  std::uint32_t max_consumers;
  std::uint64_t slot_size;
  alignas(64) std::atomic<std::uint64_t> write_seq;  // messages published
  alignas(64) std::atomic<std::uint32_t> data_futex;
  std::atomic<std::uint32_t> consumers_waiting;
  // Consumers that may sleep on data_futex (not BusyPoll). While there are none, publish() needs
  // no full fence and no wake-up check: busy-polling peers pay only for the hand-off itself.
  std::atomic<std::uint32_t> blocking_consumers;
  alignas(64) std::atomic<std::uint32_t> space_futex;
  std::atomic<std::uint32_t> producer_waiting;
  std::atomic<std::uint32_t> closed;  // producer closed the channel in order
  std::uint32_t drop_oldest;          // 1: the producer may advance consumers' `next` (DropOldest)
  std::uint32_t producer_blocks;      // 1: the producer may sleep on space_futex (not BusyPoll)
  // Held by a consumer raising the written counter (timeline or flag) for a dead producer: a
  // counter may only go up, so the read of the current value and the raise go together.
  alignas(64) std::atomic<std::uint32_t> timeline_lock;
  SharedConsumer consumers[kMaxConsumers];
  SharedSlot ring[kMaxSlots];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, Duration max) {
  const auto ns = std::min<long long>(max.count(), 100'000'000);  // re-check at least every 100 ms
  timespec ts{0, static_cast<long>(ns)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  word.fetch_add(1, std::memory_order_seq_cst);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

/// Raises `word` (a std::atomic or std::atomic_ref of a counter) to at least `value` in one
/// read-modify-write, so that a concurrent raiser is never taken back down.
template <class Word>
void raise_to(Word&& word, std::uint64_t value) {
  std::uint64_t now = word.load(std::memory_order_acquire);
  while (now < value && !word.compare_exchange_weak(now, value, std::memory_order_seq_cst)) {
  }
}

/// Sleeps on a futex word of the control block, announcing itself in `waiters` (Dekker-style with
/// the waker: both seq_cst).
struct FutexSleep {
  std::atomic<std::uint32_t>& word;
  std::atomic<std::uint32_t>& waiters;
  std::uint32_t arm() {
    waiters.fetch_add(1, std::memory_order_seq_cst);
    return word.load(std::memory_order_seq_cst);
  }
  void disarm(std::uint32_t) { waiters.fetch_sub(1, std::memory_order_seq_cst); }
  void sleep(std::uint32_t seen, Duration left) {
    futex_wait(word, seen, left);
    waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
};

/// Waits until `ready()`; `aborted()` returns an error to stop with. Spins first (per mode), then
/// sleeps on `word`. A test of the ring is a load of a cache line: BusyPoll reads the clock only
/// every few thousand tests. `spun`: tests the caller made already, unpaused.
template <class Ready, class Aborted>
Status wait_until(Ready ready, Aborted aborted, std::atomic<std::uint32_t>& word, std::atomic<std::uint32_t>& waiters,
                  WaitMode mode, LazyDeadline& deadline, const char* call, std::uint64_t spun = 0) {
  const detail::SpinPlan plan{.clock_every = mode == WaitMode::BusyPoll ? detail::kSpinsWithoutPause : 64,
                              .tests_done = spun};
  return detail::wait_for(
      ready,
      [&]() -> Result<bool> {
        if (auto e = aborted()) {
          // What ended the peer may have followed what this waits for (a producer publishes, then
          // closes or dies): that comes first. The abort was seen (seq_cst), so what preceded it is.
          if (ready()) return true;
          return std::unexpected(std::move(*e));
        }
        return false;
      },
      FutexSleep{word, waiters}, mode, deadline, plan, [&] { return Error(Errc::Timeout, call, "timed out"); });
}

// ---------------------------------------------------------------------------------------------
// GPU counters seen from the host.

/// A flag's word in the mapping of its block. Counters written by GPU work and peers are read
/// with single aligned 64-bit accesses, which cannot tear.
std::atomic_ref<std::uint64_t> flag_word(const GpuSync& sync) {
  return std::atomic_ref<std::uint64_t>(
      *reinterpret_cast<std::uint64_t*>(sync.flag_buffer->host_ptr() + sync.flag_offset));
}

/// A block of GPU flag words, zeroed: device-local memory the host maps where there is some, else
/// host-visible memory.
Result<std::unique_ptr<GpuBuffer>> allocate_flag_block(const VulkanContext& vulkan, std::uint64_t size) {
  auto block = GpuBuffer::allocate(vulkan, {.size = size, .memory = GpuMemory::DeviceLocalMapped});
  if (!block) return std::unexpected(block.error());
  if (!block->host_ptr())
    return fail(Errc::Unsupported, "channel flags",
                "the device has no host-visible memory for the channel's GPU flags");
  std::memset(block->host_ptr(), 0, size);
  return std::make_unique<GpuBuffer>(std::move(*block));
}

Status check_flag(const GpuSync& sync, const char* call) {
  const auto* b = sync.flag_buffer;
  if (b->host_ptr() == nullptr) return fail(Errc::InvalidArgument, call, "the flag's buffer is not mapped on the host");
  if (reinterpret_cast<std::uintptr_t>(b->host_ptr()) % 8 != 0)
    return fail(Errc::InvalidArgument, call, "the flag's buffer is not mapped at an 8-byte boundary");
  if (sync.flag_offset % 8 != 0 || sync.flag_offset > b->size() || b->size() - sync.flag_offset < 8)
    return fail(Errc::InvalidArgument, call,
                str_format("flag offset {} is not an aligned word of the {}-byte buffer", sync.flag_offset, b->size()));
  return {};
}

/// Whether the host can read and raise `sync`: a timeline with its semaphore, or an aligned flag
/// word in a mapped buffer.
Status check_sync(const GpuSync& sync, const char* call) {
  if (sync.kind() == GpuSyncKind::Flag) return check_flag(sync, call);
  if (!sync.source) return fail(Errc::InvalidArgument, call, "GPU sync point without its semaphore");
  return {};
}

/// The counter's value now, of a `sync` that check_sync() accepted.
Result<std::uint64_t> read_sync(const GpuSync& sync) {
  if (sync.kind() == GpuSyncKind::Flag) return flag_word(sync).load(std::memory_order_acquire);
  return sync.source->value();
}

/// One of a channel's counters: a timeline semaphore or a flag word (empty: no GPU ordering).
class Counter {
 public:
  Counter() = default;
  explicit Counter(const GpuSemaphore& s) : sem_(&s) {}
  Counter(const Buffer& block, std::uint64_t offset) : block_(&block), offset_(offset) {}
  explicit operator bool() const { return sem_ || block_; }
  [[nodiscard]] GpuSync at(std::uint64_t v) const {
    if (sem_) return GpuSync{.semaphore = sem_->semaphore(), .value = v, .source = sem_};
    return GpuSync{.value = v, .flag_buffer = block_, .flag_offset = offset_};
  }
  [[nodiscard]] Result<std::uint64_t> value() const { return gpu_sync_value(at(0)); }
  [[nodiscard]] Status wait(std::uint64_t v, Duration timeout) const { return wait_on_host(at(v), timeout); }
  /// Raises the counter to `v` unless it is there already.
  Status raise(std::uint64_t v) const {
    LF_TRY(auto now, value());
    return now < v ? signal_on_host(at(v)) : Status{};
  }

 private:
  const GpuSemaphore* sem_ = nullptr;
  const Buffer* block_ = nullptr;
  std::uint64_t offset_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Rendezvous: a private directory, a lock file held by the live producer, a SEQPACKET socket.

Status check_name(const std::string& name) { return detail::check_file_name(name, "channel name"); }

/// Removes the names of producers that died without cleaning up (killed): a lock file nobody
/// holds, and its socket. Names of live producers are untouched (their lock is held).
void reclaim_stale_names(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const auto& lock_path = entry.path();
    if (lock_path.extension() != ".lock") continue;
    auto lock = detail::lock_file(lock_path, false);
    if (!lock || !*lock) continue;
    auto socket_path = lock_path;
    socket_path.replace_extension(".sock");
    ::unlink(socket_path.c_str());
    ::unlink(lock_path.c_str());
  }
}

Result<UniqueFd> unix_socket() {
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::unexpected(from_errno(errno, "socket(AF_UNIX)"));
  return UniqueFd(fd);
}

Result<sockaddr_un> address(const std::filesystem::path& p) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (p.native().size() >= sizeof a.sun_path)
    return fail(Errc::InvalidArgument, "channel socket",
                str_format("path {} is too long for a Unix socket", p.string()));
  std::memcpy(a.sun_path, p.c_str(), p.native().size());
  return a;
}

Status send_refuse(int sock, const std::string& reason) {
  return send_message(sock, detail::encode(detail::Refuse{reason}));
}

Result<ProcessLocation> my_location(const std::optional<HostIdentity>& host, const VulkanContext* vk, bool enumerate) {
  std::vector<DeviceIdentity> devices;
  if (vk) {
    devices.push_back(vk->capabilities().identity);
  } else if (enumerate) {
    if (auto all = enumerate_devices())
      for (const auto& d : *all) devices.push_back(d.identity);
  }
  if (host) return ProcessLocation::current_with(*host, std::move(devices));
  return ProcessLocation::current(std::move(devices));
}

}  // namespace

std::filesystem::path default_channel_directory() { return runtime_directory(); }

// ---------------------------------------------------------------------------------------------
// Producer

// ProducerHot holds what the inline loan and publish use (channel_hot.hpp).
struct detail::ProducerState : ProducerHot {
  std::string name;
  ProducerOptions options;
  ChannelRoute route;
  std::shared_ptr<const Transport> transport;
  std::optional<VulkanContext> own_vulkan;
  TransportEnv env;
  ProcessLocation me;
  std::optional<CpuBuffer> control_mem;
  ControlBlock* control = nullptr;
  std::vector<std::unique_ptr<Buffer>> ring;
  std::filesystem::path socket_path, lock_path;
  UniqueFd lock_fd, listen_fd, stop_fd;
  std::atomic<std::uint32_t> slots_used{0};  // consumer entries ever handed out (service thread raises it)
  ProcessFence admission_fence;              // orders a publish's head against an admission's state
  std::optional<GpuSemaphore> timeline;      // value n + 1: message n's GPU writes are done
  // By consumer index (created at its first admission, reused by later consumers there): value
  // n + 1 when that consumer's GPU is done reading message n. Set before the index's state turns
  // active and never replaced, so the producer thread reads it without a lock.
  std::array<std::unique_ptr<GpuSemaphore>, kMaxConsumers> release;
  // Flag channels instead: the written counter, in a block every consumer maps, and by consumer
  // index a release block of its own (created at the index's first admission and never replaced,
  // like `release`), whose word at release_offset[index] the index's current consumer raises.
  std::unique_ptr<Buffer> flag_block;
  std::array<std::unique_ptr<Buffer>, kMaxConsumers> release_blocks;
  std::array<std::atomic<std::uint64_t>, kMaxConsumers> release_offset{};
  // What the loaned slot's GPU writes must wait for (Loan::gpu_waits); kept here, not in the
  // Loan, so that a loan is a few words to move. A link's loans never have any.
  std::vector<GpuSync> loan_waits;
  bool pooled_ring = false;  // the ring's buffers are PooledBuffers (ProducerOptions::pool)
  std::thread service;

  struct Connection {
    UniqueFd sock;
    std::uint32_t index;
  };
  /// A connection whose Hello has not arrived yet. Admission never waits on one: the service
  /// thread polls them beside everything else, so silent clients delay nobody.
  struct Pending {
    UniqueFd sock;
    Clock::time_point deadline;
  };
  std::vector<Connection> connections;                      // service thread only
  std::array<Clock::time_point, kMaxConsumers> freed_at{};  // when each index was last let go (service thread)
  std::vector<Pending> pending;                             // service thread only

  bool orphaned = false;        // the Producer is gone; the outstanding Loan owns this and deletes it
  bool user_closed = false;     // Producer::close() ran
  bool consumers_seen = false;  // ProducerOptions::await_consumers were attached once
  // A route whose link moves the messages (MPI): no control block, sockets or service thread; the
  // ring holds the link's buffers, several of which may be loaned at once.
  std::unique_ptr<detail::ProducerLink> link;
  std::uint32_t link_loans = 0;

  ~ProducerState() {
    close();
    // A pooled ring goes back to the pool for the next channel only once no consumer is attached:
    // an attached one may still read messages it holds (their bytes stay valid after the producer
    // ends). Otherwise the ring's blocks are retired: never rented again.
    if (pooled_ring && consumer_attached())
      for (auto& b : ring) static_cast<PooledBuffer&>(*b).retire();
  }

  /// Whether a consumer's connection is still open (after the service thread stopped).
  [[nodiscard]] bool consumer_attached() const {
    for (const auto& c : connections) {
      pollfd p{c.sock.get(), POLLIN | POLLRDHUP, 0};
      if (::poll(&p, 1, 0) == 0 || !(p.revents & (POLLHUP | POLLRDHUP | POLLERR))) return true;
    }
    return false;
  }

  /// Value n + 1: message n's GPU writes are done.
  [[nodiscard]] Counter written() const {
    if (flag_block) return Counter(*flag_block, 0);
    return timeline ? Counter(*timeline) : Counter();
  }
  /// Value n + 1: consumer `index`'s GPU is done reading message n.
  [[nodiscard]] Counter released_by(std::uint32_t index) const {
    if (flag_block)
      return release_blocks[index]
                 ? Counter(*release_blocks[index], release_offset[index].load(std::memory_order_acquire))
                 : Counter();
    return release[index] ? Counter(*release[index]) : Counter();
  }

  /// Ends the channel: consumers see it closed, nobody new is admitted, the names are removed.
  /// The ring stays mapped until this state is deleted.
  void close() {
    if (link) link->close();
    if (control) {
      control->closed.store(1, std::memory_order_seq_cst);
      futex_wake_all(control->data_futex);
    }
    if (service.joinable()) {
      std::uint64_t one = 1;
      (void)!::write(stop_fd.get(), &one, sizeof one);
      service.join();
    }
    // We hold the lock, so both names are ours to remove: the socket first, so that a producer
    // that finds the lock file gone finds no socket of ours either.
    if (listen_fd) ::unlink(socket_path.c_str());
    if (lock_fd) ::unlink(lock_path.c_str());
    listen_fd.reset();
    lock_fd.reset();
  }

  /// The loan of message `seq` in `slot` was dropped unpublished (or published: then seq is stale).
  void abandon(std::uint64_t seq, std::uint32_t slot) {
    if (link) {
      link->give_back(slot);
      --link_loans;
    } else if (seq == write_seq) {
      loan_out = false;
    }
    if (orphaned && !loans_out()) delete this;
  }
  [[nodiscard]] bool loans_out() const { return loan_out || link_loans != 0; }

  [[nodiscard]] std::uint32_t count_consumers() const {
    if (link) return link->consumer_count();
    std::uint32_t n = 0;
    for (std::uint32_t i = 0; i < options.max_consumers; ++i)
      n += control->consumers[i].state.load(std::memory_order_acquire) == 1;
    return n;
  }

  /// ProducerOptions::await_consumers: they are attached (waiting for them at most `timeout`), or
  /// were once and are not all there now.
  Status await_consumers(Duration timeout, const char* call) {
    const std::uint32_t want = options.await_consumers;
    if (count_consumers() >= want) {
      consumers_seen = true;
      return {};
    }
    if (consumers_seen)
      return fail(Errc::PeerLost, call,
                  str_format("channel {}: a consumer left (closed or died); it needs {}", name, want));
    LF_TRY_STATUS(wait_attached(want, timeout, [&] {
      return Error(timeout == Duration::zero() ? Errc::WouldBlock : Errc::Timeout, call,
                   str_format("channel {}: {} of {} consumers attached in time", name, count_consumers(), want));
    }));
    consumers_seen = true;
    return {};
  }

  /// Waits until `n` consumers are attached; `late()` is the error when they are not in time.
  /// Admission happens on the service thread (or in the link), which wakes nobody: this polls.
  template <class Late>
  Status wait_attached(std::uint32_t n, Duration timeout, Late&& late) const {
    return detail::wait_for([&] { return count_consumers() >= n; }, detail::never_stop, detail::Nap{1ms},
                            WaitMode::Block, timeout, {}, late);
  }

  /// Whether slot `seq % slots` is free for every active consumer. The cached minimum only ever
  /// underestimates (a joining consumer starts at a head this scan has published; see admit), so
  /// the fast path reads no consumer's cache line; they are re-read only when the ring looks full.
  [[nodiscard]] bool slot_free(std::uint64_t seq) {
    if (seq - min_released < options.slots) return true;
    // The head `seq` was stored by the last publish; an admission stores a state and then loads
    // the head. One of the two must see the other's store.
    admission_fence.light();
    std::uint64_t lowest = seq;
    for (std::uint32_t i = 0; i < slots_used; ++i) {
      const auto& c = control->consumers[i];
      if (c.state.load(std::memory_order_acquire) != 1) continue;
      lowest = std::min(lowest, c.released.load(std::memory_order_acquire));
    }
    min_released = lowest;
    return seq - min_released < options.slots;
  }

  /// DropOldest: skips the oldest untaken message of every consumer that lags a full ring and
  /// holds nothing. A consumer holding its oldest message cannot be skipped past (its buffer is
  /// in use), so then the producer waits as under Block.
  void drop_for_laggards(std::uint64_t seq) {
    for (std::uint32_t i = 0; i < options.max_consumers; ++i) {
      auto& c = control->consumers[i];
      if (c.state.load(std::memory_order_acquire) != 1) continue;
      std::uint64_t rel = c.released.load(std::memory_order_acquire);
      std::uint64_t nxt = c.next.load(std::memory_order_acquire);
      if (seq - rel < options.slots || nxt != rel) continue;
      if (c.next.compare_exchange_strong(nxt, nxt + 1, std::memory_order_acq_rel))
        c.released.compare_exchange_strong(rel, rel + 1, std::memory_order_acq_rel);
    }
  }

  /// Whether message `seq` can be loaned now: its slot is free, or (DropOldest) can be made free.
  [[nodiscard]] bool room_for(std::uint64_t seq) {
    if (slot_free(seq)) return true;
    if (options.policy != FullPolicy::DropOldest) return false;
    drop_for_laggards(seq);
    return slot_free(seq);
  }

  /// A consumer that went away may owe release signals the producer's GPU waits on (it died with
  /// GPU work in flight): the producer signals them itself. Only values the consumer announced,
  /// and only up to what was published, so a later consumer at this index (which starts at the
  /// head) still signals above them.
  void release_gpu_waits(std::uint32_t index) {
    const auto counter = released_by(index);
    if (!counter) return;
    const auto& c = control->consumers[index];
    const std::uint64_t published = control->write_seq.load(std::memory_order_acquire);
    std::uint64_t owed = 0;
    for (std::uint32_t k = 0; k < options.slots; ++k) {
      const std::uint64_t v = c.gpu_release[k].load(std::memory_order_acquire);
      if (v <= published) owed = std::max(owed, v);
    }
    (void)counter.raise(owed);
  }

  /// The GPU releases that writing message `seq` into slot `slot` must wait for: those of active
  /// consumers that released the slot's previous message on their GPU.
  /// Into loan_waits: the release signals of consumers whose GPU may still read message
  /// seq - slots in `slot`.
  void collect_release_waits(std::uint64_t seq, std::uint32_t slot) {
    auto& waits = loan_waits;
    if (!written() || seq < options.slots) return;
    const std::uint64_t expect = seq - options.slots + 1;
    for (std::uint32_t i = 0; i < slots_used; ++i) {
      const auto& c = control->consumers[i];
      // A consumer that promised no GPU release of the slot's previous message adds no wait: a
      // loan of a channel read on the CPU then reads no more than this promise.
      if (c.gpu_release[slot].load(std::memory_order_relaxed) != expect) continue;
      // The state before the counter and a second look at the promise: an admission sets the
      // index's counter (flags: its word) and clears its promises before it sets the state.
      if (c.state.load(std::memory_order_acquire) != 1) continue;
      const auto counter = released_by(i);
      if (!counter) continue;
      if (c.gpu_release[slot].load(std::memory_order_acquire) != expect) continue;
      if (auto now = counter.value(); now && *now >= expect) continue;  // read long done: nothing to wait on
      auto sync = counter.at(expect);
      // The newest release this consumer has promised, up to a quarter of the ring further on.
      for (std::uint64_t v = expect + options.slots / 4; v > expect; --v)
        if (c.gpu_release[(v - 1) % options.slots].load(std::memory_order_acquire) == v) {
          sync.ahead = v;
          break;
        }
      waits.push_back(sync);
    }
  }

  void service_loop();
  void accept_all();
  void admit(UniqueFd sock);
  void drop_connection(std::size_t i) {
    freed_at[connections[i].index] = Clock::now();
    auto& c = control->consumers[connections[i].index];
    c.state.store(0, std::memory_order_seq_cst);
    release_gpu_waits(connections[i].index);
    futex_wake_all(control->space_futex);  // a producer waiting on this consumer's slots goes on
    connections.erase(connections.begin() + static_cast<long>(i));
  }
};

void detail::ProducerState::accept_all() {
  for (;;) {
    UniqueFd sock(::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!sock) return;  // EAGAIN: the backlog is empty (the listening socket does not block)
    auto cred = peer_credentials(sock.get());
    if (!cred) continue;
    if (cred->uid != ::getuid()) {
      (void)send_refuse(sock.get(),
                        str_format("uid {} may not use this channel (owner uid {})", cred->uid, ::getuid()));
      continue;
    }
    // A flood of connections that never speak: the oldest one makes room, so a real consumer
    // behind them still gets in.
    if (pending.size() >= kMaxPending) pending.erase(pending.begin());
    pending.push_back({std::move(sock), Clock::now() + kHelloTimeout});
  }
}

void detail::ProducerState::admit(UniqueFd sock) {
  auto msg = recv_message(sock.get(), 0ms);  // readable: a frame, junk or a hang-up is there
  if (!msg) {                                // dead clients get a hang-up; confused ones are told why first
    if (msg.error().code() == Errc::Malformed) (void)send_refuse(sock.get(), msg.error().message());
    return;
  }
  auto hs = detail::decode(msg->payload, msg->fds.size());
  if (!hs || !std::holds_alternative<detail::Hello>(*hs)) {
    (void)send_refuse(sock.get(), hs ? "expected a Hello message" : hs.error().message());
    return;
  }
  const auto& peer = std::get<detail::Hello>(*hs).location;
  auto probe = transport->can_connect(me, peer, env);
  if (!probe.ok) {
    (void)send_refuse(sock.get(), str_format("this channel uses the {} transport, which cannot reach you: {}",
                                             transport->name(), probe.reason));
    return;
  }
  // The free index left longest ago (never used first): a consumer that died with GPU work queued
  // has had the most time to stop before its release counter becomes another consumer's.
  std::uint32_t index = options.max_consumers;
  for (std::uint32_t i = 0; i < options.max_consumers; ++i) {
    bool taken = false;
    for (const auto& c : connections) taken |= c.index == i;
    if (!taken && (index == options.max_consumers || freed_at[i] < freed_at[index])) index = i;
  }
  if (index == options.max_consumers) {
    (void)send_refuse(sock.get(), str_format("channel already has its maximum of {} consumers", options.max_consumers));
    return;
  }
  detail::Welcome w;
  w.consumer_index = index;
  w.slots = options.slots;
  w.slot_size = options.slot_size;
  w.producer_pid = me.pid;
  w.transport = std::string(transport->name());
  w.route_reason = probe.reason;
  std::vector<Export> exports;
  auto cex = control_mem->export_handle();
  if (!cex) return (void)send_refuse(sock.get(), cex.error().message());
  w.control = cex->descriptor;
  exports.push_back(std::move(*cex));
  for (const auto& b : ring) {
    auto ex = b->export_handle();
    if (!ex) return (void)send_refuse(sock.get(), ex.error().message());
    w.ring.push_back(ex->descriptor);
    exports.push_back(std::move(*ex));
  }
  std::vector<int> fds;
  for (const auto& e : exports) fds.push_back(e.fd.get());
  UniqueFd sem_fd, release_fd;
  if (timeline) {
    auto exported = timeline->export_fd();
    if (!exported) return (void)send_refuse(sock.get(), exported.error().message());
    sem_fd = std::move(*exported);
    fds.push_back(sem_fd.get());
    w.timeline = true;
    if (!release[index]) {
      auto sem = GpuSemaphore::create(*env.vulkan, SemaphoreKind::Timeline);
      if (!sem) return (void)send_refuse(sock.get(), sem.error().message());
      release[index] = std::make_unique<GpuSemaphore>(std::move(*sem));
    }
    auto rex = release[index]->export_fd();
    if (!rex) return (void)send_refuse(sock.get(), rex.error().message());
    release_fd = std::move(*rex);
    fds.push_back(release_fd.get());
    w.release_timeline = true;
  }
  if (flag_block) {
    auto fex = flag_block->export_handle();
    if (!fex) return (void)send_refuse(sock.get(), fex.error().message());
    w.flag_block = fex->descriptor;
    exports.push_back(std::move(*fex));
    fds.push_back(exports.back().fd.get());
    // This consumer's release counter: a block only it (and this producer) maps, so it cannot
    // move another consumer's; at an index used before, the next word of the block, starting
    // from 0, so GPU writes an earlier consumer there still had queued cannot take it down.
    if (!release_blocks[index]) {
      auto block = allocate_flag_block(*env.vulkan, detail::kReleaseBlockSize);
      if (!block) return (void)send_refuse(sock.get(), block.error().message());
      release_blocks[index] = std::move(*block);
    } else {
      const std::uint64_t next = (release_offset[index].load() + detail::kFlagStride) % detail::kReleaseBlockSize;
      std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(release_blocks[index]->host_ptr() + next))
          .store(0, std::memory_order_release);
      release_offset[index].store(next, std::memory_order_release);
    }
    auto rex = release_blocks[index]->export_handle();
    if (!rex) return (void)send_refuse(sock.get(), rex.error().message());
    w.release_block = rex->descriptor;
    w.release_offset = release_offset[index].load();
    exports.push_back(std::move(*rex));
    fds.push_back(exports.back().fd.get());
  }
  // Start the consumer at the head: it sees every message published from now on. The producer
  // stores the head and later scans the states without a fence of its own between the two, so
  // the head read before the state is set may be stale: a scan that missed this state may already
  // have let the producer overwrite messages up to the head that scan had published. The state is
  // set with a lower bound of the head (the producer then waits on it at worst), every thread is
  // fenced, and the head read after that is where the consumer starts: a scan that missed the
  // state published no later head than that one, and every later scan sees the state. A scan
  // between the two sees the early bound: should the producer have published a whole ring past
  // it in that moment, the ring looks full until the bound is raised (FailFast: WouldBlock).
  auto& c = control->consumers[index];
  for (auto& v : c.gpu_release) v.store(0, std::memory_order_relaxed);
  const std::uint64_t early = control->write_seq.load(std::memory_order_acquire);
  c.next.store(early, std::memory_order_seq_cst);
  c.released.store(early, std::memory_order_seq_cst);
  if (slots_used.load() < index + 1) slots_used.store(index + 1, std::memory_order_seq_cst);
  c.state.store(1, std::memory_order_seq_cst);
  // Not admitted after all: a producer may wait on this consumer's slots.
  auto withdraw = [&] {
    c.state.store(0, std::memory_order_seq_cst);
    futex_wake_all(control->space_futex);
  };
  if (!admission_fence.heavy()) {
    withdraw();
    return (void)send_refuse(sock.get(), "the kernel refused the memory barrier that admission needs");
  }
  const std::uint64_t head = control->write_seq.load(std::memory_order_seq_cst);
  // Raised, not stored: a DropOldest producer may have moved them past `early` meanwhile.
  raise_to(c.next, head);
  raise_to(c.released, head);
  if (head != early) futex_wake_all(control->space_futex);  // a producer that saw `early` waits on it
  if (!send_message(sock.get(), detail::encode(w), fds)) return withdraw();
  connections.push_back({std::move(sock), index});
}

void detail::ProducerState::service_loop() {
  std::vector<pollfd> p;
  for (;;) {
    p.clear();
    p.push_back({stop_fd.get(), POLLIN, 0});
    p.push_back({listen_fd.get(), POLLIN, 0});
    for (const auto& c : pending) p.push_back({c.sock.get(), POLLIN, 0});
    for (const auto& c : connections) p.push_back({c.sock.get(), POLLIN, 0});
    int wait_ms = -1;
    if (!pending.empty()) {
      auto first = pending.front().deadline;
      for (const auto& c : pending) first = std::min(first, c.deadline);
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(first - Clock::now()).count();
      wait_ms = static_cast<int>(std::clamp<long long>(left, 0, 1000));
    }
    if (::poll(p.data(), p.size(), wait_ms) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[0].revents) return;
    const std::size_t first_conn = 2 + pending.size();
    // Consumers: after the handshake they never send; readable means hang-up (or junk: dropped).
    for (std::size_t i = p.size(); i-- > first_conn;)
      if (p[i].revents) drop_connection(i - first_conn);
    // Handshakes: whoever has spoken is answered now; whoever ran out of time is hung up on.
    const auto now = Clock::now();
    for (std::size_t i = first_conn; i-- > 2;) {
      auto& c = pending[i - 2];
      if (!p[i].revents && c.deadline > now) continue;
      UniqueFd sock = std::move(c.sock);
      pending.erase(pending.begin() + static_cast<long>(i - 2));
      if (p[i].revents) admit(std::move(sock));
    }
    if (p[1].revents & POLLIN) accept_all();
  }
}

Producer::Producer(std::unique_ptr<detail::ProducerState> impl) : impl_(std::move(impl)), hot_(impl_.get()) {}
Producer::~Producer() {
  // A Loan still out keeps the ring mapped (its bytes stay valid) and deletes it when dropped.
  if (impl_ && impl_->loans_out()) {
    impl_->close();
    impl_->orphaned = true;
    impl_->plain = impl_->loans_plain = false;
    (void)impl_.release();
  }
}

namespace {

/// A ring buffer rented from the producer's pool, of the memory its transport would allocate.
Result<std::unique_ptr<Buffer>> rent_ring_buffer(MemoryPool& pool, TransportKind transport, const TransportEnv& env,
                                                 std::uint64_t size) {
  constexpr const char* call = "Producer::create";
  BufferKind kind = BufferKind::CpuShared;
  if (transport == TransportKind::Vulkan) {
    const auto& theirs = pool.options().vulkan;
    if (pool.options().device_segments)
      return fail(Errc::InvalidArgument, call,
                  "ProducerOptions::pool: the pool's device memory comes from PoolOptions::device_segments (e.g. a "
                  "CUDA pool), which a Vulkan ring cannot use");
    if (!env.vulkan || !theirs || *theirs->device() != *env.vulkan->device())
      return fail(Errc::InvalidArgument, call,
                  "ProducerOptions::pool: a Vulkan ring's pool must be on the producer's Vulkan context (pass the "
                  "pool's context as ProducerOptions::vulkan)");
    kind = BufferKind::GpuDeviceLocal;
  } else if (transport != TransportKind::Shm) {
    return fail(Errc::InvalidArgument, call,
                str_format("ProducerOptions::pool serves rings in shared memory and Vulkan memory, not on the {} "
                           "transport",
                           to_string(transport)));
  }
  LF_TRY(auto b, pool.rent(size, kind));
  return std::unique_ptr<Buffer>(std::make_unique<PooledBuffer>(std::move(b)));
}

}  // namespace

Result<std::unique_ptr<Producer>> Producer::create(const std::string& name, ProducerOptions o) {
  constexpr const char* call = "Producer::create";
  if (auto ok = check_name(name); !ok) return std::unexpected(ok.error().within(call));
  if (o.slots > kMaxSlots)
    return fail(Errc::InvalidArgument, call, str_format("{} slots: must be 1 to {}", o.slots, kMaxSlots));
  if (o.slot_size == 0 || o.slot_size > detail::kMaxSlotSize)
    return fail(Errc::InvalidArgument, call, str_format("slot size {} out of range", o.slot_size));
  if (o.max_consumers == 0 || o.max_consumers > kMaxConsumers)
    return fail(Errc::InvalidArgument, call,
                str_format("max_consumers {}: must be 1 to {}", o.max_consumers, kMaxConsumers));
  if (o.await_consumers > o.max_consumers)
    return fail(Errc::InvalidArgument, call,
                str_format("await_consumers {} exceeds max_consumers {}", o.await_consumers, o.max_consumers));
  if (o.transports.empty()) o.transports = local_transports();

  auto impl = std::make_unique<detail::ProducerState>();
  impl->name = name;
  const auto dir = o.directory.empty() ? default_channel_directory() : o.directory;
  if (auto ok = detail::private_directory(dir, true); !ok) return std::unexpected(ok.error().within(call));
  impl->socket_path = dir / (name + ".sock");
  impl->lock_path = dir / (name + ".lock");

  reclaim_stale_names(dir);
  // Another process's reclaim_stale_names holds a free name's lock for a moment while it looks at
  // it: only a lock still held after a few tries belongs to a live producer.
  Result<UniqueFd> lock = UniqueFd();
  (void)detail::wait_for(
      [&] {
        lock = detail::lock_file(impl->lock_path, true);
        return !lock || bool(*lock);
      },
      detail::never_stop, detail::Nap{1ms}, WaitMode::Block, 20ms, {}, [] { return Error(Errc::Timeout, "", ""); });
  if (!lock) return std::unexpected(lock.error().within(call));
  if (!*lock)
    return fail(Errc::PermissionDenied, call, str_format("channel \"{}\" is in use by a live producer", name));
  impl->lock_fd = std::move(*lock);

  // Route.
  const bool want_vulkan = !o.transport || o.transport == TransportKind::Vulkan;
  if (o.vulkan) {
    impl->env.vulkan = o.vulkan;
  } else if (want_vulkan) {
    bool has_vulkan = false;
    for (const auto& t : o.transports) has_vulkan |= t->kind() == TransportKind::Vulkan;
    if (has_vulkan) {
      if (auto ctx = VulkanContext::create(); ctx) impl->own_vulkan.emplace(std::move(*ctx));
      if (impl->own_vulkan) impl->env.vulkan = &*impl->own_vulkan;
    }
  }
  LF_TRY(impl->me, my_location(o.host, impl->env.vulkan, false));
  auto route = choose_route(o.transports, impl->me, o.peer, impl->env, o.transport);
  if (!route) return std::unexpected(route.error().within(call));
  impl->transport = route->transport;
  impl->route = {route->transport->kind(), route->reason};
  if (impl->route.transport == TransportKind::Mpi)
    return fail(Errc::Unsupported, call,
                "a channel over MPI is made between ranks (mpi::open_producer / open_consumer), not by name: "
                "its ring buffers never travel as fds");

  if (o.slots == 0)
    o.slots = impl->route.transport == TransportKind::Vulkan && impl->env.vulkan &&
                      impl->env.vulkan->capabilities().type != vk::PhysicalDeviceType::eCpu
                  ? ProducerOptions::kGpuSlots
                  : ProducerOptions::kHostSlots;

  // Control block and ring, allocated once.
  auto control = CpuBuffer::allocate({.size = sizeof(ControlBlock), .strategy = CpuStrategy::SharedMemory});
  if (!control) return std::unexpected(control.error().within(call));
  impl->control_mem.emplace(std::move(*control));
  impl->control = new (impl->control_mem->host_ptr()) ControlBlock{};
  impl->control->magic = kControlMagic;
  impl->control->version = kControlVersion;
  impl->control->slots = o.slots;
  impl->control->max_consumers = o.max_consumers;
  impl->control->slot_size = o.slot_size;
  impl->control->drop_oldest = o.policy == FullPolicy::DropOldest;
  impl->control->producer_blocks = o.wait != WaitMode::BusyPoll;
  for (std::uint32_t i = 0; i < o.slots; ++i) {
    auto b = o.pool ? rent_ring_buffer(*o.pool, impl->route.transport, impl->env, o.slot_size)
                    : impl->transport->allocate(impl->env, o.slot_size);
    if (!b) return std::unexpected(b.error().within(call));
    impl->ring.push_back(std::move(*b));
  }
  impl->pooled_ring = o.pool != nullptr;

  const bool gpu_ring = impl->transport->kind() == TransportKind::Vulkan && impl->env.vulkan;
  if (o.gpu_sync == GpuSyncKind::Flag && gpu_ring) {
    auto block = allocate_flag_block(*impl->env.vulkan, detail::kFlagBlockSize);
    if (!block) return std::unexpected(block.error().within(call));
    const bool local = static_cast<bool>(vk::MemoryPropertyFlags((*block)->descriptor().memory_flags) &
                                         vk::MemoryPropertyFlagBits::eDeviceLocal);
    impl->flag_block = std::move(*block);
    impl->route.reason +=
        str_format("; GPU work ordered by flags in {} memory (CUDA streams wait on them; other APIs on the host)",
                   local ? "device-local" : "host");
    if (auto note = gpu_sharing_note(impl->env.vulkan->capabilities()); !note.empty())
      impl->route.reason += "; " + note;
  } else if (gpu_ring) {
    const auto& caps = impl->env.vulkan->capabilities();
    if (caps.timeline_semaphore && caps.timeline_fd_export) {
      auto sem = GpuSemaphore::create(*impl->env.vulkan, SemaphoreKind::Timeline);
      if (!sem) return std::unexpected(sem.error().within(call));
      impl->timeline.emplace(std::move(*sem));
      impl->route.reason += "; GPU work ordered by a shared timeline semaphore";
      if (auto note = gpu_sharing_note(caps); !note.empty()) impl->route.reason += "; " + note;
    } else {
      impl->route.reason += "; no exportable timeline semaphore here: GPU writes are finished with a CPU fence wait";
    }
  }

  // Socket: a stale one from a crashed producer is ours to replace (we hold the lock).
  ::unlink(impl->socket_path.c_str());
  LF_TRY(impl->listen_fd, unix_socket());
  if (::fcntl(impl->listen_fd.get(), F_SETFL, O_NONBLOCK) != 0)
    return std::unexpected(from_errno(errno, "fcntl(O_NONBLOCK)").within(call));
  LF_TRY(auto addr, address(impl->socket_path));
  if (::bind(impl->listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return std::unexpected(from_errno(errno, "bind", impl->socket_path.string()).within(call));
  if (::listen(impl->listen_fd.get(), 64) != 0) return std::unexpected(from_errno(errno, "listen").within(call));
  int ev = ::eventfd(0, EFD_CLOEXEC);
  if (ev < 0) return std::unexpected(from_errno(errno, "eventfd").within(call));
  impl->stop_fd.reset(ev);
  impl->options = std::move(o);
  impl->ring_slots = impl->options.slots;
  impl->ring_slot_size = impl->options.slot_size;
  impl->slot_headers = impl->control->ring;
  impl->published_word = &impl->control->write_seq;
  impl->blocking_consumers = &impl->control->blocking_consumers;
  impl->consumers_waiting = &impl->control->consumers_waiting;
  impl->loans_plain = impl->options.await_consumers == 0 && !impl->written();
  impl->plain = impl->loans_plain && !impl->options.timestamps;
  impl->service = std::thread([p = impl.get()] { p->service_loop(); });
  return std::unique_ptr<Producer>(new Producer(std::move(impl)));
}

void Producer::close() {
  impl_->close();
  impl_->user_closed = true;
  impl_->plain = impl_->loans_plain = false;
}
bool Producer::closed() const { return impl_->user_closed; }

Result<Loan> Producer::loan_general(Duration timeout) {
  auto& m = *impl_;
  constexpr const char* call = "Producer::loan";
  if (m.user_closed) return fail(Errc::InvalidArgument, call, "the producer is closed");
  if (m.link) {
    LF_TRY(auto slot, m.link->loan(timeout));
    ++m.link_loans;
    return Result<Loan>(std::in_place, Loan(&m, m.link->next_sequence(), slot));
  }
  if (m.loan_out) return fail(Errc::InvalidArgument, call, "the previous loan is not published or dropped yet");
  const std::uint64_t seq = m.write_seq;
  // The deadline starts when something must wait: a loan that waits for nothing reads no clock.
  LazyDeadline deadline(timeout);
  if (m.options.await_consumers != 0 && !(m.consumers_seen && m.count_consumers() >= m.options.await_consumers))
    LF_TRY_STATUS(m.await_consumers(deadline.left(), call));
  const bool fail_fast = m.options.policy == FullPolicy::FailFast;
  auto ready = [&] { return m.room_for(seq); };
  if (!ready()) {
    if (fail_fast) return fail(Errc::WouldBlock, call, "ring full: a consumer has not released its oldest message");
    auto never = [] { return std::optional<Error>(); };
    auto ok =
        wait_until(ready, never, m.control->space_futex, m.control->producer_waiting, m.options.wait, deadline, call);
    if (!ok) {
      if (ok.error().code() == Errc::Timeout)
        return fail(Errc::Timeout, call, "ring full: no consumer released a slot in time");
      return std::unexpected(ok.error());
    }
  }
  auto& waits = m.loan_waits;
  waits.clear();
  m.collect_release_waits(seq, m.write_slot);
  if (!waits.empty() && m.options.host_wait_for_gpu_release) {
    for (const auto& w : waits)
      if (auto ok = wait_on_host(w, fail_fast ? Duration::zero() : deadline.left()); !ok) {
        if (ok.error().code() != Errc::Timeout) return std::unexpected(ok.error());
        if (fail_fast || timeout == Duration::zero())
          return fail(Errc::WouldBlock, call, "a consumer's GPU is still reading the slot's previous message");
        return fail(Errc::Timeout, call, "a consumer's GPU did not finish reading the slot in time");
      }
    waits.clear();
  }
  m.loan_out = true;
  return Result<Loan>(std::in_place, Loan(&m, seq, m.write_slot));
}

Result<Loan> Producer::try_loan() {
  auto& m = *impl_;
  if (m.user_closed) return fail(Errc::InvalidArgument, "Producer::try_loan", "the producer is closed");
  if (!m.link && !m.loan_out && !m.room_for(m.write_seq))
    return fail(Errc::WouldBlock, "Producer::try_loan", "ring full: a consumer has not released its oldest message");
  return loan(Duration(0));
}

void Producer::wake_consumers() { futex_wake_all(impl_->control->data_futex); }

void Producer::look_for_room() { (void)impl_->slot_free(impl_->write_seq); }

Result<MessageInfo> Producer::publish_general(Loan&& loan, MessageInfo info) {
  auto& m = *impl_;
  constexpr const char* call = "Producer::publish";
  if (m.user_closed) return fail(Errc::InvalidArgument, call, "the producer is closed");
  if (info.size == 0) info.size = m.options.slot_size;
  if (info.size > m.options.slot_size)
    return fail(Errc::InvalidArgument, call,
                str_format("size {} exceeds the slot size {}", info.size, m.options.slot_size));
  if (m.link)
    return detail::publish_linked(*this, std::move(loan), [&](detail::ProducerLink& link, std::uint32_t slot) {
      return link.publish(slot, info);
    });
  if (loan.impl_ != &m || loan.seq_ != m.write_seq)
    return fail(Errc::InvalidArgument, call, "loan does not belong to this producer's current slot");
  // The answer is assembled from scalars rather than by updating `info` in place: a copy of a
  // struct just partly rewritten stalls on store forwarding, on every message.
  const std::uint64_t size = info.size, tag = info.user_tag, seq = loan.seq_;
  const std::uint64_t stamp = m.options.timestamps ? now_ns() : 0;
  const bool wake = m.hand_off(loan.slot_, seq, size, tag, stamp, loan.gpu_signaled_ ? kGpuOrdered : 0);
  loan.impl_ = nullptr;
  if (wake) wake_consumers();
  if (m.write_seq - m.min_released >= m.ring_slots) look_for_room();
  return MessageInfo{.size = size, .user_tag = tag, .timestamp_ns = stamp, .sequence = seq};
}

Result<MessageInfo> Producer::publish(Loan&& loan, vk::Fence gpu_done, MessageInfo info, Duration timeout) {
  constexpr const char* call = "Producer::publish(fence)";
  auto& m = *impl_;
  if (!m.env.vulkan) return fail(Errc::InvalidArgument, call, "this channel has no Vulkan context to wait with");
  auto waited = detail::vk_call("vkWaitForFences", [&]() -> Status {
    const auto ns = timeout == kForever ? UINT64_MAX : static_cast<std::uint64_t>(timeout.count());
    if (m.env.vulkan->device().waitForFences(gpu_done, VK_TRUE, ns) == vk::Result::eTimeout)
      return fail(Errc::Timeout, call, "the GPU work writing the buffer did not finish in time");
    return {};
  });
  if (!waited) return std::unexpected(waited.error());
  return publish(std::move(loan), info);
}

bool Producer::has_gpu_timeline() const { return impl_->timeline.has_value(); }
std::optional<GpuSyncKind> Producer::gpu_sync() const {
  if (!impl_->written()) return std::nullopt;
  return impl_->flag_block ? GpuSyncKind::Flag : GpuSyncKind::Semaphore;
}

detail::ProducerState& Loan::state() const { return static_cast<detail::ProducerState&>(*impl_); }

std::optional<GpuSync> Loan::gpu_signal_point() const {
  if (!impl_) return std::nullopt;
  const auto written = state().written();
  if (!written) return std::nullopt;
  return written.at(seq_ + 1);
}

std::optional<GpuSync> Loan::gpu_signal() {
  auto point = gpu_signal_point();
  if (point) gpu_signaled_ = true;
  return point;
}

const ChannelRoute& Producer::route() const { return impl_->route; }
const std::string& Producer::name() const { return impl_->name; }
std::uint32_t Producer::slots() const { return impl_->options.slots; }
std::uint64_t Producer::slot_size() const { return impl_->options.slot_size; }
const VulkanContext* Producer::vulkan() const {
  if (impl_->link) return impl_->env.vulkan;
  return impl_->transport->kind() == TransportKind::Vulkan ? impl_->env.vulkan : nullptr;
}
std::uint32_t Producer::consumer_count() const { return impl_->count_consumers(); }

Status Producer::flush(Duration timeout) {
  auto& m = *impl_;
  if (m.link) return m.link->flush(timeout);
  auto drained = [&] {
    for (std::uint32_t i = 0; i < m.options.max_consumers; ++i) {
      const auto& c = m.control->consumers[i];
      if (c.state.load(std::memory_order_acquire) == 1 && c.released.load(std::memory_order_acquire) != m.write_seq)
        return false;
    }
    return true;
  };
  auto never = [] { return std::optional<Error>(); };
  // A busy-polling producer never sleeps (its consumers do not wake it): it polls here too.
  LazyDeadline deadline(timeout);
  return wait_until(drained, never, m.control->space_futex, m.control->producer_waiting,
                    m.options.wait == WaitMode::BusyPoll ? WaitMode::BusyPoll : WaitMode::Block, deadline,
                    "Producer::flush");
}

Status Producer::wait_for_consumers(std::uint32_t n, Duration timeout) {
  return impl_->wait_attached(n, timeout, [&] {
    return Error(Errc::Timeout, "Producer::wait_for_consumers",
                 str_format("{} of {} consumers connected", consumer_count(), n));
  });
}

Loan& Loan::operator=(Loan&& o) noexcept {
  if (this != &o) {
    if (impl_) abandon();
    impl_ = std::exchange(o.impl_, nullptr);
    seq_ = o.seq_;
    slot_ = o.slot_;
    gpu_signaled_ = o.gpu_signaled_;
  }
  return *this;
}
void Loan::abandon() {
  auto& m = state();
  impl_ = nullptr;
  m.abandon(seq_, slot_);
}
std::span<const GpuSync> Loan::gpu_waits() const {
  if (!impl_ || state().link) return {};
  return state().loan_waits;
}
std::span<std::byte> Loan::bytes() const { return impl_ ? state().ring[slot_]->bytes() : std::span<std::byte>(); }
Buffer& Loan::buffer() const { return *state().ring[slot_]; }

// ---------------------------------------------------------------------------------------------
// Consumer

// ConsumerHot holds what the inline receive and release use (channel_hot.hpp).
struct detail::ConsumerState : ConsumerHot {
  ConsumerOptions options;
  ChannelRoute route;
  std::shared_ptr<const Transport> transport;
  std::optional<VulkanContext> own_vulkan;
  TransportEnv env;
  std::optional<CpuBuffer> control_mem;
  ControlBlock* control = nullptr;
  SharedConsumer* self = nullptr;
  bool counted_blocking = false;  // counted in control->blocking_consumers
  std::int32_t producer_pid = 0;
  bool contended_next = false;                   // DropOldest: the producer may move `next` too, so claim by CAS
  std::optional<GpuSemaphore> timeline;          // imported shared timeline (Vulkan transport)
  std::optional<GpuSemaphore> release_timeline;  // ours, owned by the producer: value n + 1 = read of n done
  std::unique_ptr<Buffer> flag_block;            // flag channels instead of the two timelines: written,
  std::unique_ptr<Buffer> release_block;         // and ours, at release_offset
  std::uint64_t release_offset = 0;
  std::uint32_t index = 0;             // ours among the consumers
  std::uint64_t last_gpu_release = 0;  // the highest value handed out by gpu_release()
  // The highest written-counter value a GPU wait of ours may be blocked on (message n: n + 1). Should
  // the producer die before its GPU signals it, the watcher signals it so no queue of ours hangs;
  // a wait queued after that is signalled for at once. Guarded by gpu_mutex, with lost_at.
  std::mutex gpu_mutex;
  std::uint64_t gpu_wait_high = 0;
  std::uint64_t lost_at = UINT64_MAX;  // the timeline's value when the producer was found gone
  std::vector<std::unique_ptr<Buffer>> ring;
  UniqueFd sock, stop_fd;
  std::atomic<bool> lost{false};
  std::string lost_reason;  // written before `lost` is set
  std::thread watcher;
  bool orphaned = false;     // the Consumer is gone; the last outstanding Received deletes this
  bool user_closed = false;  // Consumer::close() ran
  // A route whose link moves the messages (MPI): no control block, socket or watcher; the ring
  // holds the link's buffers.
  std::unique_ptr<detail::ConsumerLink> link;

  /// Stops watching the producer and hangs up: the producer stops counting this consumer.
  void disconnect() {
    if (link) link->close();
    if (watcher.joinable()) {
      std::uint64_t one = 1;
      (void)!::write(stop_fd.get(), &one, sizeof one);
      watcher.join();
    }
    sock.reset();
  }

  /// `gpu_release`: n + 1 when message n (in `slot`) was released on the GPU, else 0.
  void release(std::uint32_t slot, std::uint64_t gpu_release = 0);

  [[nodiscard]] Counter written() const {
    if (flag_block) return Counter(*flag_block, 0);
    return timeline ? Counter(*timeline) : Counter();
  }
  [[nodiscard]] Counter released_by_us() const {
    if (flag_block) return release_block ? Counter(*release_block, release_offset) : Counter();
    return release_timeline ? Counter(*release_timeline) : Counter();
  }

  ~ConsumerState() {
    if (counted_blocking) control->blocking_consumers.fetch_sub(1, std::memory_order_seq_cst);
    disconnect();
  }

  void watch() {
    pollfd p[2] = {{stop_fd.get(), POLLIN, 0}, {sock.get(), POLLIN, 0}};
    for (;;) {
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[0].revents) return;
      if (p[1].revents) {
        {
          std::lock_guard lock(gpu_mutex);
          lost_reason = str_format("producer (pid {}) hung up: it exited or was killed", producer_pid);
          if (const auto w = written()) {
            const auto now = w.value();
            lost_at = now ? *now : 0;
          }
          lost.store(true, std::memory_order_seq_cst);
          signal_owed();
        }
        futex_wake_all(control->data_futex);
        return;
      }
    }
  }

  /// GPU work of ours waiting for writes the dead producer's GPU will never signal goes on. Other
  /// consumers may be signalling the same timeline: one at a time (a peer that holds the lock
  /// longer than a moment is ignored rather than waited for).
  void signal_owed() {
    const auto w = written();
    if (!w) return;
    const auto deadline = std::chrono::steady_clock::now() + 100ms;
    std::uint32_t unlocked = 0;
    bool locked = false;
    while (!(locked = control->timeline_lock.compare_exchange_weak(unlocked, 1, std::memory_order_acquire)) &&
           std::chrono::steady_clock::now() < deadline) {
      unlocked = 0;
      std::this_thread::yield();
    }
    (void)w.raise(gpu_wait_high);
    if (locked) control->timeline_lock.store(0, std::memory_order_release);
  }

  /// Before GPU work of ours waits for timeline value `v`: should the producer be gone already,
  /// nothing else will signal it.
  void raise_gpu_wait(std::uint64_t v) {
    std::lock_guard lock(gpu_mutex);
    if (v <= gpu_wait_high) return;
    gpu_wait_high = v;
    if (lost.load(std::memory_order_seq_cst)) signal_owed();
  }

  /// Whether the producer died before its GPU reached value `v` (the watcher signalled it).
  bool lost_before(std::uint64_t v) {
    std::lock_guard lock(gpu_mutex);
    return lost.load(std::memory_order_seq_cst) && v > lost_at;
  }

  /// Waits until this consumer's next message is published (see message_ready).
  [[gnu::noinline]] Status await_message(LazyDeadline& deadline, std::uint64_t& n, std::uint32_t& k,
                                         std::uint64_t spun = 0) {
    auto ready = [&] { return message_ready(n, k); };
    auto stop = [&] { return gone(); };
    return wait_until(ready, stop, control->data_futex, control->consumers_waiting, options.wait, deadline,
                      "Consumer::receive", spun);
  }

  std::optional<Error> gone() const {
    if (lost.load(std::memory_order_seq_cst)) return Error(Errc::PeerLost, "Consumer::receive", lost_reason);
    if (control->closed.load(std::memory_order_seq_cst))
      return Error(Errc::PeerLost, "Consumer::receive",
                   str_format("producer (pid {}) closed the channel", producer_pid));
    return std::nullopt;
  }
};

Consumer::Consumer(std::unique_ptr<detail::ConsumerState> impl) : impl_(std::move(impl)), hot_(impl_.get()) {}
Consumer::~Consumer() {
  // Messages still held keep the ring mapped and their slots taken, so their bytes stay valid
  // and unchanged; the last one released ends the connection.
  if (impl_ && impl_->held != 0) {
    impl_->orphaned = true;
    impl_->plain = false;
    (void)impl_.release();
  }
}

Result<std::unique_ptr<Consumer>> Consumer::open(const std::string& name, ConsumerOptions o) {
  constexpr const char* call = "Consumer::open";
  if (auto ok = check_name(name); !ok) return std::unexpected(ok.error().within(call));
  if (o.transports.empty()) o.transports = local_transports();
  auto impl = std::make_unique<detail::ConsumerState>();
  const auto dir = o.directory.empty() ? default_channel_directory() : o.directory;
  const auto path = dir / (name + ".sock");
  LF_TRY(auto addr, address(path));
  const Deadline dl(o.connect_timeout);
  // Where this process is, before it connects: finding the devices can take long (every Vulkan
  // driver loads), and a producer drops a connection that says nothing for a while.
  LF_TRY(auto me, my_location(o.host, o.vulkan, true));

  // Connect, in any start order: wait for the producer to appear (nothing wakes us when it does).
  LF_TRY_STATUS(detail::wait_for(
      [&]() -> Result<bool> {
        if (::access(dir.c_str(), F_OK) == 0) {
          if (auto ok = detail::private_directory(dir, false); !ok) return std::unexpected(ok.error().within(call));
        }
        LF_TRY(impl->sock, unix_socket());
        if (::connect(impl->sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return true;
        const int err = errno;
        if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN)
          return std::unexpected(from_errno(err, "connect", path.string()).within(call));
        return false;
      },
      detail::never_stop, detail::Nap{5ms}, WaitMode::Block, o.connect_timeout, {},
      [&] {
        return Error(Errc::Timeout, call,
                     str_format("no producer for channel \"{}\" appeared at {}", name, path.string()));
      }));
  LF_TRY(auto cred, peer_credentials(impl->sock.get()));
  if (cred.uid != ::getuid())
    return fail(Errc::PermissionDenied, call,
                str_format("the producer of \"{}\" runs as uid {}, this process as uid {}: refused", name, cred.uid,
                           ::getuid()));

  if (auto s = send_message(impl->sock.get(), detail::encode(detail::Hello{me})); !s)
    return std::unexpected(s.error().within(call));
  auto msg = recv_message(impl->sock.get(),
                          std::chrono::duration_cast<std::chrono::milliseconds>(std::max(dl.left(), Duration(5s))));
  if (!msg) return std::unexpected(msg.error().within(call));
  auto hs = detail::decode(msg->payload, msg->fds.size());
  if (!hs) return std::unexpected(hs.error().within(call));
  if (auto* r = std::get_if<detail::Refuse>(&*hs))
    return fail(Errc::PermissionDenied, call, "producer refused: " + r->reason);
  if (!std::holds_alternative<detail::Welcome>(*hs)) return fail(Errc::Malformed, call, "expected a Welcome message");
  auto& w = std::get<detail::Welcome>(*hs);

  auto kind = parse_transport(w.transport);
  if (!kind) return fail(Errc::Malformed, call, str_format("producer names {}", kind.error().cause()));
  for (const auto& t : o.transports)
    if (t->kind() == *kind) impl->transport = t;
  if (!impl->transport)
    return fail(Errc::Unsupported, call,
                str_format("channel uses transport {}, which this consumer was not given", w.transport));
  impl->route = {*kind, w.route_reason};
  impl->slots = w.slots;
  impl->slot_size = w.slot_size;
  impl->producer_pid = w.producer_pid;

  if (w.control.size < sizeof(ControlBlock))
    return fail(Errc::Malformed, call,
                str_format("control block of {} bytes, need {}", w.control.size, sizeof(ControlBlock)));
  auto control = CpuBuffer::import(w.control, std::move(msg->fds[0]));
  if (!control) return std::unexpected(control.error().within(call));
  impl->control_mem.emplace(std::move(*control));
  impl->control = reinterpret_cast<ControlBlock*>(impl->control_mem->host_ptr());
  const auto& cb = *impl->control;
  if (cb.magic != kControlMagic || cb.version != kControlVersion || cb.slots != w.slots ||
      cb.slot_size != w.slot_size || cb.max_consumers > kMaxConsumers || w.consumer_index >= cb.max_consumers ||
      cb.drop_oldest > 1 || cb.producer_blocks > 1)
    return fail(Errc::Malformed, call, "control block does not match the handshake");
  impl->self = &impl->control->consumers[w.consumer_index];
  impl->contended_next = cb.drop_oldest == 1;
  impl->producer_may_sleep = cb.producer_blocks == 1;
  impl->busy_poll = o.wait == WaitMode::BusyPoll;
  impl->slot_headers = impl->control->ring;
  impl->next_word = &impl->self->next;
  impl->released_word = &impl->self->released;
  impl->producer_waiting = &impl->control->producer_waiting;
  if (o.wait != WaitMode::BusyPoll) {  // the producer must wake us from now on
    impl->control->blocking_consumers.fetch_add(1, std::memory_order_seq_cst);
    impl->counted_blocking = true;
  }
  impl->expected = impl->released = impl->self->next.load(std::memory_order_acquire);  // where we joined
  impl->cursor = impl->released;
  impl->cursor_slot = impl->released_slot = static_cast<std::uint32_t>(impl->released % w.slots);

  if (*kind == TransportKind::Vulkan) {
    if (o.vulkan) {
      impl->env.vulkan = o.vulkan;
    } else {
      auto ctx = VulkanContext::create({.device = w.ring[0].device_uuid});
      if (!ctx) return std::unexpected(ctx.error().within(call));
      impl->own_vulkan.emplace(std::move(*ctx));
      impl->env.vulkan = &*impl->own_vulkan;
    }
  }
  for (std::uint32_t i = 0; i < w.slots; ++i) {
    auto b = impl->transport->import(impl->env, w.ring[i], std::move(msg->fds[1 + i]));
    if (!b) return std::unexpected(b.error().within(call));
    impl->ring.push_back(std::move(*b));
  }
  impl->index = w.consumer_index;
  if (w.release_timeline && !w.timeline)
    return fail(Errc::Malformed, call, "the producer announced a release timeline without the channel's timeline");
  if (w.flag_block) {
    if (impl->env.vulkan == nullptr)
      return fail(
          Errc::Malformed, call,
          str_format("the producer announced GPU flags on a {} channel, which has no GPU device", to_string(*kind)));
    // A block of flag words from the producer: host-visible, `need` bytes at `offset`, and each
    // word on its own cache line (off that grid a word would cross lines, or split an atomic access).
    auto flag_words = [&](const ExportDescriptor& d, UniqueFd&& fd, std::uint64_t offset, std::uint64_t need,
                          std::string_view what) -> Result<std::unique_ptr<Buffer>> {
      auto b = impl->transport->import(impl->env, d, std::move(fd));
      if (!b) return std::unexpected(b.error().within(call));
      if ((*b)->host_ptr() == nullptr || (*b)->size() < offset + need)
        return fail(Errc::Malformed, call,
                    str_format("{} is not host-visible GPU memory holding {} bytes at offset {}", what, need, offset));
      if (reinterpret_cast<std::uintptr_t>((*b)->host_ptr() + offset) % detail::kFlagStride != 0)
        return fail(Errc::Malformed, call,
                    str_format("{} starts at offset {}, not on a {}-byte boundary", what, d.offset + offset,
                               detail::kFlagStride));
      return b;
    };
    LF_TRY(impl->flag_block, flag_words(*w.flag_block, std::move(msg->fds[1 + w.slots]), 0, detail::kFlagBlockSize,
                                        "the channel's flag block"));
    LF_TRY(impl->release_block, flag_words(*w.release_block, std::move(msg->fds[2 + w.slots]), w.release_offset, 8,
                                           "this consumer's release counter"));
    impl->release_offset = w.release_offset;
    auto v = impl->released_by_us().value();
    if (!v) return std::unexpected(v.error().within(call));
    impl->last_gpu_release = *v;
  }
  if (w.timeline) {
    if (impl->env.vulkan == nullptr)
      return fail(Errc::Malformed, call,
                  str_format("the producer announced a timeline semaphore on a {} channel, which has no GPU device",
                             to_string(*kind)));
    const auto& caps = impl->env.vulkan->capabilities();
    if (!caps.timeline_semaphore || !caps.semaphore_fd_import)
      return fail(Errc::Unsupported, call,
                  str_format("the channel orders GPU work with a timeline semaphore, which device {} cannot import",
                             caps.identity.name));
    auto sem = GpuSemaphore::import(*impl->env.vulkan, SemaphoreKind::Timeline, std::move(msg->fds[1 + w.slots]));
    if (!sem) return std::unexpected(sem.error().within(call));
    impl->timeline.emplace(std::move(*sem));
    if (w.release_timeline) {
      auto rel = GpuSemaphore::import(*impl->env.vulkan, SemaphoreKind::Timeline, std::move(msg->fds[2 + w.slots]));
      if (!rel) return std::unexpected(rel.error().within(call));
      impl->release_timeline.emplace(std::move(*rel));
      auto v = impl->release_timeline->value();
      if (!v) return std::unexpected(v.error().within(call));
      impl->last_gpu_release = *v;
    }
  }
  impl->done.assign(w.slots, 0);
  impl->plain = !impl->contended_next;
  impl->options = std::move(o);
  int ev = ::eventfd(0, EFD_CLOEXEC);
  if (ev < 0) return std::unexpected(from_errno(errno, "eventfd").within(call));
  impl->stop_fd.reset(ev);
  impl->watcher = std::thread([p = impl.get()] { p->watch(); });
  return std::unique_ptr<Consumer>(new Consumer(std::move(impl)));
}

void Consumer::close() {
  impl_->disconnect();
  impl_->user_closed = true;
  impl_->plain = false;
}
bool Consumer::closed() const { return impl_->user_closed; }

Status Consumer::wait_message(LazyDeadline& deadline, std::uint64_t& n, std::uint32_t& k, std::uint64_t spun) {
  return impl_->await_message(deadline, n, k, spun);
}

Result<Received> Consumer::receive_general(Duration timeout) {
  auto& m = *impl_;
  constexpr const char* call = "Consumer::receive";
  if (m.user_closed) return fail(Errc::InvalidArgument, call, "the consumer is closed");
  if (m.held >= m.slots)
    return fail(Errc::InvalidArgument, call, str_format("all {} ring buffers are held: release one first", m.slots));
  if (m.link) {
    LF_TRY(auto got, m.link->receive(timeout));
    ++m.held;
    m.expected = got.second.sequence + 1;
    return Result<Received>(std::in_place, Received(&m, got.second, 0, got.first, false));
  }
  auto& cb = *m.control;
  // The deadline starts when something must wait (as in loan()).
  LazyDeadline deadline(timeout);
  for (;;) {
    std::uint64_t n = 0;
    std::uint32_t k = 0;
    if (!m.message_ready(n, k)) LF_TRY_STATUS(m.await_message(deadline, n, k));
    // A message whose producer's GPU is still writing it stays in the ring until the write is
    // done: a receive that times out waiting for it loses nothing.
    if (m.options.host_wait_for_gpu && m.written() &&
        (cb.ring[k].flags.load(std::memory_order_relaxed) & kGpuOrdered)) {
      const Duration budget = deadline.left();  // started before raise_gpu_wait, which may take a while
      m.raise_gpu_wait(n + 1);
      if (auto ok = m.written().wait(n + 1, budget); !ok) {
        if (ok.error().code() != Errc::Timeout) return std::unexpected(ok.error().within(call));
        return fail(Errc::Timeout, call, str_format("the producer's GPU did not finish writing message {} in time", n));
      }
    }
    if (m.contended_next) {
      if (!m.self->next.compare_exchange_strong(n, n + 1, std::memory_order_acq_rel)) continue;  // dropped under us
    } else {
      m.self->next.store(n + 1, std::memory_order_release);  // only this consumer moves it
    }
    const auto& slot = cb.ring[k];
    const std::uint64_t marker = slot.seq.load(std::memory_order_acquire);
    const std::uint64_t size = slot.size.load(std::memory_order_relaxed);
    if (marker != n + 1)
      return fail(Errc::Malformed, call, str_format("ring slot holds message {}, expected {}", marker - 1, n));
    if (size > m.slot_size)
      return fail(Errc::Malformed, call, str_format("message size {} exceeds the slot size {}", size, m.slot_size));
    const std::uint64_t missed = m.take(n, k);
    MessageInfo info{size, slot.tag.load(std::memory_order_relaxed), slot.timestamp_ns.load(std::memory_order_relaxed),
                     n};
    const bool gpu_ordered = (slot.flags.load(std::memory_order_relaxed) & kGpuOrdered) && m.written();
    if (gpu_ordered) {
      (void)deadline.get();  // start the deadline first: raise_gpu_wait may take a while
      m.raise_gpu_wait(n + 1);
    }
    if (gpu_ordered && m.options.host_wait_for_gpu) {
      auto ok = m.written().wait(n + 1, deadline.left());
      if (ok && m.lost_before(n + 1))
        ok = fail(Errc::PeerLost, call, str_format("{}, before its GPU finished writing message {}", m.lost_reason, n));
      if (!ok) {
        m.release(k);  // the message is taken but not handed out: give its slot back
        return std::unexpected(ok.error());
      }
    }
    return Result<Received>(std::in_place, Received(&m, info, missed, k, gpu_ordered));
  }
}

Result<Received> Consumer::try_receive() {
  if (impl_->user_closed) return fail(Errc::InvalidArgument, "Consumer::try_receive", "the consumer is closed");
  if (impl_->link) {
    auto r = receive(Duration(0));
    if (!r && r.error().code() == Errc::Timeout)
      return fail(Errc::WouldBlock, "Consumer::try_receive", "no message waiting");
    return r;
  }
  std::uint64_t n = 0;
  std::uint32_t k = 0;
  if (!impl_->message_ready(n, k)) {
    auto e = impl_->gone();
    if (!e) return fail(Errc::WouldBlock, "Consumer::try_receive", "no message waiting");
    // Published before the producer went (see wait_until): received first.
    if (!impl_->message_ready(n, k)) return std::unexpected(*e);
  }
  return receive(Duration(0));
}

void detail::ConsumerState::release(std::uint32_t slot, std::uint64_t gpu_release) {
  auto& m = *this;
  --m.held;
  if (link) {
    link->release(slot);  // counted towards the producer's credit, even after the Consumer is gone
    if (orphaned && held == 0) delete this;
    return;
  }
  if (m.user_closed) {  // hung up: our entry in the control block may be another consumer's now
    if (orphaned && held == 0) delete this;
    return;
  }
  if (gpu_release != 0) m.self->gpu_release[slot].store(gpu_release, std::memory_order_relaxed);
  m.mark_released(slot);
  if (m.store_released()) futex_wake_all(m.control->space_futex);
  if (orphaned && held == 0) delete this;
}

const ChannelRoute& Consumer::route() const { return impl_->route; }
std::uint32_t Consumer::slots() const { return impl_->slots; }
std::uint64_t Consumer::slot_size() const { return impl_->slot_size; }
std::int32_t Consumer::producer_pid() const { return impl_->producer_pid; }
const VulkanContext* Consumer::vulkan() const { return impl_->env.vulkan; }
bool Consumer::has_gpu_timeline() const { return impl_->timeline.has_value(); }
std::optional<GpuSyncKind> Consumer::gpu_sync() const {
  if (!impl_->written()) return std::nullopt;
  return impl_->flag_block ? GpuSyncKind::Flag : GpuSyncKind::Semaphore;
}

const GpuSemaphore* Producer::gpu_timeline() const { return impl_->timeline ? &*impl_->timeline : nullptr; }
const GpuSemaphore* Consumer::gpu_timeline() const { return impl_->timeline ? &*impl_->timeline : nullptr; }
std::uint64_t Consumer::next_sequence() const { return impl_->link ? impl_->link->next_sequence() : impl_->expected; }

Result<Consumer::Upcoming> Consumer::upcoming(std::uint64_t sequence) {
  constexpr const char* call = "Consumer::upcoming";
  auto& m = *impl_;
  if (!m.written())
    return fail(Errc::Unsupported, call, "the channel has no GPU ordering (timeline or flags) to order GPU work ahead");
  if (m.contended_next)
    return fail(Errc::Unsupported, call, "under the DropOldest policy the producer may skip any message");
  if (sequence < m.expected)
    return fail(Errc::InvalidArgument, call,
                str_format("message {} was already received (next is {})", sequence, m.expected));
  if (sequence - m.released >= m.slots)
    return fail(Errc::InvalidArgument, call,
                str_format("message {} would go into the slot of message {}, which this consumer has not released",
                           sequence, sequence - m.slots));
  // The producer's GPU may wait for a release up to a quarter of the ring beyond the one a slot
  // needs (GpuSync::ahead); a release queued behind a wait this far ahead would wait for itself.
  if (const std::uint64_t reach = m.slots - m.slots / 4; sequence - m.released >= reach)
    return fail(Errc::InvalidArgument, call,
                str_format("message {} is {} messages beyond the oldest this consumer has not released ({}); with {} "
                           "slots GPU work may be queued at most {} ahead",
                           sequence, sequence - m.released, m.released, m.slots, reach - 1));
  m.raise_gpu_wait(sequence + 1);
  const auto slot = static_cast<std::uint32_t>(sequence % m.slots);
  return Upcoming{sequence, m.ring[slot].get(), m.written().at(sequence + 1)};
}

const GpuSemaphore* Consumer::gpu_release_timeline() const {
  return impl_->release_timeline ? &*impl_->release_timeline : nullptr;
}

detail::ConsumerState& Received::state() const { return static_cast<detail::ConsumerState&>(*impl_); }

std::optional<GpuSync> Received::gpu_wait() const {
  if (!impl_ || !gpu_ordered_) return std::nullopt;
  return state().written().at(info_.sequence + 1);
}

Result<GpuSync> Received::gpu_release_point() const {
  constexpr const char* call = "Received::gpu_release";
  if (!impl_) return fail(Errc::InvalidArgument, call, "the message is already released");
  auto& m = state();
  const auto counter = m.released_by_us();
  if (!counter)
    return fail(Errc::Unsupported, call,
                "this channel has no GPU ordering (timeline or flags): finish the GPU read (fence) before releasing");
  const std::uint64_t value = info_.sequence + 1;
  if (!gpu_released_ && value <= m.last_gpu_release)
    return fail(Errc::InvalidArgument, call,
                str_format("message {} is older than one already released on the GPU: release in receive order",
                           info_.sequence));
  return counter.at(value);
}

Result<GpuSync> Received::gpu_release() {
  LF_TRY(auto point, gpu_release_point());
  state().last_gpu_release = point.value;
  gpu_released_ = true;
  return point;
}

Received& Received::operator=(Received&& o) noexcept {
  if (this != &o) {
    release();
    impl_ = std::exchange(o.impl_, nullptr);
    info_ = o.info_;
    missed_ = o.missed_;
    slot_ = o.slot_;
    gpu_ordered_ = o.gpu_ordered_;
    gpu_released_ = o.gpu_released_;
  }
  return *this;
}
void Received::release_slow(detail::ConsumerHot& m, std::uint32_t slot, std::uint64_t gpu_release) {
  static_cast<detail::ConsumerState&>(m).release(slot, gpu_release);
}
void Received::wake_producer(detail::ConsumerHot& m) {
  futex_wake_all(static_cast<detail::ConsumerState&>(m).control->space_futex);
}
std::span<const std::byte> Received::bytes() const {
  if (!impl_) return {};
  auto all = state().ring[slot_]->bytes();
  return all.first(std::min<std::uint64_t>(info_.size, all.size()));
}
Buffer& Received::buffer() const { return *state().ring[slot_]; }

// ---------------------------------------------------------------------------------------------
// Channel ends over a link

struct detail::LinkAccess {
  static std::unique_ptr<Producer> make_producer(LinkedEnd end, std::unique_ptr<ProducerLink> link) {
    auto m = std::make_unique<ProducerState>();
    m->name = std::move(end.name);
    m->route = std::move(end.route);
    m->options.slots = end.slots;
    m->options.slot_size = end.slot_size;
    m->options.max_consumers = 1;
    m->options.policy = end.policy;
    m->options.wait = end.wait;
    m->options.timestamps = end.timestamps;
    m->options.transport = m->route.transport;
    m->options.vulkan = end.vulkan;
    m->env.vulkan = end.vulkan;
    m->ring = std::move(end.ring);
    m->link = std::move(link);
    return std::unique_ptr<Producer>(new Producer(std::move(m)));
  }
  static std::unique_ptr<Consumer> make_consumer(LinkedEnd end, std::unique_ptr<ConsumerLink> link) {
    auto m = std::make_unique<ConsumerState>();
    m->options.wait = end.wait;
    m->options.vulkan = end.vulkan;
    m->route = std::move(end.route);
    m->env.vulkan = end.vulkan;
    m->slots = end.slots;
    m->slot_size = end.slot_size;
    m->producer_pid = end.peer_pid;
    m->ring = std::move(end.ring);
    m->link = std::move(link);
    return std::unique_ptr<Consumer>(new Consumer(std::move(m)));
  }
  static ProducerLink* link(const Producer& p) { return p.impl_->link.get(); }
  static ConsumerLink* link(const Consumer& c) { return c.impl_->link.get(); }
  static void set_route(Producer& p, ChannelRoute r) { p.impl_->route = std::move(r); }
  static void set_route(Consumer& c, ChannelRoute r) { c.impl_->route = std::move(r); }

  static Result<MessageInfo> publish(Producer& p, Loan&& loan, const LinkSend& send) {
    constexpr const char* call = "Producer::publish";
    auto& m = *p.impl_;
    if (!m.link) return fail(Errc::InvalidArgument, call, "the channel is on a local route, not over a link");
    if (m.user_closed) return fail(Errc::InvalidArgument, call, "the producer is closed");
    if (loan.impl_ != &m) return fail(Errc::InvalidArgument, call, "the loan belongs to another channel");
    // A send that fails after the message took its sequence has used the slot up (part of it may
    // be on its way): the loan is spent either way, and only an untouched one is given back.
    const std::uint64_t before = m.link->next_sequence();
    auto info = send(*m.link, loan.slot_);
    if (info || m.link->next_sequence() != before) {
      --m.link_loans;
      loan.impl_ = nullptr;
    }
    return info;
  }
};

std::unique_ptr<Producer> detail::make_producer(LinkedEnd end, std::unique_ptr<ProducerLink> link) {
  return LinkAccess::make_producer(std::move(end), std::move(link));
}
std::unique_ptr<Consumer> detail::make_consumer(LinkedEnd end, std::unique_ptr<ConsumerLink> link) {
  return LinkAccess::make_consumer(std::move(end), std::move(link));
}
detail::ProducerLink* detail::link_of(const Producer& producer) { return LinkAccess::link(producer); }
detail::ConsumerLink* detail::link_of(const Consumer& consumer) { return LinkAccess::link(consumer); }
void detail::set_route(Producer& producer, ChannelRoute route) { LinkAccess::set_route(producer, std::move(route)); }
void detail::set_route(Consumer& consumer, ChannelRoute route) { LinkAccess::set_route(consumer, std::move(route)); }
Result<MessageInfo> detail::publish_linked(Producer& producer, Loan&& loan, const LinkSend& send) {
  return LinkAccess::publish(producer, std::move(loan), send);
}

// ---------------------------------------------------------------------------------------------

Result<std::unique_ptr<Producer>> Channel::create(const VulkanContext* vulkan, const ProcessLocation& me,
                                                  const ProcessLocation& peer, ProducerOptions options) {
  options.vulkan = vulkan;
  options.peer = peer;
  options.host = me.host;
  return Producer::create(str_format("ch-{}-{}-{}", me.pid, peer.pid, now_ns() % 1'000'000'007ull), std::move(options));
}

// ---------------------------------------------------------------------------------------------
// The host's side of a GpuSync

Result<std::uint64_t> gpu_sync_value(const GpuSync& sync) {
  LF_TRY_STATUS(check_sync(sync, "gpu_sync_value"));
  return read_sync(sync);
}

Status wait_on_host(const GpuSync& sync, Duration timeout) {
  constexpr const char* call = "wait_on_host";
  LF_TRY_STATUS(check_sync(sync, call));
  // Both kinds are polled — spin, then naps of 50 µs: GPU work writes a flag with no way to wake a
  // sleeper, and vkWaitSemaphores can wake milliseconds late when another process's CUDA stream
  // signals the timeline (NVIDIA's does; note 0020).
  return detail::wait_for(
      [&]() -> Result<bool> {
        LF_TRY(const auto v, read_sync(sync));
        return v >= sync.value;
      },
      detail::never_stop, detail::Nap{std::chrono::microseconds(50)}, WaitMode::SpinThenBlock, timeout, {},
      [&] {
        return Error(Errc::Timeout, call,
                     sync.kind() == GpuSyncKind::Flag
                         ? str_format("the GPU flag did not reach {} in time", sync.value)
                         : str_format("GPU work did not reach timeline value {} in time", sync.value));
      });
}

Status signal_on_host(const GpuSync& sync) {
  LF_TRY_STATUS(check_sync(sync, "signal_on_host"));
  if (sync.kind() == GpuSyncKind::Semaphore) return sync.source->signal(sync.value);
  // Raise only, as one read-modify-write, so that two host raisers never take the word back
  // down. In host memory (where the channel's block lands unless the device offers device-local
  // host-visible memory) that is atomic; behind the PCIe BAR the CPU's locked operations may not
  // be, which is why the channel's consumers also raise the written counter one at a time. The
  // sequentially consistent exchange also drains a write-combining buffer before the next holder
  // of that lock reads the word. GPU writes are plain stores: a stream that wrote a lower value
  // after a host raise takes it down again (a peer's GPU work outliving the peer).
  raise_to(flag_word(sync), sync.value);
  return {};
}

}  // namespace lavaflow
