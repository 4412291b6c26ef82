// SPDX-License-Identifier: MIT
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <utility>

#include "checks.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/mpi/mpi.hpp"
#include "lavaflow/transports/detail/link.hpp"
#include "links.hpp"
#include "ring.hpp"
#include "wait.hpp"
#include "wire.hpp"

namespace lavaflow::mpi::detail {

namespace {

/// The sending end of a channel over MPI.
class MpiProducerLink final : public lavaflow::detail::ProducerLink {
 public:
  MpiProducerLink() = default;
  MpiProducerLink(const MpiProducerLink&) = delete;
  MpiProducerLink& operator=(const MpiProducerLink&) = delete;
  ~MpiProducerLink() override;

  Status start(const Communicator& comm, int consumer_rank, const ChannelOptions& o);

  Result<std::uint32_t> loan(Duration timeout) override;
  Result<MessageInfo> publish(std::uint32_t slot, MessageInfo info) override;
  void give_back(std::uint32_t slot) override {
    loaned[slot] = false;
    --loans;
  }
  Status flush(Duration timeout) override;
  std::uint32_t consumer_count() override {
    (void)progress();  // a failure here shows in the next loan or flush
    return connected && !peer_closed ? 1 : 0;
  }
  std::uint64_t next_sequence() const override { return next_seq; }
  void close() override;

  Result<MessageInfo> publish_gpu(std::uint32_t slot, const GpuBuffer& src, std::uint64_t offset, std::uint64_t size,
                                  MessageInfo info);

  Ring ring;

 private:
  MPI_Comm comm = MPI_COMM_NULL;
  int peer = 0;
  PeerWatch watch;
  ChannelOptions o;
  std::vector<MPI_Request> sends;
  std::vector<std::vector<MPI_Request>> chunk_sends;  // per slot: chunks 1… of a chunked message
  std::unique_ptr<ChunkCopier> copier;                // GPU staging, made on first use
  std::vector<int> completed;                         // MPI_Testsome's indices
  std::vector<bool> loaned;
  std::uint32_t loans = 0, cursor = 0;
  std::uint64_t next_seq = 0, released = 0;
  Credit credit{};
  MPI_Request credit_req = MPI_REQUEST_NULL;
  Hello hello{};
  MPI_Request hello_req = MPI_REQUEST_NULL;
  std::uint32_t ack = 0;
  MPI_Request ack_req = MPI_REQUEST_NULL;
  bool connected = false;
  bool peer_closed = false;  // the consumer said it closed its end
  bool closed = false;       // close() ran
  std::byte end_marker[kMaxTrailer]{};
  MPI_Request end_req = MPI_REQUEST_NULL;

  Status post_ack() {
    return check(MPI_Irecv(&ack, 1, MPI_UINT32_T, peer, ack_tag(o.channel), comm, &ack_req), "MPI_Irecv(answer)");
  }
  Status post_credit() {
    return check(MPI_Irecv(&credit, 2, MPI_UINT64_T, peer, credit_tag(o.channel), comm, &credit_req),
                 "MPI_Irecv(credit)");
  }
  Error consumer_closed(const char* call) const {
    return Error(Errc::PeerLost, call,
                 str_format("rank {} closed its end of channel {} ({} of {} messages released)", peer, o.channel,
                            released, next_seq));
  }

  /// Takes in whatever the consumer has said (answer, credits, its close) without waiting. What
  /// carries another incarnation is an earlier opening's and is dropped.
  Status progress() {
    while (!connected) {
      MPI_Status st;
      LF_TRY(bool got, test(ack_req, &st, "MPI_Test(answer)"));
      if (!got) return {};
      if (ack == hello.incarnation) {
        connected = true;
        LF_TRY_STATUS(post_credit());
      } else {
        LF_TRY_STATUS(post_ack());
      }
    }
    bool credited = false;
    while (!peer_closed) {
      MPI_Status st;
      LF_TRY(bool got, test(credit_req, &st, "MPI_Test(credit)"));
      if (!got) break;
      int count = 0;
      MPI_Get_count(&st, MPI_UINT64_T, &count);
      if (count != 2)
        return fail(Errc::Malformed, "mpi producer",
                    str_format("rank {} sent a credit of {} words on channel {}", peer, count, o.channel));
      if (credit.incarnation != hello.incarnation) {
        LF_TRY_STATUS(post_credit());
        continue;
      }
      if (credit.released == kClosedCredit) {
        peer_closed = true;  // nothing more comes: no receive is posted again
        break;
      }
      if (credit.released > next_seq || credit.released < released)
        return fail(Errc::Malformed, "mpi producer",
                    str_format("rank {} released {} messages of {} sent (before: {})", peer, credit.released, next_seq,
                               released));
      released = credit.released;
      credited = true;
      LF_TRY_STATUS(post_credit());
    }
    // The consumer has these messages: their sends are (nearly always) complete. Completing them
    // here, all in one call, keeps MPI_Test off the per-message path of free_slot().
    if (credited) {
      int done = 0;
      completed.resize(sends.size());
      LF_TRY_STATUS(check(
          MPI_Testsome(static_cast<int>(sends.size()), sends.data(), &done, completed.data(), MPI_STATUSES_IGNORE),
          "MPI_Testsome(sends)"));
    }
    return {};
  }

  /// Makes `info` the next message (sequence, timestamp) and writes its trailer into `slot`'s ring
  /// buffer at `at`; returns the trailer's length.
  std::size_t write_trailer(std::uint32_t slot, std::uint64_t at, MessageInfo& info, std::uint16_t flags) {
    info.sequence = next_seq;
    info.timestamp_ns = o.timestamps ? now_ns() : 0;
    if (info.user_tag != 0) flags |= kHasTag;
    if (o.timestamps) flags |= kHasTime;
    const Trailer t{
        flags, Trailer::short_fits(info.size, flags), info.sequence, info.size, info.user_tag, info.timestamp_ns};
    t.write(ring.host_ptr(slot) + at);
    return t.length();
  }

  /// The message in `slot` is on its way: the slot is no longer loaned.
  void sent(std::uint32_t slot) {
    loaned[slot] = false;
    --loans;
    ++next_seq;
  }

  /// The chunked format's first part: `slot`'s trailer alone (total size, chunks of
  /// 2^chunk_log2), sent from the spare bytes after the slot. The chunks follow with send_chunk.
  Status send_trailer_alone(std::uint32_t slot, MessageInfo& info, unsigned chunk_log2) {
    const std::size_t trailer =
        write_trailer(slot, o.slot_size, info, static_cast<std::uint16_t>(kChunked | (chunk_log2 << 8)));
    LF_TRY_STATUS(check(MPI_Isend(ring.host_ptr(slot) + o.slot_size, static_cast<int>(trailer), MPI_BYTE, peer,
                                  data_tag(o.channel), comm, &sends[slot]),
                        "MPI_Isend(trailer)"));
    sent(slot);
    return {};
  }

  /// Bytes [at, at + len) of `slot`'s ring buffer as the next chunk of its message.
  Status send_chunk(std::uint32_t slot, std::uint64_t at, std::uint64_t len) {
    MPI_Request r = MPI_REQUEST_NULL;
    LF_TRY_STATUS(check(
        MPI_Isend(ring.host_ptr(slot) + at, static_cast<int>(len), MPI_BYTE, peer, chunk_tag(o.channel), comm, &r),
        "MPI_Isend(chunk)"));
    chunk_sends[slot].push_back(r);
    return {};
  }

  /// A slot whose last send has completed and is not loaned, when the consumer has room. Every
  /// MPI_Test runs the MPI library's progress engine (hundreds of ns over UCX), so the hot path
  /// makes as few as it can: credits are read only when the window looks full, and the slot after
  /// the last one used is tried first.
  Result<std::optional<std::uint32_t>> free_slot() {
    if (!connected || next_seq - released + loans >= o.slots) {
      LF_TRY_STATUS(progress());
      if (peer_closed) return std::unexpected(consumer_closed("Producer::loan"));
    }
    if (!connected || next_seq - released + loans >= o.slots) return std::optional<std::uint32_t>{};
    for (std::uint32_t k = 0; k < o.slots; ++k) {
      const std::uint32_t s = (cursor + k) % o.slots;
      if (loaned[s]) continue;
      if (!chunk_sends[s].empty()) {
        int all = 0;
        LF_TRY_STATUS(check(
            MPI_Testall(static_cast<int>(chunk_sends[s].size()), chunk_sends[s].data(), &all, MPI_STATUSES_IGNORE),
            "MPI_Testall(chunks)"));
        if (!all) continue;
        chunk_sends[s].clear();
      }
      if (sends[s] == MPI_REQUEST_NULL) return std::optional<std::uint32_t>{s};
      LF_TRY(bool done, test(sends[s], nullptr, "MPI_Test(send)"));
      if (done) return std::optional<std::uint32_t>{s};
    }
    return std::optional<std::uint32_t>{};
  }

  std::uint32_t take(std::uint32_t slot) {
    loaned[slot] = true;
    ++loans;
    cursor = (slot + 1) % o.slots;
    return slot;
  }
};

/// Also when start() fails half-way: no request outlives the memory it reads or writes.
MpiProducerLink::~MpiProducerLink() {
  if (mpi_finalized()) return;  // a loan held past MPI_Finalize: MPI has let go of the ring already
  for (auto& r : sends) finish_or_cancel(r, std::chrono::seconds(2));
  for (auto& chunks : chunk_sends)
    for (auto& r : chunks) finish_or_cancel(r, std::chrono::seconds(2));
  finish_or_cancel(hello_req, std::chrono::milliseconds(100));
  finish_or_cancel(end_req, std::chrono::milliseconds(100));
  cancel(ack_req);
  cancel(credit_req);
}

/// Announces the channel to the consumer (does not wait: the first loan waits for its answer).
Status MpiProducerLink::start(const Communicator& c, int consumer_rank, const ChannelOptions& options) {
  comm = c.comm();
  peer = consumer_rank;
  watch = PeerWatch(c, consumer_rank, options.channel);
  o = options;
  LF_TRY(ring, make_ring(RingSide::Producer, o.slots, o.slot_size, {.vulkan = o.vulkan, .huge_pages = o.huge_pages}));
  sends.assign(o.slots, MPI_REQUEST_NULL);
  chunk_sends.resize(o.slots);
  loaned.assign(o.slots, false);
  hello = Hello{kHelloMagic, kVersion, 0, o.slots, o.channel, o.slot_size, std::random_device{}(), 0};
  LF_TRY_STATUS(post_ack());
  return check(MPI_Isend(&hello, sizeof(Hello), MPI_BYTE, consumer_rank, hello_tag(o.channel), comm, &hello_req),
               "MPI_Isend(announce)");
}

/// Sends the end marker after the last message, unless the consumer has closed already (it would
/// wait in that rank's MPI for good).
void MpiProducerLink::close() {
  if (std::exchange(closed, true) || mpi_finalized()) return;
  (void)progress();
  if (peer_closed) return;
  const Trailer end = Trailer::end(next_seq, hello.incarnation);
  end.write(end_marker);
  (void)check(
      MPI_Isend(end_marker, static_cast<int>(end.length()), MPI_BYTE, peer, data_tag(o.channel), comm, &end_req),
      "MPI_Isend(end)");
}

Result<std::uint32_t> MpiProducerLink::loan(Duration timeout) {
  constexpr const char* call = "Producer::loan";
  if (peer_closed) return std::unexpected(consumer_closed(call));
  if (timeout == Duration::zero()) {
    LF_TRY(auto slot, free_slot());
    if (!slot)
      return fail(Errc::WouldBlock, call,
                  connected ? "ring full: the consumer has not released a buffer"
                            : "the consumer has not opened the channel yet");
    return take(*slot);
  }
  if (o.policy == FullPolicy::FailFast) {  // waits for the consumer to open, never for room
    LF_TRY_STATUS(poll_until(
        [&]() -> Result<bool> {
          if (auto ok = progress(); !ok) return std::unexpected(ok.error());
          if (peer_closed) return std::unexpected(consumer_closed(call));
          return connected;
        },
        timeout, o.wait, Errc::Timeout,
        [&] { return str_format("rank {} did not open channel {} in time", peer, o.channel); }, &watch));
    return loan(Duration::zero());
  }
  std::optional<std::uint32_t> slot;
  LF_TRY_STATUS(poll_until(
      [&]() -> Result<bool> {
        LF_TRY(slot, free_slot());
        return slot.has_value();
      },
      timeout, o.wait, Errc::Timeout,
      [&] {
        return connected ? str_format("ring full: rank {} released no buffer of channel {} in time", peer, o.channel)
                         : str_format("rank {} did not open channel {} in time", peer, o.channel);
      },
      &watch));
  return take(*slot);
}

Result<MessageInfo> MpiProducerLink::publish(std::uint32_t slot, MessageInfo info) {
  if (info.size >= kSeparateTrailer) {
    // A large message goes in the chunked format: the trailer alone first, then the payload as it
    // is (1 GiB chunks), so MPI moves a payload of the application's size: Open MPI's
    // copy-in/copy-out path moves such payloads faster than payload-then-trailer messages (design
    // note 0010). The consumer posts the payload's receive when the trailer is in; the payload's
    // rendezvous waits for it without buffering anything.
    LF_TRY_STATUS(send_trailer_alone(slot, info, kMaxChunkLog2));
    const std::uint64_t chunk = 1ull << kMaxChunkLog2;
    for (std::uint64_t at = 0; at < info.size; at += chunk)
      LF_TRY_STATUS(send_chunk(slot, at, std::min(chunk, info.size - at)));
    return info;
  }
  const std::size_t trailer = write_trailer(slot, info.size, info, 0);
  const int bytes = static_cast<int>(info.size + trailer);
  if (bytes <= kBlockingSendMax) {
    // Small: a blocking send. Its receive is posted already (every credit stands for one), and a
    // message this small goes eagerly in every MPI: MPI_Send returns once it is copied out,
    // without waiting for the consumer — and costs MPI less than MPI_Isend + a later completion.
    LF_TRY_STATUS(
        check(MPI_Send(ring.host_ptr(slot), bytes, MPI_BYTE, peer, data_tag(o.channel), comm), "MPI_Send(message)"));
  } else {
    LF_TRY_STATUS(check(MPI_Isend(ring.host_ptr(slot), bytes, MPI_BYTE, peer, data_tag(o.channel), comm, &sends[slot]),
                        "MPI_Isend(message)"));
  }
  sent(slot);
  return info;
}

Result<MessageInfo> MpiProducerLink::publish_gpu(std::uint32_t slot, const GpuBuffer& src, std::uint64_t offset,
                                                 std::uint64_t size, MessageInfo info) {
  constexpr const char* call = "mpi::publish_gpu";
  LF_TRY_STATUS(check_staging(o, src, offset, size, call));
  if (size == 0 || size > o.slot_size)
    return fail(Errc::InvalidArgument, call,
                str_format("{} bytes: outside 1..{} (the ring buffer)", size, o.slot_size));
  if (!copier) {
    LF_TRY(copier, ChunkCopier::create(*o.vulkan));
  }
  const std::uint64_t chunk = o.chunk;
  const std::uint64_t n = (size + chunk - 1) / chunk;
  // Queue every chunk's copy at once; the GPU works through them while chunks go out below.
  std::vector<std::size_t> done(n);
  for (std::uint64_t k = 0; k < n; ++k) {
    const std::uint64_t len = std::min(chunk, size - k * chunk);
    LF_TRY(done[k], copier->copy(src.buffer(), src.offset() + offset + k * chunk, ring.staging[slot], k * chunk, len));
  }
  // The trailer goes first, on its own (from the spare bytes after the slot): the consumer learns
  // the message's size and posts its chunk receives while the copies run.
  info.size = size;
  LF_TRY_STATUS(send_trailer_alone(slot, info, static_cast<unsigned>(std::countr_zero(chunk))));
  for (std::uint64_t k = 0; k < n; ++k) {
    // A failure here loses the message (chunks already sent cannot be withdrawn); the consumer
    // then times out on the rest of it, naming the chunk.
    LF_TRY_STATUS(copier->wait(done[k], std::chrono::seconds(10)));
    LF_TRY_STATUS(send_chunk(slot, k * chunk, std::min(chunk, size - k * chunk)));
  }
  return info;
}

Status MpiProducerLink::flush(Duration timeout) {
  return poll_until(
      [&]() -> Result<bool> {
        LF_TRY_STATUS(progress());
        if (released != next_seq && peer_closed) return std::unexpected(consumer_closed("Producer::flush"));
        if (released != next_seq) return false;
        for (auto& r : sends) {
          LF_TRY(bool done, test(r, nullptr, "MPI_Test(send)"));
          if (!done) return false;
        }
        return true;
      },
      timeout, o.wait, Errc::Timeout,
      [&] {
        return str_format("rank {} released {} of {} messages of channel {} in time", peer, released, next_seq,
                          o.channel);
      },
      &watch);
}

}  // namespace

Result<std::unique_ptr<Producer>> open_mpi_producer(const Communicator& comm, int consumer_rank,
                                                    const ChannelOptions& o, lavaflow::detail::LinkedEnd end) {
  LF_TRY_STATUS(check_options(o, "mpi::open_producer"));
  auto link = std::make_unique<MpiProducerLink>();
  LF_TRY_STATUS(link->start(comm, consumer_rank, o));
  end.slots = o.slots;
  end.slot_size = o.slot_size;
  end.policy = o.policy;
  end.wait = o.wait;
  end.timestamps = o.timestamps;
  end.vulkan = o.vulkan;
  end.ring = slot_buffers(link->ring, o.slot_size);
  return lavaflow::detail::make_producer(std::move(end), std::move(link));
}

}  // namespace lavaflow::mpi::detail

namespace lavaflow::mpi {

Result<MessageInfo> publish_gpu(Producer& producer, Loan&& loan, const GpuBuffer& src, std::uint64_t offset,
                                std::uint64_t size, MessageInfo info) {
  if (!dynamic_cast<detail::MpiProducerLink*>(lavaflow::detail::link_of(producer)))
    return fail(Errc::InvalidArgument, "mpi::publish_gpu",
                str_format("channel {} is on the {} route, not over MPI: write the GPU buffer into the loan's ring "
                           "buffer instead",
                           producer.name(), to_string(producer.route().transport)));
  return lavaflow::detail::publish_linked(
      producer, std::move(loan), [&](lavaflow::detail::ProducerLink& link, std::uint32_t slot) {
        return static_cast<detail::MpiProducerLink&>(link).publish_gpu(slot, src, offset, size, info);
      });
}

}  // namespace lavaflow::mpi
