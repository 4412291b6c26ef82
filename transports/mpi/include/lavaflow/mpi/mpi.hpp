// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// lavaflow::mpi — an MPI job's ranks and where they are (Communicator), and channels between them:
/// the same lavaflow::Producer and Consumer as on one host, routed per pair. Ranks on one host use
/// the local transports (Vulkan IPC or shared memory, fds over the local socket); ranks on
/// different hosts send over MPI point-to-point (fds are node-local, so bytes move).
///
/// Differences of the MPI route (design note 0010): one consumer per channel; FullPolicy
/// DropOldest is refused (a sent message cannot be taken back); no GPU ordering (stage GPU buffers
/// with publish_gpu / receive_gpu); waits poll MPI (`MPI_Test`), busy or with short sleeps,
/// because MPI has no blocking wait with a timeout. A peer rank whose process this one can watch
/// (same kernel and PID namespace) and that exits is Errc::PeerLost within about a millisecond of
/// any wait on it; a peer on another host that vanishes is a timeout.

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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

/// The transport of ranks on other hosts, for routing (choose_route): its ring buffers are not fds,
/// so a channel over it is made between ranks (open_producer / open_consumer), not by name.
[[nodiscard]] std::shared_ptr<const Transport> mpi_transport();

/// Whether this MPI library reads and writes CUDA device memory itself ("CUDA-aware"), asked at run
/// time (Open MPI: MPIX_Query_cuda_support; MPICH: MPIX_GPU_query_support). Channels over MPI stage
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

/// The highest channel number (ChannelOptions::channel): every channel takes 8 MPI tags, and MPI
/// guarantees tags up to 32767.
inline constexpr int kMaxChannel = 4094;

/// A channel from this rank to another, or from another to this one. Both ends name it by
/// (producer rank, consumer rank, `channel`); neither says how it goes.
struct ChannelOptions {
  /// Ring length, the producer's choice (the consumer takes it): 1..62 on a local route, 1..1024
  /// over MPI.
  std::uint32_t slots = 8;
  std::uint64_t slot_size = 1 << 20;      ///< payload bytes per ring buffer (the producer's choice)
  FullPolicy policy = FullPolicy::Block;  ///< DropOldest: local routes only (a sent message cannot be taken back)
  WaitMode wait = WaitMode::SpinThenBlock;
  bool timestamps = false;
  /// Distinguishes channels between the same two ranks (one per direction each): 0 … 4094.
  int channel = 0;
  /// Unset: Communicator::route()'s choice; else forces one. Both ends must force the same (the
  /// consumer looks for the channel where its route says it is).
  std::optional<TransportKind> transport;
  /// Local routes: the Vulkan IPC ring's device (null: one is made when needed). MPI route: the
  /// device for GPU staging (publish_gpu / receive_gpu); the ring buffers then become pinned host
  /// memory of this device (VK_EXT_external_memory_host), which its copy engine reads and writes.
  const VulkanContext* vulkan = nullptr;
  Duration connect_timeout = std::chrono::seconds(30);  ///< consumer: wait this long for the producer
  /// MPI route, publish_gpu's chunk: a power of two, 4 KiB … 1 GiB. Each chunk goes out as its own
  /// MPI message as soon as the GPU has copied it, while the GPU copies the next.
  std::uint64_t chunk = 4 << 20;
  /// MPI route: a ring of 256 KiB or more (without GPU staging) in transparent huge pages, rounded
  /// up to 2 MiB: MPI's single-copy path pins every page of a large message, and large pages make
  /// that cheap. Each end decides for its own ring.
  bool huge_pages = true;
};

/// The producer end of a channel to `consumer_rank`: a lavaflow::Producer like any other, on the
/// route the Communicator chooses for the pair (Producer::route() says which and why).
/// - Local route (the ranks share a host): Vulkan IPC or shared memory, the fds over the local
///   socket; the ring is shared, and one loan is out at a time.
/// - MPI route (design note 0010): the loaned ring buffer is sent as is (`MPI_Isend` straight from
///   it: the payload, then an 8–32-byte trailer) into a receive posted on the consumer's ring
///   buffer (no copy on either side, no unexpected-message buffering: the producer sends only
///   with a credit, and every credit stands for a posted receive). Up to `slots` loans may be out
///   at once. Its ring buffers stay in this process (Buffer::export_handle is Unsupported).
/// Either way the channel has exactly one consumer: the first loan waits (within its timeout) for
/// that rank to open the channel; a consumer rank that goes away makes the next wait PeerLost —
/// at once on a local route, within about a millisecond over MPI where this process can watch the
/// rank's process (Communicator::watches), else a timeout. Over MPI, flush() counts a message
/// once the consumer releases it, and the consumer reports releases in batches: the last ones
/// when it next waits for a message or is destroyed.
/// Over MPI, also: a message's sequence is fixed when it is published (Loan::sequence() of one of
/// several loans out is the next free one, not a promise); closing either end tells the other
/// (its consumer receives what was published, then PeerLost; its producer's next wait for room
/// and flush() with messages unreleased are PeerLost); a channel number may be opened again, and
/// a consumer answers the newest announcement it finds — but a producer that keeps publishing
/// after its consumer closed, until its ring fills and it learns of the close, sends messages
/// that a later opening of the same number receives (as a sequence mismatch, or as its own
/// message when the sequences agree): reopen a number once its producer has flushed or seen
/// PeerLost, or use another number; and the channel, its loans and messages must be gone before
/// the Communicator is destroyed (they send and receive on its communicator).
[[nodiscard]] Result<std::unique_ptr<Producer>> open_producer(const Communicator& comm, int consumer_rank,
                                                              ChannelOptions options = {});

/// The consumer end of a channel from `producer_rank` (see open_producer). Waits up to
/// options.connect_timeout for the producer; only `channel`, `transport`, `wait`, `vulkan`,
/// `connect_timeout` and `huge_pages` are read (the ring is the producer's). Over MPI, receive()
/// is Malformed on a size or sequence mismatch, and a message sent in chunks (publish_gpu) is
/// returned once every chunk is in.
[[nodiscard]] Result<std::unique_ptr<Consumer>> open_consumer(const Communicator& comm, int producer_rank,
                                                              ChannelOptions options = {});

/// MPI route: sends [offset, offset + size) of a (device-local) GPU buffer as `loan`'s message,
/// staged through the loaned ring buffer in pipelined chunks: the GPU copies every chunk into the
/// pinned ring buffer (one submission each), and each chunk is sent the moment its copy is done,
/// while the GPU copies the next. Needs ChannelOptions::vulkan (the device of `src`).
[[nodiscard]] Result<MessageInfo> publish_gpu(Producer& producer, Loan&& loan, const GpuBuffer& src,
                                              std::uint64_t offset, std::uint64_t size, MessageInfo info = {});

/// MPI route: the next message, straight on into `dst` at `offset`: each chunk is uploaded by the
/// GPU as soon as it arrives (overlapping the arrival of the next); returns when the data is in
/// `dst`, the ring buffer already released. Needs ChannelOptions::vulkan (the device of `dst`).
[[nodiscard]] Result<MessageInfo> receive_gpu(Consumer& consumer, const GpuBuffer& dst, std::uint64_t offset,
                                              Duration timeout = kForever);

}  // namespace lavaflow::mpi
