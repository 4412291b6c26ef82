// SPDX-License-Identifier: MIT
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
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

/// The receiving end of a channel over MPI.
struct MpiConsumerLink final : lavaflow::detail::ConsumerLink {
  MPI_Comm comm = MPI_COMM_NULL;
  int peer = 0;
  PeerWatch watch;
  ChannelOptions o;
  Ring ring;
  std::vector<MPI_Request> recvs;
  std::deque<std::uint32_t> posted;  // in posting order: MPI matches messages to them in this order
  std::uint64_t expected = 0, released = 0, credited = 0;
  std::uint32_t incarnation = 0;  // the producer's, from its Hello
  bool ended = false;             // the producer's end marker is in
  bool closed = false;            // close() ran: releases no longer count
  bool answered = false;          // start() answered the producer: it counts on our credits
  std::deque<std::pair<std::unique_ptr<Credit>, MPI_Request>> credits;
  std::unique_ptr<ChunkCopier> copier;  // GPU staging, made on first use
  bool broken = false;                  // lost its place inside a chunked message
  std::string broken_reason;
  Status deferred;  // a release's failure (its ring buffer is out of service): every later receive reports it

  MpiConsumerLink() = default;
  MpiConsumerLink(const MpiConsumerLink&) = delete;
  MpiConsumerLink& operator=(const MpiConsumerLink&) = delete;
  ~MpiConsumerLink() override;

  Status start(const Communicator& comm, int producer_rank, const ChannelOptions& o);

  Result<std::pair<std::uint32_t, MessageInfo>> receive(Duration timeout) override {
    return take_next(timeout, {}, "Consumer::receive");
  }
  void release(std::uint32_t slot) override {
    if (closed) return;
    if (auto ok = give_back(slot); !ok && deferred) deferred = ok;
  }
  std::uint64_t next_sequence() const override { return expected; }
  void close() override;

  /// The ring buffer of `slot` takes the next message again.
  Status give_back(std::uint32_t slot) {
    LF_TRY_STATUS(post(slot));
    ++released;
    return maybe_credit();
  }

  Result<MessageInfo> receive_gpu(const GpuBuffer& dst, std::uint64_t offset, Duration timeout);

  /// A part of message `sequence`'s payload that has arrived: bytes [offset, +bytes) of `total`,
  /// in the ring buffer of `slot`.
  struct Part {
    std::uint32_t slot;
    std::uint64_t sequence, offset, bytes, total;
  };
  using PartFn = std::function<Status(const Part&)>;
  Result<std::pair<std::uint32_t, MessageInfo>> take_next(Duration timeout, const PartFn& on_part, const char* call);

  /// Credits are batched: one per half ring released; the rest goes out when the consumer waits
  /// for a message for a while (see receive()) or closes — off the message path.
  Status maybe_credit() {
    if (released - credited >= std::max<std::uint64_t>(1, o.slots / 2)) return send_credit();
    return {};
  }

  /// Starts `slot`'s receive again. Persistent receives (one per ring buffer, made at open): a
  /// restart costs MPI less than a new MPI_Irecv, on the path of every message.
  Status post(std::uint32_t slot) {
    LF_TRY_STATUS(check(MPI_Start(&recvs[slot]), "MPI_Start(message receive)"));
    posted.push_back(slot);
    return {};
  }

  Status send_credit() {
    credited = released;
    return send_credit_value(released);
  }
  Status send_credit_value(std::uint64_t value) {
    while (!credits.empty()) {
      LF_TRY(bool done, test(credits.front().second, nullptr, "MPI_Test(credit)"));
      if (!done) break;
      credits.pop_front();
    }
    auto c = std::make_unique<Credit>(Credit{value, incarnation});
    MPI_Request r = MPI_REQUEST_NULL;
    LF_TRY_STATUS(
        check(MPI_Isend(c.get(), 2, MPI_UINT64_T, peer, credit_tag(o.channel), comm, &r), "MPI_Isend(credit)"));
    credits.emplace_back(std::move(c), r);
    return {};
  }
};

/// The last releases go out (a producer that closed may still flush), then the word that this
/// end is closed — not after the producer's end marker: nobody waits for it then.
void MpiConsumerLink::close() {
  if (std::exchange(closed, true) || !answered || mpi_finalized()) return;
  if (released != credited) (void)send_credit();
  if (!ended) (void)send_credit_value(kClosedCredit);
}

/// Also when start() fails half-way: no receive outlives the ring buffer it writes into.
MpiConsumerLink::~MpiConsumerLink() {
  if (mpi_finalized()) return;  // a message held past MPI_Finalize: MPI has let go of the ring already
  if (!closed && answered && released != credited) (void)send_credit();
  for (auto& [v, r] : credits) finish_or_cancel(r, std::chrono::milliseconds(500));
  for (auto slot : posted) cancel(recvs[slot]);  // the active ones; then free them all
  for (auto& r : recvs)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
}

/// Waits for the producer's announcement, checks it, allocates the ring, posts a receive on every
/// ring buffer and answers.
Status MpiConsumerLink::start(const Communicator& c, int producer_rank, const ChannelOptions& options) {
  constexpr const char* call = "mpi::open_consumer";
  comm = c.comm();
  peer = producer_rank;
  watch = PeerWatch(c, producer_rank, options.channel);
  // Received into room for more than a Hello, so that another version's announcement (of another
  // size) is told apart by its version field rather than failing as a truncated message.
  alignas(8) std::byte raw[2 * sizeof(Hello)]{};
  MPI_Request r = MPI_REQUEST_NULL;
  LF_TRY_STATUS(check(MPI_Irecv(raw, sizeof raw, MPI_BYTE, producer_rank, hello_tag(options.channel), comm, &r),
                      "MPI_Irecv(announce)"));
  MPI_Status st;
  auto got = poll_until(
      [&] { return test(r, &st, "MPI_Test(announce)"); }, options.connect_timeout, options.wait, Errc::Timeout,
      [&] { return str_format("rank {} did not announce channel {} in time", producer_rank, options.channel); },
      &watch);
  if (!got) {
    cancel(r);
    return std::unexpected(got.error().within(call));
  }
  // Announcements of earlier openings that no consumer took (their producers closed first) come
  // before this opening's: the newest one already here is the one to answer.
  for (;;) {
    int more = 0;
    LF_TRY_STATUS(check(MPI_Iprobe(producer_rank, hello_tag(options.channel), comm, &more, MPI_STATUS_IGNORE),
                        "MPI_Iprobe(announce)"));
    if (!more) break;
    LF_TRY_STATUS(check(MPI_Recv(raw, sizeof raw, MPI_BYTE, producer_rank, hello_tag(options.channel), comm, &st),
                        "MPI_Recv(announce)"));
  }
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  Hello hello{};
  std::memcpy(&hello, raw, sizeof hello);
  if (count < 6 || hello.magic != kHelloMagic)
    return fail(Errc::Malformed, call,
                str_format("rank {} sent {} bytes that are not a channel announcement", producer_rank, count));
  if (hello.version != kVersion)
    return fail(Errc::VersionMismatch, call,
                str_format("announcement version {}, this build speaks {}", hello.version, kVersion));
  if (count != static_cast<int>(sizeof hello))
    return fail(Errc::Malformed, call,
                str_format("rank {} sent a {}-byte announcement; version {} has {}", producer_rank, count, kVersion,
                           sizeof hello));
  if (hello.channel != options.channel)
    return fail(Errc::Malformed, call,
                str_format("announcement for channel {} on channel {}'s tag", hello.channel, options.channel));
  ChannelOptions theirs = options;
  theirs.slots = hello.slots;
  theirs.slot_size = hello.slot_size;
  theirs.policy = FullPolicy::Block;
  if (auto ok = check_options(theirs, call); !ok)
    return std::unexpected(Error(Errc::Malformed, call, "announcement out of range: " + ok.error().cause()));
  o = theirs;
  LF_TRY(ring, make_ring(RingSide::Consumer, theirs.slots, theirs.slot_size,
                         {.vulkan = options.vulkan, .huge_pages = options.huge_pages}));
  recvs.assign(theirs.slots, MPI_REQUEST_NULL);
  for (std::uint32_t k = 0; k < theirs.slots; ++k) {
    LF_TRY_STATUS(check(MPI_Recv_init(ring.host_ptr(k), static_cast<int>(theirs.slot_size + kMaxTrailer), MPI_BYTE,
                                      producer_rank, data_tag(options.channel), comm, &recvs[k]),
                        "MPI_Recv_init(message)"));
    LF_TRY_STATUS(post(k));
  }
  incarnation = hello.incarnation;
  LF_TRY_STATUS(check(MPI_Send(&incarnation, 1, MPI_UINT32_T, producer_rank, ack_tag(options.channel), comm),
                      "MPI_Send(answer)"));
  answered = true;
  return {};
}

/// Waits for the next message in posted order and checks it; for a chunked message, also receives
/// its chunks into the same ring buffer. `on_part` (may be empty) is called for each part of the
/// payload as it is in — the GPU path uploads it then. Returns the slot and the trailer. A channel
/// that loses its place inside a chunked message is marked broken, and that ring buffer is not
/// posted again (a GPU copy may still be reading it; the channel refuses every later call anyway).
Result<std::pair<std::uint32_t, MessageInfo>> MpiConsumerLink::take_next(Duration timeout, const PartFn& on_part,
                                                                         const char* call) {
  auto& m = *this;
  if (!m.deferred) return std::unexpected(m.deferred.error());
  if (m.ended)
    return fail(Errc::PeerLost, call,
                str_format("rank {} closed channel {} after {} messages", m.peer, m.o.channel, m.expected));
  if (m.broken)
    return fail(Errc::Malformed, call, "the channel lost its place in a chunked message earlier: " + m.broken_reason);
  if (m.posted.empty())
    return fail(Errc::WouldBlock, call, "every ring buffer is held by the application: release one first");
  const std::uint32_t slot = m.posted.front();
  MPI_Status st;
  {
    // Leftover credits go out once this wait lasts (the producer may be waiting for room); a short
    // wait — the next message already on its way — costs no extra message and no clock read.
    std::uint32_t misses = 0;
    Clock::time_point wait_start{};
    auto got = poll_until(
        [&]() -> Result<bool> {
          LF_TRY(bool arrived, test(m.recvs[slot], &st, "MPI_Test(message)"));
          if (!arrived && m.released != m.credited && ++misses % 16 == 0) {
            const auto now = Clock::now();
            if (misses == 16)
              wait_start = now;
            else if (now - wait_start > std::chrono::microseconds(20))
              LF_TRY_STATUS(m.send_credit());
          }
          return arrived;
        },
        timeout, m.o.wait, Errc::Timeout,
        [&] { return str_format("no message from rank {} on channel {} in time", m.peer, m.o.channel); }, &m.watch);
    if (!got) {
      if (got.error().code() != Errc::Timeout) {  // e.g. MPI_ERR_TRUNCATE: the receive is over; re-post it
        m.posted.pop_front();
        (void)m.post(slot);
      }
      return std::unexpected(got.error().within(call));
    }
  }
  m.posted.pop_front();
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  std::byte* const base = m.ring.host_ptr(slot);
  auto t = Trailer::read({base, static_cast<std::size_t>(std::max(count, 0))});
  const bool end = t && (t->flags & kEnd) != 0;
  if (end && t->tag != m.incarnation) {  // an earlier opening's end: not ours
    LF_TRY_STATUS(m.post(slot));
    return take_next(timeout, on_part, call);
  }
  const bool chunked = t && (t->flags & kChunked) != 0;
  const std::uint64_t arrived =
      t ? static_cast<std::uint64_t>(count) - t->length() : 0;  // payload bytes in this message
  std::string bad;
  if (!t)
    bad = t.error();
  else if (!t->is_sequence(m.expected))
    bad = str_format("sequence mismatch: message {} (low {} bits) arrived where {} was expected", t->seq,
                     t->is_short ? 14 : 32, m.expected);
  else if (!chunked && arrived > m.o.slot_size)
    bad = str_format("{} payload bytes; the ring buffer holds {}", arrived, m.o.slot_size);
  else if (chunked && (arrived != 0 || t->total == 0 || t->total > m.o.slot_size))
    bad = str_format("chunked message of {} bytes with {} bytes before its trailer; the ring buffer holds {}", t->total,
                     arrived, m.o.slot_size);
  if (!bad.empty()) {
    (void)m.post(slot);
    return fail(Errc::Malformed, call, str_format("rank {}, channel {}: {}", m.peer, m.o.channel, bad));
  }
  if (end) {  // its ring buffer is not posted again: nothing more comes
    m.ended = true;
    return take_next(timeout, on_part, call);
  }
  const std::uint64_t seq = m.expected++;
  const std::uint64_t size = chunked ? t->total : arrived;
  if (on_part) {
    if (auto ok = on_part({slot, seq, 0, arrived, size}); !ok) {
      if (chunked) {  // its chunks are on their way and nobody takes them
        m.broken = true;
        m.broken_reason = ok.error().message();
      } else {
        (void)m.post(slot);
      }
      return std::unexpected(ok.error());
    }
  }
  if (chunked) {
    // The chunks arrive in order on their own tag (MPI does not overtake): receive each straight
    // into its place in the ring buffer.
    const std::uint64_t chunk = 1ull << (t->flags >> 8), n = (size + chunk - 1) / chunk;
    std::vector<MPI_Request> parts(n, MPI_REQUEST_NULL);
    Status status;
    // Each receive takes exactly its chunk's bytes: a longer chunk is MPI_ERR_TRUNCATE, never a
    // write past the slot.
    for (std::uint64_t k = 0; status && k < n; ++k)
      status = check(MPI_Irecv(base + k * chunk, static_cast<int>(std::min(chunk, size - k * chunk)), MPI_BYTE, m.peer,
                               chunk_tag(m.o.channel), m.comm, &parts[k]),
                     "MPI_Irecv(chunk)");
    for (std::uint64_t k = 0; status && k < n; ++k) {
      MPI_Status cst;
      status = poll_until([&] { return test(parts[k], &cst, "MPI_Test(chunk)"); }, timeout, m.o.wait, Errc::Timeout,
                          [&] {
                            return str_format("chunk {} of {} of message {} from rank {} did not arrive in time", k, n,
                                              seq, m.peer);
                          },
                          &m.watch);
      if (!status) break;
      int c = 0;
      MPI_Get_count(&cst, MPI_BYTE, &c);
      const std::uint64_t want = std::min(chunk, size - k * chunk);
      if (static_cast<std::uint64_t>(c) != want)
        status = fail(Errc::Malformed, call,
                      str_format("chunk {} of message {} holds {} bytes, expected {}", k, seq, c, want));
      else if (on_part)
        status = on_part({slot, seq, k * chunk, want, size});
    }
    if (!status) {
      for (auto& r : parts) cancel(r);
      m.broken = true;  // the rest of this message may still come: the stream is out of step
      m.broken_reason = status.error().message();
      return std::unexpected(status.error().within(call));
    }
  }
  return std::pair{slot, MessageInfo{size, t->tag, t->timestamp_ns, seq}};
}

Result<MessageInfo> MpiConsumerLink::receive_gpu(const GpuBuffer& dst, std::uint64_t offset, Duration timeout) {
  constexpr const char* call = "mpi::receive_gpu";
  auto& m = *this;
  LF_TRY_STATUS(check_staging(m.o, dst, offset, 0, call));
  if (!m.copier) {
    LF_TRY(m.copier, ChunkCopier::create(*m.o.vulkan));
  }
  // Each part is uploaded as it lands. The whole message must fit at `offset`; its size is known
  // only from its trailer, so the first part checks it (the message is then consumed and reported).
  std::vector<std::size_t> tickets;                // every copy is waited for: fences of separate submissions
  auto upload = [&](const Part& part) -> Status {  // may signal out of order
    if (part.offset == 0 && offset + part.total > dst.size())
      return fail(Errc::InvalidArgument, call,
                  str_format("message {} of {} bytes does not fit at offset {} of a {}-byte GPU buffer", part.sequence,
                             part.total, offset, dst.size()));
    if (part.bytes == 0) return {};
    LF_TRY(auto t, m.copier->copy(m.ring.staging[part.slot], part.offset, dst.buffer(),
                                  dst.offset() + offset + part.offset, part.bytes));
    tickets.push_back(t);
    return {};
  };
  LF_TRY(auto got, m.take_next(timeout, upload, call));
  Status waited;
  for (auto t : tickets)
    if (waited) waited = m.copier->wait(t, std::chrono::seconds(10));
  LF_TRY_STATUS(give_back(got.first));  // the GPU is done reading the ring buffer (or gave up)
  LF_TRY_STATUS(waited);
  return got.second;
}

}  // namespace

Result<std::unique_ptr<Consumer>> open_mpi_consumer(const Communicator& comm, int producer_rank,
                                                    const ChannelOptions& o, lavaflow::detail::LinkedEnd end) {
  LF_TRY_STATUS(detail::check_channel(o.channel, "mpi::open_consumer"));
  auto link = std::make_unique<MpiConsumerLink>();
  LF_TRY_STATUS(link->start(comm, producer_rank, o));
  end.slots = link->o.slots;
  end.slot_size = link->o.slot_size;
  end.wait = o.wait;
  end.vulkan = o.vulkan;
  end.peer_pid = comm.location(producer_rank).pid;
  end.ring = slot_buffers(link->ring, link->o.slot_size);
  return lavaflow::detail::make_consumer(std::move(end), std::move(link));
}

}  // namespace lavaflow::mpi::detail

namespace lavaflow::mpi {

Result<MessageInfo> receive_gpu(Consumer& consumer, const GpuBuffer& dst, std::uint64_t offset, Duration timeout) {
  constexpr const char* call = "mpi::receive_gpu";
  auto* link = dynamic_cast<detail::MpiConsumerLink*>(lavaflow::detail::link_of(consumer));
  if (!link)
    return fail(Errc::InvalidArgument, call,
                str_format("the channel is on the {} route, not over MPI: receive and copy the ring buffer instead",
                           to_string(consumer.route().transport)));
  if (consumer.closed()) return fail(Errc::InvalidArgument, call, "the consumer is closed");
  return link->receive_gpu(dst, offset, timeout);
}

}  // namespace lavaflow::mpi
