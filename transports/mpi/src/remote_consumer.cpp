// SPDX-License-Identifier: MIT
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <span>

#include "checks.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/mpi/mpi.hpp"
#include "ring.hpp"
#include "wait.hpp"
#include "wire.hpp"

namespace lavaflow::mpi {

using namespace detail;

// ----- RemoteConsumer

struct RemoteConsumer::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  int peer = 0;
  PeerWatch watch;
  RemoteOptions o;
  Ring ring;
  std::vector<MPI_Request> recvs;
  std::deque<std::uint32_t> posted;  // in posting order: MPI matches messages to them in this order
  std::uint64_t expected = 0, released = 0, credited = 0;
  std::deque<std::pair<std::unique_ptr<std::uint64_t>, MPI_Request>> credits;
  std::unique_ptr<ChunkCopier> copier;  // GPU staging, made on first use
  bool broken = false;                  // lost its place inside a chunked message
  std::string broken_reason;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();

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
    while (!credits.empty()) {
      LF_TRY(bool done, test(credits.front().second, nullptr, "MPI_Test(credit)"));
      if (!done) break;
      credits.pop_front();
    }
    credited = released;
    auto value = std::make_unique<std::uint64_t>(released);
    MPI_Request r = MPI_REQUEST_NULL;
    LF_TRY_STATUS(
        check(MPI_Isend(value.get(), 1, MPI_UINT64_T, peer, credit_tag(o.channel), comm, &r), "MPI_Isend(credit)"));
    credits.emplace_back(std::move(value), r);
    return {};
  }
};

RemoteConsumer::RemoteConsumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemoteConsumer::~RemoteConsumer() = default;

/// Also when open() fails half-way: no receive outlives the ring buffer it writes into.
RemoteConsumer::Impl::~Impl() {
  if (released != credited) (void)send_credit();
  for (auto& [v, r] : credits) finish_or_cancel(r, std::chrono::milliseconds(500));
  for (auto slot : posted) cancel(recvs[slot]);  // the active ones; then free them all
  for (auto& r : recvs)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
}

Result<std::unique_ptr<RemoteConsumer>> RemoteConsumer::open(const Communicator& comm, int producer_rank,
                                                             RemoteOptions o) {
  constexpr const char* call = "mpi::RemoteConsumer::open";
  LF_TRY_STATUS(detail::check_peer(comm, producer_rank, call));
  LF_TRY_STATUS(detail::check_channel(o.channel, call));
  auto m = std::make_unique<Impl>();
  m->comm = comm.comm();
  m->peer = producer_rank;
  m->watch = PeerWatch(comm, producer_rank, o.channel);
  Hello hello{};
  MPI_Request r = MPI_REQUEST_NULL;
  LF_TRY_STATUS(check(MPI_Irecv(&hello, sizeof hello, MPI_BYTE, producer_rank, hello_tag(o.channel), m->comm, &r),
                      "MPI_Irecv(announce)"));
  MPI_Status st;
  auto got = poll_until(
      [&] { return test(r, &st, "MPI_Test(announce)"); }, o.connect_timeout, o.wait, Errc::Timeout,
      [&] { return str_format("rank {} did not announce channel {} in time", producer_rank, o.channel); }, &m->watch);
  if (!got) {
    cancel(r);
    return std::unexpected(got.error().within(call));
  }
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  if (count != static_cast<int>(sizeof hello) || hello.magic != kHelloMagic)
    return fail(Errc::Malformed, call,
                str_format("rank {} sent {} bytes that are not a channel announcement", producer_rank, count));
  if (hello.version != kVersion)
    return fail(Errc::VersionMismatch, call,
                str_format("announcement version {}, this build speaks {}", hello.version, kVersion));
  if (hello.channel != o.channel)
    return fail(Errc::Malformed, call,
                str_format("announcement for channel {} on channel {}'s tag", hello.channel, o.channel));
  RemoteOptions theirs = o;
  theirs.slots = hello.slots;
  theirs.slot_size = hello.slot_size;
  theirs.policy = FullPolicy::Block;
  if (auto ok = check_options(theirs, call); !ok)
    return std::unexpected(Error(Errc::Malformed, call, "announcement out of range: " + ok.error().cause()));
  m->o = theirs;
  LF_TRY(m->ring, make_ring(theirs.slots, theirs.slot_size, o.vulkan, o.huge_pages));
  m->recvs.assign(theirs.slots, MPI_REQUEST_NULL);
  for (std::uint32_t k = 0; k < theirs.slots; ++k) {
    LF_TRY_STATUS(check(MPI_Recv_init(m->ring.host_ptr(k), static_cast<int>(theirs.slot_size + kMaxTrailer), MPI_BYTE,
                                      producer_rank, data_tag(o.channel), m->comm, &m->recvs[k]),
                        "MPI_Recv_init(message)"));
    LF_TRY_STATUS(m->post(k));
  }
  std::uint32_t answer = kHelloMagic;
  LF_TRY_STATUS(
      check(MPI_Send(&answer, 1, MPI_UINT32_T, producer_rank, ack_tag(o.channel), m->comm), "MPI_Send(answer)"));
  return std::unique_ptr<RemoteConsumer>(new RemoteConsumer(std::move(m)));
}

/// Waits for the next message in posted order and checks it; for a chunked message, also receives
/// its chunks into the same ring buffer. `on_part` (may be empty) is called for each part of the
/// payload as it is in — the GPU path uploads it then. Returns the slot and the trailer. A channel
/// that loses its place inside a chunked message is marked broken, and that ring buffer is not
/// posted again (a GPU copy may still be reading it; the channel refuses every later call anyway).
Result<std::pair<std::uint32_t, MessageInfo>> RemoteConsumer::Impl::take_next(Duration timeout, const PartFn& on_part,
                                                                              const char* call) {
  auto& m = *this;
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

Result<RemoteReceived> RemoteConsumer::receive(Duration timeout) {
  LF_TRY(auto got, impl_->take_next(timeout, {}, "mpi::RemoteConsumer::receive"));
  return RemoteReceived(this, got.first, got.second);
}

Result<MessageInfo> RemoteConsumer::receive_gpu(const GpuBuffer& dst, std::uint64_t offset, Duration timeout) {
  constexpr const char* call = "mpi::RemoteConsumer::receive_gpu";
  auto& m = *impl_;
  LF_TRY_STATUS(check_staging(m.o, dst, offset, 0, call));
  if (!m.copier) {
    LF_TRY(m.copier, ChunkCopier::create(*m.o.vulkan));
  }
  // Each part is uploaded as it lands. The whole message must fit at `offset`; its size is known
  // only from its trailer, so the first part checks it (the message is then consumed and reported).
  std::vector<std::size_t> tickets;                      // every copy is waited for: fences of separate submissions
  auto upload = [&](const Impl::Part& part) -> Status {  // may signal out of order
    if (part.offset == 0 && offset + part.total > dst.size())
      return fail(Errc::InvalidArgument, call,
                  str_format("message {} of {} bytes does not fit at offset {} of a {}-byte GPU buffer", part.sequence,
                             part.total, offset, dst.size()));
    if (part.bytes == 0) return {};
    LF_TRY(auto t, m.copier->copy(m.ring.pinned[part.slot].gpu_buffer(), part.offset, dst.buffer(),
                                  dst.offset() + offset + part.offset, part.bytes));
    tickets.push_back(t);
    return {};
  };
  LF_TRY(auto got, m.take_next(timeout, upload, call));
  Status waited;
  for (auto t : tickets)
    if (waited) waited = m.copier->wait(t, std::chrono::seconds(10));
  LF_TRY_STATUS(release(got.first));  // the GPU is done reading the ring buffer (or gave up)
  LF_TRY_STATUS(waited);
  return got.second;
}

Result<RemoteReceived> RemoteConsumer::try_receive() {
  auto r = receive(Duration::zero());
  if (!r && r.error().code() == Errc::Timeout)
    return fail(Errc::WouldBlock, "mpi::RemoteConsumer::try_receive", "no message yet");
  return r;
}

Status RemoteConsumer::release(std::uint32_t slot) {
  auto& m = *impl_;
  LF_TRY_STATUS(m.post(slot));
  ++m.released;
  return m.maybe_credit();
}

std::uint64_t RemoteConsumer::slot_size() const { return impl_->o.slot_size; }
std::uint32_t RemoteConsumer::slots() const { return impl_->o.slots; }

RemoteReceived::RemoteReceived(RemoteReceived&& o) noexcept
    : consumer_(std::exchange(o.consumer_, nullptr)), slot_(o.slot_), info_(o.info_) {}
RemoteReceived::~RemoteReceived() { (void)release(); }
Status RemoteReceived::release() {
  if (!consumer_) return {};
  auto* c = std::exchange(consumer_, nullptr);
  return c->release(slot_);
}
std::span<const std::byte> RemoteReceived::bytes() const {
  if (!consumer_) return {};
  return consumer_->impl_->ring.bytes(slot_).first(info_.size);
}

}  // namespace lavaflow::mpi
