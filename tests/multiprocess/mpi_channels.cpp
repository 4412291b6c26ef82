// SPDX-License-Identifier: MIT
// Channels between MPI ranks, run under `mpiexec -n 2` (rank 0 produces, rank 1 consumes): the
// MPI route (forced, though both ranks share a host), then every route through the same Producer
// and Consumer. Prints "mpi-channels: OK" from rank
// 0 when every check held on both ranks; exits non-zero naming the failed check otherwise.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "expect.hpp"
#include "lavaflow/core/cpu_buffer.hpp"
#include "lavaflow/core/transfer.hpp"
#include "lavaflow/mpi/mpi.hpp"
#include "payload.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;

namespace {

using lftest::expect;
using lftest::failures;
using lftest::is;

/// A Stager for `vk` in `s` (made once); false without a Vulkan context.
bool staged(std::optional<Stager>& s, const VulkanContext* vk, std::uint64_t capacity) {
  if (!s && vk)
    if (auto made = Stager::create(*vk, capacity)) s.emplace(std::move(*made));
  return s.has_value();
}

constexpr int kDataTagOf(int channel) { return channel * 8; }  // lavaflow::mpi's data tag of a channel

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    auto comm = mpi::Communicator::create();
    if (!comm || comm->size() != 2) {
      std::fprintf(stderr, "mpi-channels needs exactly 2 ranks\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const int me = comm->rank();
    auto barrier = [&] { MPI_Barrier(comm->comm()); };

    // 0. The MPI transport's ring buffers, on each rank: allocate() gives private memory (huge-page
    // aligned when large), import() makes the consumer's of the announced shape and takes no fd.
    {
      const auto t = mpi::mpi_transport();
      auto big = t->allocate({}, 1u << 20);
      expect(big && (*big)->kind() == BufferKind::CpuPrivate && (*big)->size() == (1u << 20) &&
                 reinterpret_cast<std::uintptr_t>((*big)->host_ptr()) % (2u << 20) == 0 &&
                 (*big)->host_ptr()[(1u << 20) - 1] == std::byte{0},
             "allocate: 1 MiB of zeroed private memory on a 2 MiB boundary (huge pages asked for)");
      if (big) {
        std::memset((*big)->host_ptr(), 0x5a, (*big)->size());
        expect(is((*big)->export_handle(), Errc::Unsupported), "an MPI ring buffer has no fd to export");
      }
      auto small = t->allocate({.huge_pages = false}, 100);
      expect(small && (*small)->size() == 100 && reinterpret_cast<std::uintptr_t>((*small)->host_ptr()) % 4096 == 0,
             "allocate: 100 bytes on a page");
      expect(is(t->allocate({}, 0), Errc::InvalidArgument), "allocate: 0 bytes refused");
      ExportDescriptor d;
      d.kind = BufferKind::CpuPrivate;
      d.allocation_size = d.buffer_size = d.size = 8192;
      auto mirror = t->import({}, d, UniqueFd{});
      expect(mirror && (*mirror)->size() == 8192 && (*mirror)->host_ptr() != nullptr, "import: the announced shape");
      auto memfd = CpuBuffer::allocate({.size = 8192, .strategy = CpuStrategy::SharedMemory});
      auto exported = memfd ? memfd->export_handle() : Result<Export>(std::unexpected(memfd.error()));
      if (exported) {
        expect(is(t->import({}, d, std::move(exported->fd)), Errc::InvalidArgument) && exported->fd,
               "import: an fd is refused, and stays the caller's");
      } else {
        expect(false, "a memfd to offer: " + exported.error().message());
      }
      d.kind = BufferKind::CpuShared;
      expect(is(t->import({}, d, UniqueFd{}), Errc::InvalidArgument), "import: a shared-memory kind refused");
      d.kind = BufferKind::CpuGpuPinned;
      expect(is(t->import({}, d, UniqueFd{}), Errc::InvalidArgument), "import: pinned memory without a device refused");
      d.kind = BufferKind::CpuPrivate;
      d.size = 0;
      expect(is(t->import({}, d, UniqueFd{}), Errc::InvalidArgument), "import: an empty descriptor refused");
      expect(is(Producer::create("lf-test-mpi-by-name-" + std::to_string(me),
                                 {.transport = TransportKind::Mpi, .transports = {t}}),
                Errc::Unsupported),
             "a channel over MPI by name is refused (it is made between ranks)");
    }

    // 1. A stream of 20,000 messages of varying size, verified in order.
    const std::uint64_t n = 20000;
    if (me == 0) {
      // Timestamped (the trailer carries a timestamp only when asked): checked by the consumer.
      auto p = mpi::open_producer(
          *comm, 1,
          {.slots = 8, .slot_size = 65536, .timestamps = true, .channel = 1, .transport = TransportKind::Mpi});
      expect(bool(p), "create producer");
      std::vector<std::byte> msg;
      for (std::uint64_t i = 0; p && i < n; ++i) {
        auto loan = (*p)->loan(10s);
        if (!loan) {
          expect(false, "loan: " + loan.error().message());
          break;
        }
        msg.resize(1 + (i * 7919) % 65536);
        lfapp::fill_message(msg, i);
        std::memcpy(loan->bytes().data(), msg.data(), msg.size());
        auto info = (*p)->publish(std::move(*loan), {.size = msg.size(), .user_tag = lfapp::checksum(msg)});
        expect(info && info->sequence == i, "publish");
      }
      if (p) expect(bool((*p)->flush(10s)), "flush");
    } else {
      auto c = mpi::open_consumer(*comm, 0, {.channel = 1, .transport = TransportKind::Mpi});
      expect(bool(c), "open consumer");
      std::uint64_t last_ts = 0;
      for (std::uint64_t i = 0; c && i < n; ++i) {
        auto r = (*c)->receive(10s);
        if (!r) {
          expect(false, "receive: " + r.error().message());
          break;
        }
        expect(r->info().sequence == i && r->bytes().size() == 1 + (i * 7919) % 65536 &&
                   lfapp::checksum(r->bytes()) == r->info().user_tag && lfapp::matches(r->bytes(), i),
               "message " + std::to_string(i) + " intact");
        expect(r->info().timestamp_ns >= last_ts && r->info().timestamp_ns > 0,
               "message " + std::to_string(i) + " timestamped, in order");
        last_ts = r->info().timestamp_ns;
      }
      expect(mpi::gpu_awareness().how.size() > 0, "MPI's GPU support is reported");
    }
    barrier();

    // 1b. Large messages (from 512 KiB publish() sends the trailer ahead of the payload): sizes
    //     around the switch and up to 2 MiB, some odd, verified byte for byte with their tags.
    {
      const std::uint64_t sizes[] = {
          (512u << 10) - 1, 512u << 10, (512u << 10) + 1, 1u << 20, 1000003, 2u << 20, 8, 777777};
      if (me == 0) {
        auto p = mpi::open_producer(
            *comm, 1,
            {.slots = 3, .slot_size = 2u << 20, .timestamps = true, .channel = 7, .transport = TransportKind::Mpi});
        expect(bool(p), "large: create producer");
        std::vector<std::byte> msg;
        for (std::uint64_t i = 0; p && i < std::size(sizes); ++i) {
          auto loan = (*p)->loan(10s);
          if (!loan) {
            expect(false, "large: loan: " + loan.error().message());
            break;
          }
          msg.resize(sizes[i]);
          lfapp::fill_message(msg, i);
          std::memcpy(loan->bytes().data(), msg.data(), msg.size());
          expect(bool((*p)->publish(std::move(*loan), {.size = msg.size(), .user_tag = lfapp::checksum(msg)})),
                 "large: publish");
        }
        if (p) expect(bool((*p)->flush(10s)), "large: flush");
      } else {
        auto c = mpi::open_consumer(*comm, 0, {.channel = 7, .transport = TransportKind::Mpi});
        expect(bool(c), "large: open consumer");
        for (std::uint64_t i = 0; c && i < std::size(sizes); ++i) {
          auto r = (*c)->receive(10s);
          if (!r) {
            expect(false, "large: receive: " + r.error().message());
            break;
          }
          expect(r->info().sequence == i && r->bytes().size() == sizes[i] && r->info().timestamp_ns > 0 &&
                     lfapp::checksum(r->bytes()) == r->info().user_tag && lfapp::matches(r->bytes(), i),
                 "large message " + std::to_string(i) + " (" + std::to_string(sizes[i]) + " bytes) intact");
        }
      }
      barrier();
    }

    // 1c. Small messages without user tag or timestamp (a 2-byte trailer up to 64 bytes, the full
    //     one above): every size 0 … 80 in turn, 20,000 messages, so the 14-bit sequence wraps.
    {
      const std::uint64_t count = 20000;
      auto size_of = [](std::uint64_t i) { return (i * 37) % 81; };
      if (me == 0) {
        auto p =
            mpi::open_producer(*comm, 1, {.slots = 16, .slot_size = 80, .channel = 8, .transport = TransportKind::Mpi});
        expect(bool(p), "small: create producer");
        std::vector<std::byte> msg;
        for (std::uint64_t i = 0; p && i < count; ++i) {
          auto loan = (*p)->loan(10s);
          if (!loan) {
            expect(false, "small: loan: " + loan.error().message());
            break;
          }
          msg.resize(size_of(i));
          lfapp::fill_message(msg, i);
          if (!msg.empty()) std::memcpy(loan->bytes().data(), msg.data(), msg.size());
          // size 0 means the whole slot: a 0-byte message is sent as 80 bytes, like every channel
          auto info = (*p)->publish(std::move(*loan), {.size = msg.size()});
          expect(info && info->sequence == i, "small: publish");
        }
        if (p) expect(bool((*p)->flush(10s)), "small: flush");
      } else {
        auto c = mpi::open_consumer(*comm, 0, {.channel = 8, .transport = TransportKind::Mpi});
        expect(bool(c), "small: open consumer");
        std::vector<std::byte> want;
        for (std::uint64_t i = 0; c && i < count; ++i) {
          auto r = (*c)->receive(10s);
          if (!r) {
            expect(false, "small: receive: " + r.error().message());
            break;
          }
          const std::uint64_t size = size_of(i) == 0 ? 80 : size_of(i);
          want.resize(size);
          lfapp::fill_message(want, i);
          expect(r->info().sequence == i && r->bytes().size() == size && r->info().user_tag == 0 &&
                     (size_of(i) == 0 || std::memcmp(r->bytes().data(), want.data(), size) == 0),
                 "small message " + std::to_string(i) + " (" + std::to_string(size) + " bytes) intact");
        }
      }
      barrier();
    }

    // 2. Full ring: FailFast says WouldBlock, Block times out naming the consumer; DropOldest is refused.
    if (me == 0) {
      expect(is(mpi::open_producer(*comm, 1,
                                   {.policy = FullPolicy::DropOldest, .channel = 2, .transport = TransportKind::Mpi}),
                Errc::Unsupported),
             "DropOldest refused");
      auto p = mpi::open_producer(
          *comm, 1,
          {.slots = 2, .slot_size = 64, .policy = FullPolicy::FailFast, .channel = 3, .transport = TransportKind::Mpi});
      for (int i = 0; p && i < 2; ++i) {
        auto loan = (*p)->loan(10s);
        expect(loan && (*p)->publish(std::move(*loan), {.size = 8}).has_value(), "publish into empty ring");
      }
      if (p) expect(is((*p)->try_loan(), Errc::WouldBlock), "full ring: WouldBlock");
      auto q =
          mpi::open_producer(*comm, 1, {.slots = 1, .slot_size = 64, .channel = 4, .transport = TransportKind::Mpi});
      if (q) {
        auto loan = (*q)->loan(10s);
        expect(loan && (*q)->publish(std::move(*loan), {.size = 8}).has_value(), "publish one");
        const auto t0 = std::chrono::steady_clock::now();
        auto again = (*q)->loan(200ms);
        expect(is(again, Errc::Timeout) && again.error().cause().find("rank 1") != std::string::npos,
               "Block: Timeout naming rank 1");
        expect(std::chrono::steady_clock::now() - t0 < 2s, "timeout bounded");
      }
      barrier();  // the consumer is done with channels 3 and 4
    } else {
      auto c3 = mpi::open_consumer(*comm, 0, {.channel = 3, .transport = TransportKind::Mpi});
      auto c4 = mpi::open_consumer(*comm, 0, {.channel = 4, .transport = TransportKind::Mpi});
      expect(c3 && c4, "open consumers 3 and 4");
      // Holds what arrives without releasing: the producers see a full ring.
      std::vector<Received> held;
      for (int i = 0; c3 && i < 2; ++i)
        if (auto r = (*c3)->receive(10s)) held.push_back(std::move(*r));
      if (c4)
        if (auto r = (*c4)->receive(10s)) held.push_back(std::move(*r));
      expect(held.size() == 3, "three messages held");
      if (c4) expect(is((*c4)->receive(10s), Errc::InvalidArgument), "every buffer held: refused, as on every route");
      barrier();
    }

    // 3. Malformed bytes on the wire: a bad trailer, a wrong sequence, an oversize message; and a
    //    receive timeout.
    if (me == 0) {
      auto p =
          mpi::open_producer(*comm, 1, {.slots = 4, .slot_size = 128, .channel = 5, .transport = TransportKind::Mpi});
      barrier();  // the consumer has posted its receives
      std::vector<std::byte> junk(64 + 16, std::byte{0x5a});
      MPI_Send(junk.data(), static_cast<int>(junk.size()), MPI_BYTE, 1, kDataTagOf(5), comm->comm());
      // 16 payload bytes, then a trailer: sequence 7 (0 expected), no flags, magic 'L' + wire version 5
      const std::uint32_t trailer[2] = {7, 0x4c05u << 16};
      std::memcpy(junk.data() + 16, trailer, sizeof trailer);
      MPI_Send(junk.data(), 16 + sizeof trailer, MPI_BYTE, 1, kDataTagOf(5), comm->comm());
      std::vector<std::byte> big(64 + 4096);
      MPI_Send(big.data(), static_cast<int>(big.size()), MPI_BYTE, 1, kDataTagOf(5), comm->comm());
      // 8 payload bytes and a short trailer (marker bits, low 14 bits of the sequence): sequence 5.
      const std::uint16_t short_trailer = 0xC000 | 5;
      std::memcpy(junk.data() + 8, &short_trailer, 2);
      MPI_Send(junk.data(), 10, MPI_BYTE, 1, kDataTagOf(5), comm->comm());
      // 100 payload bytes before a short trailer: only messages up to 64 bytes have one.
      std::vector<std::byte> long_short(102, std::byte{0});
      const std::uint16_t seq0 = 0xC000;
      std::memcpy(long_short.data() + 100, &seq0, 2);
      MPI_Send(long_short.data(), 102, MPI_BYTE, 1, kDataTagOf(5), comm->comm());
      barrier();
    } else {
      auto c = mpi::open_consumer(*comm, 0, {.channel = 5, .transport = TransportKind::Mpi});
      barrier();
      if (c) {
        auto bad = (*c)->receive(10s);
        expect(is(bad, Errc::Malformed) && bad.error().cause().find("magic") != std::string::npos,
               "bad trailer: Malformed");
        auto seq = (*c)->receive(10s);
        expect(is(seq, Errc::Malformed) && seq.error().cause().find("sequence mismatch") != std::string::npos,
               "wrong sequence: Malformed (" + (seq ? std::string("ok") : seq.error().message()) + ")");
        auto big = (*c)->receive(10s);
        expect(is(big, Errc::Malformed),
               "oversize message: Malformed (" + (big ? std::string("ok") : big.error().message()) + ")");
        auto short_seq = (*c)->receive(10s);
        expect(
            is(short_seq, Errc::Malformed) && short_seq.error().cause().find("sequence mismatch") != std::string::npos,
            "wrong sequence in a short trailer: Malformed (" +
                (short_seq ? std::string("ok") : short_seq.error().message()) + ")");
        auto long_short = (*c)->receive(10s);
        expect(is(long_short, Errc::Malformed) && long_short.error().cause().find("short trailer") != std::string::npos,
               "100 bytes before a short trailer: Malformed (" +
                   (long_short ? std::string("ok") : long_short.error().message()) + ")");
        const auto t0 = std::chrono::steady_clock::now();
        expect(is((*c)->receive(100ms), Errc::Timeout), "nothing sent: Timeout");
        expect(std::chrono::steady_clock::now() - t0 < 2s, "receive timeout bounded");
      }
      barrier();
    }

    // 3b. A chunked message whose last chunk is longer than announced: the consumer refuses it and
    //     never writes past its ring buffer (one 64 KiB + 100-byte slot; the chunk would reach
    //     125 KiB — ASAN watches), and the channel says it lost its place from then on.
    if (me == 0) {
      const std::uint64_t total = 65536 + 100;
      auto p =
          mpi::open_producer(*comm, 1, {.slots = 1, .slot_size = total, .channel = 6, .transport = TransportKind::Mpi});
      barrier();
      // Trailer only: the total, then sequence 0, flags chunked | log2(64 KiB) << 8, magic + version.
      std::byte msg[16];
      std::memcpy(msg, &total, 8);
      const std::uint32_t end[2] = {0, (0x4c05u << 16) | (16u << 8) | 1u};
      std::memcpy(msg + 8, end, 8);
      MPI_Send(msg, 16, MPI_BYTE, 1, kDataTagOf(6), comm->comm());
      std::vector<std::byte> chunk(65536, std::byte{1});
      MPI_Send(chunk.data(), 65536, MPI_BYTE, 1, kDataTagOf(6) + 4, comm->comm());  // chunk 0: right
      MPI_Send(chunk.data(), 60000, MPI_BYTE, 1, kDataTagOf(6) + 4, comm->comm());  // chunk 1: 100 announced
      barrier();
    } else {
      auto c = mpi::open_consumer(*comm, 0, {.channel = 6, .transport = TransportKind::Mpi});
      barrier();
      if (c) {
        auto r = (*c)->receive(10s);
        expect(is(r, Errc::Malformed),
               "oversize chunk: Malformed (" + (r ? std::string("ok") : r.error().message()) + ")");
        auto again = (*c)->receive(100ms);
        expect(is(again, Errc::Malformed) && again.error().cause().find("lost its place") != std::string::npos,
               "after a bad chunk the channel says it is out of step");
      }
      barrier();
    }

    // 5. GPU staging: a device-local Vulkan buffer sent in pipelined chunks (1 MiB + remainder),
    //    received once straight into the consumer's GPU buffer and once through plain receive().
    {
      auto vk = VulkanContext::create();
      int have = vk ? 1 : 0, both = 0;
      MPI_Allreduce(&have, &both, 1, MPI_INT, MPI_MIN, comm->comm());
      if (!both) {
        if (me == 0) std::printf("LAVAFLOW-SKIP: GPU staging part: no Vulkan device on both ranks\n");
      } else {
        const std::uint64_t size = (5u << 20) + 4321;  // 5 chunks of 1 MiB and a partial one
        auto pattern = [](std::uint64_t i, int k) {
          return static_cast<std::byte>((i * 131 + static_cast<std::uint64_t>(k) * 7) >> 3);
        };
        const mpi::ChannelOptions o{.slots = 2,
                                    .slot_size = size,
                                    .channel = 11,
                                    .transport = TransportKind::Mpi,
                                    .vulkan = &*vk,
                                    .chunk = 1 << 20};
        if (me == 0) {
          auto src = GpuBuffer::allocate(*vk, {.size = size, .memory = GpuMemory::DeviceLocal});
          auto p = mpi::open_producer(*comm, 1, o);
          expect(src && p, "GPU staging: producer and source buffer");
          for (int k = 0; src && p && k < 2; ++k) {
            std::vector<std::byte> data(size);
            for (std::uint64_t i = 0; i < size; ++i) data[i] = pattern(i, k);
            expect(bool(upload(*vk, *src, data)), "GPU staging: upload");
            auto loan = (*p)->loan(10s);
            expect(bool(loan), "GPU staging: loan");
            if (!loan) break;
            auto info = mpi::publish_gpu(**p, std::move(*loan), *src, 0, size, {.user_tag = 77});
            expect(bool(info), "GPU staging: publish_gpu " + (info ? std::string() : info.error().message()));
          }
          if (p) expect(bool((*p)->flush(30s)), "GPU staging: flush");
          // Misuse: a range outside the buffer is refused before anything is sent.
          if (p && src) {
            auto loan = (*p)->loan(10s);
            if (loan)
              expect(is(mpi::publish_gpu(**p, std::move(*loan), *src, 16, size, {}), Errc::InvalidArgument),
                     "GPU staging: range checked");
          }
        } else {
          auto dst = GpuBuffer::allocate(*vk, {.size = size + 100, .memory = GpuMemory::DeviceLocal});
          auto c = mpi::open_consumer(*comm, 0, o);
          expect(dst && c, "GPU staging: consumer and destination buffer");
          if (dst && c) {
            auto info = mpi::receive_gpu(**c, *dst, 100, 30s);
            expect(info && info->size == size && info->user_tag == 77,
                   "GPU staging: receive_gpu " + (info ? std::string() : info.error().message()));
            std::vector<std::byte> back(size + 100);
            expect(bool(download(*vk, *dst, back)), "GPU staging: download");
            bool same = true;
            for (std::uint64_t i = 0; i < size && same; ++i) same = back[100 + i] == pattern(i, 0);
            expect(same, "GPU staging: every byte arrived in the GPU buffer");
            auto r = (*c)->receive(30s);  // the same kind of message, through the host ring
            expect(r && r->bytes().size() == size, "GPU staging: plain receive of a chunked message");
            bool same2 = bool(r);
            for (std::uint64_t i = 0; r && i < size && same2; ++i) same2 = r->bytes()[i] == pattern(i, 1);
            expect(same2, "GPU staging: every byte of the chunked message in the ring buffer");
          }
        }
      }
      barrier();
    }

    // 6. One API on every route. The same stream through the route the Communicator
    //    picks (both ranks share this host: Vulkan IPC or shm), forced shm and forced MPI.
    {
      const auto want_auto = comm->route(0, 1) ? comm->route(0, 1)->transport : TransportKind::Mpi;
      const std::optional<TransportKind> forced[] = {std::nullopt, TransportKind::Shm, TransportKind::Mpi};
      for (int k = 0; k < 3; ++k) {
        const auto want = forced[k].value_or(want_auto);
        const std::string label =
            "rank channel (" + std::string(forced[k] ? "" : "auto: ") + std::string(to_string(want)) + "): ";
        const mpi::ChannelOptions o{
            .slots = 4, .slot_size = 4096, .channel = 20 + k, .transport = forced[k], .connect_timeout = 10s};
        const std::uint64_t count = 3000;
        if (me == 0) {
          auto p = mpi::open_producer(*comm, 1, o);
          expect(bool(p), label + "create " + (p ? std::string() : p.error().message()));
          if (p) {
            expect((*p)->route().transport == want && !(*p)->route().reason.empty(),
                   label + "producer's route is " + std::string(to_string(want)));
            expect(is((*p)->try_loan(), Errc::WouldBlock), label + "try_loan before the consumer opens: WouldBlock");
          }
          barrier();
          std::vector<std::byte> msg;
          std::optional<Stager> stager;  // a device-local Vulkan ring (a discrete GPU) has no bytes()
          for (std::uint64_t i = 0; p && i < count; ++i) {
            auto loan = (*p)->loan(10s);
            if (!loan) {
              expect(false, label + "loan: " + loan.error().message());
              break;
            }
            msg.resize(1 + (i * 131) % 4096);
            lfapp::fill_message(msg, i);
            if (want == TransportKind::Mpi)
              expect(loan->buffer().kind() == BufferKind::CpuPrivate &&
                         is(loan->buffer().export_handle(), Errc::Unsupported),
                     label + "the ring buffer stays in this process");
            if (!loan->bytes().empty()) {
              std::memcpy(loan->bytes().data(), msg.data(), msg.size());
            } else if (auto ok = staged(stager, (*p)->vulkan(), 4096)
                                     ? stager->upload(dynamic_cast<GpuBuffer&>(loan->buffer()), msg)
                                     : Status(fail(Errc::Unsupported, "test", "no Vulkan context"));
                       !ok) {
              expect(false, label + "upload: " + ok.error().message());
              break;
            }
            auto info = (*p)->publish(std::move(*loan), {.size = msg.size(), .user_tag = lfapp::checksum(msg)});
            expect(info && info->sequence == i, label + "publish");
          }
          if (p) expect(bool((*p)->flush(10s)), label + "flush");
        } else {
          barrier();
          auto c = mpi::open_consumer(*comm, 0, o);
          expect(bool(c), label + "open " + (c ? std::string() : c.error().message()));
          if (c)
            expect((*c)->route().transport == want && (*c)->slots() == 4 && (*c)->slot_size() == 4096,
                   label + "consumer's route and ring");
          std::optional<Stager> stager;
          std::vector<std::byte> down;
          for (std::uint64_t i = 0; c && i < count; ++i) {
            auto r = (*c)->receive(10s);
            if (!r) {
              expect(false, label + "receive: " + r.error().message());
              break;
            }
            std::span<const std::byte> got = r->bytes();
            if (got.empty() && staged(stager, (*c)->vulkan(), 4096)) {  // device-local ring
              down.resize(r->info().size);
              expect(bool(stager->download(dynamic_cast<GpuBuffer&>(r->buffer()), down)), label + "download");
              got = down;
            }
            expect(r->info().sequence == i && got.size() == 1 + (i * 131) % 4096 &&
                       lfapp::checksum(got) == r->info().user_tag && lfapp::matches(got, i),
                   label + "message " + std::to_string(i) + " intact");
          }
        }
        barrier();
      }
      // Refusals name their cause: an unknown transport; DropOldest over MPI. A local consumer
      // that goes away is PeerLost for the producer, not a silent drop.
      if (me == 0) {
        expect(is(mpi::open_producer(
                      *comm, 1, {.policy = FullPolicy::DropOldest, .channel = 25, .transport = TransportKind::Mpi}),
                  Errc::Unsupported),
               "rank channel: DropOldest over MPI refused");
        expect(is(mpi::open_producer(*comm, 0, {}), Errc::InvalidArgument), "rank channel: to itself refused");
      }
      const mpi::ChannelOptions o{
          .slots = 2, .slot_size = 64, .channel = 26, .transport = TransportKind::Shm, .connect_timeout = 10s};
      if (me == 0) {
        auto p = mpi::open_producer(*comm, 1, o);
        expect(bool(p), "rank channel, consumer leaves: create");
        if (p) {
          auto loan = (*p)->loan(10s);
          expect(loan && bool((*p)->publish(std::move(*loan), {.size = 8})),
                 "rank channel, consumer leaves: first message");
        }
        barrier();  // the consumer has taken it and closed
        // The producer learns of the hang-up on its own thread, soon after: until then loans go
        // on (or wait for room), then PeerLost — never a message silently dropped after it.
        std::string last = "no loan tried";
        bool lost = false;
        for (auto end = std::chrono::steady_clock::now() + 5s; p && !lost && std::chrono::steady_clock::now() < end;) {
          auto loan = (*p)->loan(100ms);
          if (loan) {
            (void)(*p)->publish(std::move(*loan), {.size = 8});
            continue;
          }
          last = loan.error().message();
          lost = loan.error().code() == Errc::PeerLost && loan.error().cause().find("rank1") != std::string::npos;
        }
        expect(lost, "rank channel, consumer leaves: PeerLost naming rank 1's channel (last: " + last + ")");
      } else {
        {
          auto c = mpi::open_consumer(*comm, 0, o);
          auto r = c ? (*c)->receive(10s) : Result<Received>(std::unexpected(c.error()));
          expect(r && r->info().size == 8, "rank channel, consumer leaves: receive");
        }
        barrier();
      }
      barrier();
    }

    // 7. Over MPI too, a Loan or Received outlives its Producer or Consumer with its bytes valid
    //    (ASAN watches), and is freed when dropped.
    {
      const mpi::ChannelOptions o{.slots = 2, .slot_size = 64, .channel = 27, .transport = TransportKind::Mpi};
      if (me == 0) {
        auto p = mpi::open_producer(*comm, 1, o);
        auto first = p ? (*p)->loan(10s) : Result<Loan>(std::unexpected(p.error()));
        if (first) std::memset(first->bytes().data(), 0x42, 64);
        expect(first && bool((*p)->publish(std::move(*first), {.size = 64})), "outlive: publish");
        auto held = p ? (*p)->loan(10s) : Result<Loan>(std::unexpected(p.error()));
        expect(bool(held), "outlive: a second loan");
        if (p) expect(bool((*p)->flush(10s)), "outlive: flush");
        if (p) p->reset();
        if (held) {
          std::memset(held->bytes().data(), 0x17, held->bytes().size());
          expect(held->bytes().size() == 64 && held->bytes()[63] == std::byte{0x17}, "outlive: the loan's bytes");
        }
      } else {
        auto c = mpi::open_consumer(*comm, 0, o);
        auto r = c ? (*c)->receive(10s) : Result<Received>(std::unexpected(c.error()));
        expect(r && r->bytes().size() == 64, "outlive: receive");
        if (c) c->reset();
        if (r) {
          bool same = true;
          for (auto b : r->bytes()) same = same && b == std::byte{0x42};
          expect(same, "outlive: the message's bytes after its consumer is gone");
          r->release();
          expect(r->bytes().empty(), "outlive: released");
        }
      }
      barrier();
    }

    // 8. Closing tells the other end, as on a local route: after a producer's close its consumer
    //    receives what was published, then PeerLost (at once, not at its timeout), and again on
    //    every later receive; after a consumer's close its producer's loan and flush are PeerLost.
    //    The channel number opens again afterwards, both ways round, and what a close that
    //    crossed its peer's left behind (a close word, an end marker) does not reach the new one.
    {
      const mpi::ChannelOptions o{.slots = 4, .slot_size = 64, .channel = 30, .transport = TransportKind::Mpi};
      if (me == 0) {
        auto p = mpi::open_producer(*comm, 1, o);
        for (std::uint64_t i = 0; p && i < 3; ++i) {
          auto loan = (*p)->loan(10s);
          expect(loan && bool((*p)->publish(std::move(*loan), {.size = 8, .user_tag = 100 + i})), "close: publish");
        }
        if (p) (*p)->close();
        barrier();  // the consumer has seen the end
        // A closed producer still flushes: the consumer's last releases reach it when it closes.
        if (p) {
          auto flushed = (*p)->flush(10s);
          expect(bool(flushed),
                 "close: flush after close (" + (flushed ? std::string("ok") : flushed.error().message()) + ")");
        }
      } else {
        auto c = mpi::open_consumer(*comm, 0, o);
        for (std::uint64_t i = 0; c && i < 3; ++i) {
          auto r = (*c)->receive(10s);
          expect(r && r->info().user_tag == 100 + i, "close: the messages before it arrive");
        }
        const auto t0 = std::chrono::steady_clock::now();
        auto end = c ? (*c)->receive(20s) : Result<Received>(std::unexpected(c.error()));
        expect(is(end, Errc::PeerLost) &&
                   end.error().cause().find("closed channel 30 after 3 messages") != std::string::npos,
               "close: then PeerLost (" + (end ? std::string("a message") : end.error().message()) + ")");
        expect(std::chrono::steady_clock::now() - t0 < 5s, "close: PeerLost at once, not at the timeout");
        if (c) expect(is((*c)->receive(10ms), Errc::PeerLost), "close: PeerLost again");
        barrier();
        if (c) c->reset();
      }
      barrier();
      // The consumer closes: the producer's flush, then its loan, are PeerLost.
      const mpi::ChannelOptions q{.slots = 4, .slot_size = 64, .channel = 31, .transport = TransportKind::Mpi};
      if (me == 0) {
        auto p = mpi::open_producer(*comm, 1, q);
        auto loan = p ? (*p)->loan(10s) : Result<Loan>(std::unexpected(p.error()));
        expect(loan && bool((*p)->publish(std::move(*loan), {.size = 8})), "consumer close: publish");
        barrier();  // the consumer has closed without releasing the message
        const auto t0 = std::chrono::steady_clock::now();
        auto flushed = p ? (*p)->flush(20s) : Status(std::unexpected(p.error()));
        expect(is(flushed, Errc::PeerLost) &&
                   flushed.error().cause().find("closed its end of channel 31") != std::string::npos,
               "consumer close: flush PeerLost (" + (flushed ? std::string("ok") : flushed.error().message()) + ")");
        expect(std::chrono::steady_clock::now() - t0 < 5s, "consumer close: at once, not at the timeout");
        if (p)
          expect(is((*p)->loan(10s), Errc::PeerLost) && (*p)->consumer_count() == 0, "consumer close: loan PeerLost");
      } else {
        auto c = mpi::open_consumer(*comm, 0, q);
        auto r = c ? (*c)->receive(10s) : Result<Received>(std::unexpected(c.error()));
        expect(bool(r), "consumer close: receive");
        if (c) (*c)->close();
        barrier();
      }
      barrier();
      // Both ends close at once, three times over on channel 32 (the close word and the end marker
      // cross and are left in the other rank's MPI), then the number opens again and streams.
      const mpi::ChannelOptions x{.slots = 2, .slot_size = 64, .channel = 32, .transport = TransportKind::Mpi};
      for (int round = 0; round < 3; ++round) {
        if (me == 0) {
          auto p = mpi::open_producer(*comm, 1, x);
          auto loan = p ? (*p)->loan(10s) : Result<Loan>(std::unexpected(p.error()));
          expect(loan && bool((*p)->publish(std::move(*loan), {.size = 8})), "crossed: publish");
          barrier();
        } else {
          auto c = mpi::open_consumer(*comm, 0, x);
          expect(c && bool((*c)->receive(10s)), "crossed: receive");
          barrier();
        }
      }
      barrier();
      if (me == 0) {
        auto p = mpi::open_producer(*comm, 1, x);
        for (std::uint64_t i = 0; p && i < 50; ++i) {
          auto loan = (*p)->loan(10s);
          expect(loan && bool((*p)->publish(std::move(*loan), {.size = 8, .user_tag = i + 1})), "reopened: publish");
        }
        expect(p && bool((*p)->flush(10s)), "reopened: flush");
      } else {
        auto c = mpi::open_consumer(*comm, 0, x);
        for (std::uint64_t i = 0; c && i < 50; ++i) {
          auto r = (*c)->receive(10s);
          expect(r && r->info().sequence == i && r->info().user_tag == i + 1,
                 "reopened: message " + std::to_string(i) + " (" + (r ? std::string("ok") : r.error().message()) + ")");
        }
        auto end = c ? (*c)->receive(20s) : Result<Received>(std::unexpected(c.error()));
        expect(is(end, Errc::PeerLost), "reopened: ends after 50");
      }
      barrier();
    }

    // 8b. What earlier openings of a number left in MPI — an announcement no consumer took, an end
    //     marker, an answer and a closing credit of another incarnation — is passed over: the
    //     consumer answers the newest announcement, and the stream goes through intact (a stale
    //     closing credit taken for this opening's would fail the loans once the 2-slot ring fills).
    {
      const int ch = 33;
      const mpi::ChannelOptions o{.slots = 2, .slot_size = 64, .channel = ch, .transport = TransportKind::Mpi};
      const std::uint32_t stale = 777;
      if (me == 0) {
        // A v5 Hello: magic, version, reserved, slots, channel, slot size, incarnation, reserved.
        struct {
          std::uint32_t magic;
          std::uint16_t version, reserved;
          std::uint32_t slots;
          std::int32_t channel;
          std::uint64_t slot_size;
          std::uint32_t incarnation, reserved2;
        } hello{0x484d4c46, 5, 0, 2, ch, 64, stale, 0};
        MPI_Send(&hello, sizeof hello, MPI_BYTE, 1, kDataTagOf(ch) + 2, comm->comm());
        // An end marker: the incarnation in the tag field, sequence 0, flags end | tag, magic + version.
        const std::uint64_t tag = stale;
        const std::uint32_t end[2] = {0, (0x4c05u << 16) | 0x0au};
        std::byte marker[16];
        std::memcpy(marker, &tag, 8);
        std::memcpy(marker + 8, end, 8);
        MPI_Send(marker, 16, MPI_BYTE, 1, kDataTagOf(ch), comm->comm());
      } else {
        MPI_Send(&stale, 1, MPI_UINT32_T, 0, kDataTagOf(ch) + 3, comm->comm());  // an answer
        const std::uint64_t closing[2] = {~std::uint64_t{0}, stale};             // a closing credit
        MPI_Send(closing, 2, MPI_UINT64_T, 0, kDataTagOf(ch) + 1, comm->comm());
      }
      barrier();
      std::unique_ptr<Producer> p;
      if (me == 0) {
        auto made = mpi::open_producer(*comm, 1, o);
        expect(bool(made), "leftovers: open producer");
        if (made) p = std::move(*made);
      }
      barrier();  // its announcement is out, behind the stale one
      if (me == 0) {
        for (std::uint64_t i = 0; p && i < 20; ++i) {
          auto loan = p->loan(10s);
          expect(loan && bool(p->publish(std::move(*loan), {.size = 8, .user_tag = i + 1})),
                 "leftovers: publish " + std::to_string(i) + " (" +
                     (loan ? std::string("ok") : loan.error().message()) + ")");
        }
        auto flushed = p ? p->flush(10s) : Status(fail(Errc::InvalidArgument, "test", "no producer"));
        expect(bool(flushed), "leftovers: flush (" + (flushed ? std::string("ok") : flushed.error().message()) + ")");
      } else {
        auto c = mpi::open_consumer(*comm, 0, o);
        expect(bool(c), "leftovers: open consumer");
        for (std::uint64_t i = 0; c && i < 20; ++i) {
          auto r = (*c)->receive(10s);
          expect(
              r && r->info().sequence == i && r->info().user_tag == i + 1,
              "leftovers: message " + std::to_string(i) + " (" + (r ? std::string("ok") : r.error().message()) + ")");
        }
      }
      barrier();
    }

    // 4. A channel nobody announces: open times out naming the rank.
    if (me == 1) {
      auto c = mpi::open_consumer(*comm, 0, {.channel = 9, .transport = TransportKind::Mpi, .connect_timeout = 200ms});
      expect(is(c, Errc::Timeout) && c.error().cause().find("rank 0") != std::string::npos,
             "unannounced channel: Timeout");
    }

    int all = 0;
    MPI_Reduce(&failures, &all, 1, MPI_INT, MPI_SUM, 0, comm->comm());
    if (me == 0) std::printf(all == 0 ? "mpi-channels: OK\n" : "mpi-channels: %d check(s) FAILED\n", all);
    MPI_Bcast(&all, 1, MPI_INT, 0, comm->comm());
    failures = all;
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
