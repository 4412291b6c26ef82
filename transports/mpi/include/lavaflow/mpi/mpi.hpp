// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// lavaflow::mpi — channels between MPI ranks, routed per pair: ranks on one host use the local
/// transports (Vulkan IPC or shared memory, fds over the local socket), ranks on different hosts a
/// remote channel over MPI point-to-point.
///
/// A remote channel moves bytes (fds are node-local): the producer's ring buffer is sent as is
/// (`MPI_Isend` straight from the loaned buffer: the payload, then an 8–32-byte trailer) into a receive
/// posted on the consumer's ring buffer (no copy on either side, no unexpected-message buffering:
/// the producer sends only with a credit, and every credit stands for a posted receive).
///
/// Differences from local channels (design note 0010): one consumer per remote channel; FullPolicy
/// DropOldest is refused (a sent message cannot be taken back); waits poll MPI (`MPI_Test`),
/// busy or with short sleeps, because MPI has no blocking wait with a timeout. A peer rank whose
/// process this one can watch (same kernel and PID namespace) and that exits is Errc::PeerLost
/// within about a millisecond of any wait on it; a peer on another host that vanishes is a timeout.

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "lavaflow/core/cpu_buffer.hpp"
#include "lavaflow/core/duration.hpp"
#include "lavaflow/core/error.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/transports/channel.hpp"
#include "lavaflow/transports/transport.hpp"

namespace lavaflow::mpi {

/// An MPI error code as a lava-flow Error ("MPI_Send: MPI_ERR_RANK: invalid rank").
[[nodiscard]] Error to_error(int code, std::string call);

/// The routing-only transport for peers on other hosts (its ring buffers are not fds).
[[nodiscard]] std::shared_ptr<const Transport> mpi_transport();

/// Whether this MPI library reads and writes CUDA device memory itself ("CUDA-aware"), asked at run
/// time (Open MPI: MPIX_Query_cuda_support; MPICH: MPIX_GPU_query_support). Remote channels stage
/// GPU buffers through pinned host memory either way (publish_gpu / receive_gpu, design note
/// 0010); this says whether a CUDA-aware path could be taken, and `how` says how it was found out.
struct GpuAwareness {
  bool cuda = false;
  std::string how;
};
[[nodiscard]] GpuAwareness gpu_awareness();

struct CommunicatorOptions {
  std::optional<HostIdentity> host;             ///< override of this host's identity (tests, containers)
  const VulkanContext* vulkan = nullptr;        ///< devices this rank has (for Vulkan IPC routing); null: enumerate
  Duration timeout = std::chrono::seconds(30);  ///< for the location exchange
  /// Also set MPI_ERRORS_RETURN on MPI_COMM_WORLD: MPICH 4.0.2 raises request-completion errors
  /// (a truncated message from a misbehaving peer) there, and would otherwise abort the job.
  bool world_errors_return = true;
};

/// The route of a channel from rank `from` (producer) to rank `to` (consumer).
struct PairRoute {
  int from = 0, to = 0;
  TransportKind transport = TransportKind::Mpi;
  std::string reason;
};

/// An MPI job's ranks and where they are. Wraps (duplicates) a user's communicator; no global state.
class Communicator {
 public:
  /// Exchanges every rank's ProcessLocation (collective: every rank of `comm` must call it).
  [[nodiscard]] static Result<Communicator> create(MPI_Comm comm = MPI_COMM_WORLD, CommunicatorOptions options = {});
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  ~Communicator();

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return static_cast<int>(locations_.size()); }
  /// The private duplicate lava-flow communicates on (MPI_ERRORS_RETURN).
  [[nodiscard]] MPI_Comm comm() const { return comm_; }
  [[nodiscard]] const ProcessLocation& location(int rank) const {
    return locations_.at(static_cast<std::size_t>(rank));
  }
  /// How a channel from `from` to `to` goes, and why.
  [[nodiscard]] Result<PairRoute> route(int from, int to) const;
  /// Every ordered pair of distinct ranks.
  [[nodiscard]] std::vector<PairRoute> routes() const;
  /// A name shared by every rank of this job (for local channels between its ranks).
  [[nodiscard]] const std::string& job_key() const { return job_key_; }
  /// Whether this process can see rank `r`'s process exit: it runs on the same kernel, in the
  /// same PID namespace (then a pidfd watches it, opened at create() and checked against the
  /// process's start time). MPI tells a survivor nothing when a rank dies.
  [[nodiscard]] bool watches(int r) const;
  /// Errc::PeerLost naming rank `r` once its process has exited; {} while it runs, or when it
  /// cannot be watched (watches() is false).
  [[nodiscard]] Status check_alive(int r) const;
  /// A duplicate of the pidfd that watches rank `r` (an empty UniqueFd when it cannot be watched).
  [[nodiscard]] UniqueFd watch(int r) const;

 private:
  Communicator() = default;
  Status open_watches();
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  std::vector<ProcessLocation> locations_;
  std::string job_key_;
  std::vector<UniqueFd> exits_;  // per rank: a pidfd that turns readable when it exits, or empty
};

/// The highest channel number (RemoteOptions / RankChannelOptions::channel): every channel takes
/// 8 MPI tags, and MPI guarantees tags up to 32767.
inline constexpr int kMaxChannel = 4094;

struct RemoteOptions {
  std::uint32_t slots = 8;            ///< ring length (producer's choice; the consumer takes it)
  std::uint64_t slot_size = 1 << 20;  ///< payload bytes per ring buffer
  FullPolicy policy = FullPolicy::Block;
  WaitMode wait = WaitMode::SpinThenBlock;
  bool timestamps = false;
  /// Distinguishes channels between the same two ranks: 0 … 4094.
  int channel = 0;
  Duration connect_timeout = std::chrono::seconds(30);
  /// GPU staging (publish_gpu / receive_gpu): the ring buffers become pinned host memory of this
  /// Vulkan device (VK_EXT_external_memory_host), which its copy engine reads and writes directly.
  const VulkanContext* vulkan = nullptr;
  /// publish_gpu's chunk: a power of two, 4 KiB … 1 GiB. Each chunk goes out as its own MPI
  /// message as soon as the GPU has copied it, while the GPU copies the next.
  std::uint64_t chunk = 4 << 20;
  /// A ring of 256 KiB or more (without GPU staging) in transparent huge pages, rounded up to
  /// 2 MiB: MPI's single-copy path pins every page of a large message, and large pages make that
  /// cheap. Each side decides for its own ring.
  bool huge_pages = true;
};

class RemoteProducer;
class RemoteConsumer;

/// A loaned ring buffer of a remote channel; dropped unpublished, it goes back.
class RemoteLoan {
 public:
  RemoteLoan(RemoteLoan&&) noexcept;
  RemoteLoan& operator=(RemoteLoan&&) = delete;
  ~RemoteLoan();
  [[nodiscard]] std::span<std::byte> bytes() const;
  [[nodiscard]] std::uint64_t sequence() const { return seq_; }

 private:
  friend class RemoteProducer;
  RemoteLoan(RemoteProducer* p, std::uint32_t slot, std::uint64_t seq) : producer_(p), slot_(slot), seq_(seq) {}
  RemoteProducer* producer_ = nullptr;
  std::uint32_t slot_ = 0;
  std::uint64_t seq_ = 0;
};

/// A received message of a remote channel; released (its ring buffer re-posted, a credit sent back)
/// when destroyed.
class RemoteReceived {
 public:
  RemoteReceived(RemoteReceived&&) noexcept;
  RemoteReceived& operator=(RemoteReceived&&) = delete;
  ~RemoteReceived();
  [[nodiscard]] std::span<const std::byte> bytes() const;
  [[nodiscard]] const MessageInfo& info() const { return info_; }
  Status release();

 private:
  friend class RemoteConsumer;
  RemoteReceived(RemoteConsumer* c, std::uint32_t slot, MessageInfo info) : consumer_(c), slot_(slot), info_(info) {}
  RemoteConsumer* consumer_ = nullptr;
  std::uint32_t slot_ = 0;
  MessageInfo info_;
};

class RemoteProducer {
 public:
  /// Announces the channel to `consumer_rank` (does not wait: the first loan() waits for its answer).
  [[nodiscard]] static Result<std::unique_ptr<RemoteProducer>> create(const Communicator& comm, int consumer_rank,
                                                                      RemoteOptions options = {});
  ~RemoteProducer();
  [[nodiscard]] Result<RemoteLoan> loan(Duration timeout = kForever);
  [[nodiscard]] Result<RemoteLoan> try_loan();
  /// Sends the first `info.size` bytes of the buffer (0: the whole slot) and a trailer written
  /// after them, from the buffer itself (a trailer of 8 bytes, 8 more each for a non-zero user tag
  /// and a timestamp).
  [[nodiscard]] Result<MessageInfo> publish(RemoteLoan&& loan, MessageInfo info = {});
  /// Sends [offset, offset + size) of a (device-local) GPU buffer, staged through the loaned ring
  /// buffer in pipelined chunks: the GPU copies every chunk into the pinned ring buffer (one
  /// submission each, signalling a timeline), and each chunk is sent the moment its copy is done,
  /// while the GPU copies the next. Needs RemoteOptions::vulkan (the device of `src`).
  [[nodiscard]] Result<MessageInfo> publish_gpu(RemoteLoan&& loan, const GpuBuffer& src, std::uint64_t offset,
                                                std::uint64_t size, MessageInfo info = {});
  /// Waits until every published message has been received and released by the consumer. The
  /// consumer reports releases in batches: the last ones when it next waits for a message or when
  /// it is closed — so a peer that neither receives nor closes makes this time out.
  [[nodiscard]] Status flush(Duration timeout = kForever);
  [[nodiscard]] std::uint64_t slot_size() const;
  [[nodiscard]] std::uint32_t slots() const;

  struct Impl;

 private:
  friend class RemoteLoan;
  explicit RemoteProducer(std::unique_ptr<Impl> impl);
  RemoteLoan take(std::uint32_t slot);  ///< loans a free slot (loan and try_loan)
  void give_back(std::uint32_t slot);
  std::unique_ptr<Impl> impl_;
};

class RemoteConsumer {
 public:
  /// Waits (up to options.connect_timeout) for `producer_rank`'s announcement of the channel,
  /// checks it, allocates the ring and posts a receive on every ring buffer.
  [[nodiscard]] static Result<std::unique_ptr<RemoteConsumer>> open(const Communicator& comm, int producer_rank,
                                                                    RemoteOptions options = {});
  ~RemoteConsumer();
  /// The next message, waiting at most `timeout`; Malformed on a size or sequence mismatch.
  /// A message sent in chunks (publish_gpu) is returned once every chunk is in.
  [[nodiscard]] Result<RemoteReceived> receive(Duration timeout = kForever);
  /// The next message, straight on into `dst` at `offset`: each chunk is uploaded by the GPU as
  /// soon as it arrives (overlapping the arrival of the next); returns when the data is in `dst`,
  /// the ring buffer already released. Needs RemoteOptions::vulkan (the device of `dst`).
  [[nodiscard]] Result<MessageInfo> receive_gpu(const GpuBuffer& dst, std::uint64_t offset,
                                                Duration timeout = kForever);
  [[nodiscard]] Result<RemoteReceived> try_receive();
  [[nodiscard]] std::uint64_t slot_size() const;
  [[nodiscard]] std::uint32_t slots() const;

  struct Impl;

 private:
  friend class RemoteReceived;
  explicit RemoteConsumer(std::unique_ptr<Impl> impl);
  Status release(std::uint32_t slot);
  std::unique_ptr<Impl> impl_;
};

// ----- Rank channels: one API whatever the route

/// A channel from this rank to another, or from another to this one. Both sides name the channel
/// by (producer rank, consumer rank, `channel`); neither says how it goes.
struct RankChannelOptions {
  std::uint32_t slots = 8;                ///< ring length (the producer's choice; local routes: 1..62)
  std::uint64_t slot_size = 1 << 20;      ///< payload bytes per ring buffer (the producer's choice)
  FullPolicy policy = FullPolicy::Block;  ///< DropOldest: local routes only (refused over MPI)
  WaitMode wait = WaitMode::SpinThenBlock;
  bool timestamps = false;
  /// Distinguishes channels between the same two ranks (one per direction each): 0 … 4094.
  int channel = 0;
  /// Unset: Communicator::route()'s choice; else forces one. Both sides must force the same (the
  /// consumer looks for the channel where its route says it is).
  std::optional<TransportKind> transport;
  /// Local routes: the Vulkan IPC ring's device (null: one is made when needed). MPI route: the
  /// device for GPU staging (remote()->publish_gpu / receive_gpu).
  const VulkanContext* vulkan = nullptr;
  Duration connect_timeout = std::chrono::seconds(30);  ///< consumer: wait this long for the producer
  bool huge_pages = true;                               ///< MPI route: RemoteOptions::huge_pages
};

class RankProducer;
class RankConsumer;

/// A loaned ring buffer of a rank channel: Loan or RemoteLoan underneath.
class RankLoan {
 public:
  RankLoan(RankLoan&&) noexcept = default;
  /// Empty when the ring is device-local GPU memory (Vulkan IPC route on a discrete GPU): write it
  /// through local()->buffer() then.
  [[nodiscard]] std::span<std::byte> bytes() const;
  [[nodiscard]] std::uint64_t sequence() const;
  /// The route's own loan, for what only it has (Loan::buffer(), gpu_signal()); null on the other route.
  [[nodiscard]] Loan* local() { return std::get_if<Loan>(&loan_); }
  [[nodiscard]] RemoteLoan* remote() { return std::get_if<RemoteLoan>(&loan_); }

 private:
  friend class RankProducer;
  explicit RankLoan(Loan&& l) : loan_(std::move(l)) {}
  explicit RankLoan(RemoteLoan&& l) : loan_(std::move(l)) {}
  std::variant<Loan, RemoteLoan> loan_;
};

/// A received message of a rank channel; released when destroyed.
class RankReceived {
 public:
  RankReceived(RankReceived&&) noexcept = default;
  /// Empty when the ring is device-local GPU memory: read it through local()->buffer() then.
  [[nodiscard]] std::span<const std::byte> bytes() const;
  [[nodiscard]] const MessageInfo& info() const;
  Status release();
  [[nodiscard]] Received* local() { return std::get_if<Received>(&received_); }
  [[nodiscard]] RemoteReceived* remote() { return std::get_if<RemoteReceived>(&received_); }

 private:
  friend class RankConsumer;
  explicit RankReceived(Received&& r) : received_(std::move(r)) {}
  explicit RankReceived(RemoteReceived&& r) : received_(std::move(r)) {}
  std::variant<Received, RemoteReceived> received_;
};

/// The producer end of a channel to `consumer_rank`, routed by the Communicator: a local Producer
/// (Vulkan IPC or shared memory; the fds go over the local socket) when the two ranks share a host,
/// a RemoteProducer otherwise. Exactly one consumer: the first loan waits for that rank to open
/// the channel, and a local consumer that goes away is PeerLost.
/// Differences between the routes (design note 0013): one loan at a time on a local route, up to
/// `slots` over MPI; DropOldest only locally; device-local rings (bytes() empty) only locally.
class RankProducer {
 public:
  [[nodiscard]] static Result<std::unique_ptr<RankProducer>> create(const Communicator& comm, int consumer_rank,
                                                                    RankChannelOptions options = {});
  ~RankProducer();
  [[nodiscard]] Result<RankLoan> loan(Duration timeout = kForever);
  [[nodiscard]] Result<RankLoan> try_loan();
  [[nodiscard]] Result<MessageInfo> publish(RankLoan&& loan, MessageInfo info = {});
  /// Waits until the consumer has received and released every published message.
  [[nodiscard]] Status flush(Duration timeout = kForever);
  [[nodiscard]] const PairRoute& route() const { return route_; }
  [[nodiscard]] std::uint32_t slots() const;
  [[nodiscard]] std::uint64_t slot_size() const;
  /// The channel underneath (one of them is null), for what only one route has.
  [[nodiscard]] Producer* local() const { return local_.get(); }
  [[nodiscard]] RemoteProducer* remote() const { return remote_.get(); }

 private:
  RankProducer() = default;
  Status wait_for_consumer(Duration timeout);
  PairRoute route_;
  std::unique_ptr<Producer> local_;
  std::unique_ptr<RemoteProducer> remote_;
  bool consumer_seen_ = false;
};

/// The consumer end of a channel from `producer_rank` (see RankProducer).
class RankConsumer {
 public:
  /// Waits up to options.connect_timeout for the producer; only `channel`, `transport`, `wait`,
  /// `vulkan`, `connect_timeout` and `huge_pages` are read (the ring is the producer's).
  [[nodiscard]] static Result<std::unique_ptr<RankConsumer>> open(const Communicator& comm, int producer_rank,
                                                                  RankChannelOptions options = {});
  ~RankConsumer();
  /// The next message, waiting at most `timeout`; PeerLost once a local producer is gone and
  /// everything it sent is received.
  [[nodiscard]] Result<RankReceived> receive(Duration timeout = kForever);
  [[nodiscard]] Result<RankReceived> try_receive();
  [[nodiscard]] const PairRoute& route() const { return route_; }
  [[nodiscard]] std::uint32_t slots() const;
  [[nodiscard]] std::uint64_t slot_size() const;
  [[nodiscard]] Consumer* local() const { return local_.get(); }
  [[nodiscard]] RemoteConsumer* remote() const { return remote_.get(); }

 private:
  RankConsumer() = default;
  PairRoute route_;
  std::unique_ptr<Consumer> local_;
  std::unique_ptr<RemoteConsumer> remote_;
};

}  // namespace lavaflow::mpi
