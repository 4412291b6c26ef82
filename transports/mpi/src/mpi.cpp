// SPDX-License-Identifier: MIT
#include "lavaflow/mpi/mpi.hpp"
#include "checks.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>
#if __has_include(<mpi-ext.h>)  // Open MPI's extensions: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#include <mpi-ext.h>
#endif

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <expected>
#include <functional>
#include <span>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/transports/local.hpp"

namespace lavaflow::mpi {

namespace {

// Each message is one MPI message: the payload, then a trailer (wire version 4). The payload starts
// the ring buffer (page-aligned for the application and the GPU copy engine); the trailer follows
// it, so its length can depend on the message. The full trailer: 8 bytes (sequence, flags, magic)
// and an 8-byte field for each of total size (chunked), user tag and timestamp that the message
// has. A small message without user tag or timestamp (≤ kShortMax bytes) ends in a 2-byte short
// trailer instead: two marker bits and the low 14 bits of the sequence. Small messages stay
// small because MPI's fastest paths are narrow: Open MPI's shared-memory path takes ≤ 10 bytes
// (an 8-byte payload with a 2-byte trailer; with 8 more bytes a round trip costs ~25 % more),
// MPICH over UCX ≤ 24 bytes.
constexpr std::uint16_t kVersion = 4;
constexpr std::uint16_t kDataMagic = 0x4c00 | kVersion;  // 'L', wire version
constexpr std::uint32_t kHelloMagic = 0x484d4c46;        // "FLMH"

// Trailer flags. kChunked: a message sent in chunks (publish_gpu): the data-tag message is the
// trailer alone, chunks 0 … n-1 follow on chunk_tag; bits 8-13 hold log2 of the chunk size.
constexpr std::uint16_t kChunked = 1, kHasTag = 2, kHasTime = 4;
constexpr unsigned kMinChunkLog2 = 12, kMaxChunkLog2 = 30;
// From this size publish() sends the trailer on its own, before the payload (see publish()).
constexpr std::uint64_t kSeparateTrailer = 512u << 10;
// Up to this many bytes on the wire publish() sends with MPI_Send (see publish()).
constexpr int kBlockingSendMax = 256;
// The short trailer: a little-endian u16 whose top two bits are set (a full trailer ends in the
// magic, whose high byte is 'L' = 0x4c) and whose low 14 bits are the sequence's.
constexpr std::uint64_t kShortMax = 64;
constexpr std::uint16_t kShortMarker = 0xC000, kShortSeqMask = 0x3FFF;

struct TrailerEnd {  // the last 8 bytes of every full trailer
  std::uint32_t seq;  // low 32 bits of the sequence number
  std::uint16_t flags;
  std::uint16_t magic;
};
static_assert(sizeof(TrailerEnd) == 8);
constexpr std::size_t kMaxTrailer = 8 * 3 + sizeof(TrailerEnd);

/// A message's trailer, decoded: [total size if chunked][user tag][timestamp] then TrailerEnd, or
/// the 2-byte short form.
struct Trailer {
  std::uint16_t flags = 0;
  bool is_short = false;
  std::uint64_t seq = 0, total = 0, tag = 0, timestamp_ns = 0;
  /// The short form, for a message of `size` bytes with these flags (the producer's choice).
  static bool short_fits(std::uint64_t size, std::uint16_t flags) { return flags == 0 && size <= kShortMax; }
  [[nodiscard]] std::size_t length() const {
    return is_short ? 2 : sizeof(TrailerEnd) + 8 * static_cast<std::size_t>(std::popcount(flags & 7u));
  }
  /// Whether the sequence it carries (its low 14 or 32 bits) is that of message `expected`.
  [[nodiscard]] bool is_sequence(std::uint64_t expected) const {
    return seq == (is_short ? expected & kShortSeqMask : static_cast<std::uint32_t>(expected));
  }
  /// Writes it at `at` (length() bytes).
  void write(std::byte* at) const {
    if (is_short) {
      const std::uint16_t v = kShortMarker | static_cast<std::uint16_t>(seq & kShortSeqMask);
      std::memcpy(at, &v, 2);
      return;
    }
    auto put = [&](std::uint64_t v) { std::memcpy(at, &v, 8); at += 8; };
    if (flags & kChunked) put(total);
    if (flags & kHasTag) put(tag);
    if (flags & kHasTime) put(timestamp_ns);
    const TrailerEnd e{static_cast<std::uint32_t>(seq), flags, kDataMagic};
    std::memcpy(at, &e, sizeof e);
  }
  /// Reads the trailer that ends `msg`; the cause when it is not one.
  static std::expected<Trailer, std::string> read(std::span<const std::byte> msg) {
    if (msg.size() < 2) return std::unexpected(str_format("{} bytes: shorter than a message trailer", msg.size()));
    std::uint16_t last = 0;
    std::memcpy(&last, msg.data() + msg.size() - 2, 2);
    if ((last & kShortMarker) == kShortMarker) {
      Trailer t;
      t.is_short = true;
      t.seq = last & kShortSeqMask;
      if (msg.size() - 2 > kShortMax)
        return std::unexpected(str_format("{} payload bytes before a short trailer (at most {})", msg.size() - 2, kShortMax));
      return t;
    }
    if ((last & 0xff00) != (kDataMagic & 0xff00)) return std::unexpected(str_format("bad trailer magic {:#x}", last));
    if (msg.size() < sizeof(TrailerEnd)) return std::unexpected(str_format("{} bytes: shorter than a message trailer", msg.size()));
    TrailerEnd e{};
    std::memcpy(&e, msg.data() + msg.size() - sizeof e, sizeof e);
    if (e.magic != kDataMagic)
      return std::unexpected(str_format("wire version {}, this build speaks {}", e.magic & 0xff, kVersion));
    const unsigned chunk_log2 = e.flags >> 8;
    if ((e.flags & ~0x3F07u) != 0 || ((e.flags & kChunked) != 0) != (chunk_log2 != 0) ||
        (chunk_log2 != 0 && (chunk_log2 < kMinChunkLog2 || chunk_log2 > kMaxChunkLog2)))
      return std::unexpected(str_format("unknown trailer flags {:#x}", e.flags));
    Trailer t;
    t.flags = e.flags;
    t.seq = e.seq;
    if (msg.size() < t.length()) return std::unexpected(str_format("{} bytes: shorter than their {}-byte trailer", msg.size(), t.length()));
    const std::byte* at = msg.data() + msg.size() - t.length();
    auto get = [&] { std::uint64_t v; std::memcpy(&v, at, 8); at += 8; return v; };
    if (t.flags & kChunked) t.total = get();
    if (t.flags & kHasTag) t.tag = get();
    if (t.flags & kHasTime) t.timestamp_ns = get();
    return t;
  }
};

struct Hello {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t reserved;
  std::uint32_t slots;
  std::int32_t channel;
  std::uint64_t slot_size;
};

int data_tag(int channel) { return channel * 8 + 0; }
int credit_tag(int channel) { return channel * 8 + 1; }
int hello_tag(int channel) { return channel * 8 + 2; }
int ack_tag(int channel) { return channel * 8 + 3; }
int chunk_tag(int channel) { return channel * 8 + 4; }  // the chunks of a chunked message

Status check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return {};
  return std::unexpected(to_error(rc, call));
}

/// A pidfd turns readable when its process exits.
bool exited(const UniqueFd& pidfd) {
  if (!pidfd) return false;
  pollfd p{pidfd.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

/// The process of the rank at the other end of a channel, where this process can watch it
/// (Communicator::watch).
struct PeerWatch {
  UniqueFd exit;
  int rank = -1, channel = 0;
  std::int32_t pid = 0;
  PeerWatch() = default;
  PeerWatch(const Communicator& comm, int peer, int ch) : exit(comm.watch(peer)), rank(peer), channel(ch), pid(comm.location(peer).pid) {}
};

/// Polls `done` (returns Result<bool>) until true or `timeout`: spinning, then (unless
/// busy-polling) sleeping 20 µs between tests — MPI has no blocking wait with a timeout.
/// The clock is read only every 16th test (the first read starts the timeout): a clock read costs
/// as much as a small message's hand-off on the fast path, and a spin loop's reaction time grows
/// with it.
/// `what` makes the timeout's message — only when it happens (formatting costs more than a message).
/// With a `watch`, a wait that lasts looks once a millisecond whether the peer's process has
/// exited: then what it sent before is taken in (a few more tests), and if that is not enough the
/// wait ends in Errc::PeerLost instead of running into its timeout.
template <class F, class W>
Status poll_until(F&& done, Duration timeout, WaitMode mode, Errc on_timeout, W&& what, const PeerWatch* watch = nullptr) {
  LF_TRY(bool first, done());
  if (first) return {};
  if (timeout <= Duration::zero()) return fail(on_timeout, "lavaflow::mpi", what());
  Clock::time_point start{}, deadline{}, watched{};
  for (std::uint32_t tests = 1;; ++tests) {
    LF_TRY(bool ok, done());
    if (ok) return {};
    if (tests % 16 != 0 && mode == WaitMode::BusyPoll) continue;
    const auto now = Clock::now();
    if (start == Clock::time_point{}) {
      start = watched = now;
      deadline = Deadline(timeout, start).at();
    }
    if (watch && now - watched >= std::chrono::milliseconds(1)) {
      watched = now;
      if (exited(watch->exit)) {
        for (int k = 0; k < 1000; ++k) {
          LF_TRY(bool late, done());
          if (late) return {};
        }
        return fail(Errc::PeerLost, "lavaflow::mpi",
                    str_format("rank {} (pid {}) has exited: channel {} gets no answer from it", watch->rank, watch->pid, watch->channel));
      }
    }
    if (now >= deadline) return fail(on_timeout, "lavaflow::mpi", what());
    if (mode != WaitMode::BusyPoll && now - start > std::chrono::microseconds(20)) {
      timespec ts{0, 20'000};
      ::nanosleep(&ts, nullptr);
    }
  }
}

Result<bool> test(MPI_Request& r, MPI_Status* st, const char* call) {
  int flag = 0;
  LF_TRY_STATUS(check(MPI_Test(&r, &flag, st ? st : MPI_STATUS_IGNORE), call));
  return flag != 0;
}

void cancel(MPI_Request& r) {
  if (r == MPI_REQUEST_NULL) return;
  MPI_Cancel(&r);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
}

/// Waits up to `limit` for `r`; cancels it when it does not complete (peer gone).
void finish_or_cancel(MPI_Request& r, Duration limit) {
  if (r == MPI_REQUEST_NULL) return;
  const auto end = Clock::now() + limit;
  int flag = 0;
  while (Clock::now() < end) {
    if (MPI_Test(&r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) return;
    timespec ts{0, 50'000};
    ::nanosleep(&ts, nullptr);
  }
  cancel(r);
}

/// The ring buffers of a remote channel. Private memory (it never leaves the process as an fd; MPI
/// sends from it and receives into it): an anonymous mapping of its own rather than a memfd
/// mapping, which MPI libraries (MPICH over UCX) handle on their fast path. Every slot in one
/// block: slot_size + kMaxTrailer bytes, page-aligned. A ring of at least kHugeRing bytes is
/// backed by transparent huge pages (2 MiB-aligned, MADV_HUGEPAGE before its first touch) unless
/// RemoteOptions::huge_pages is off: MPI's single-copy path pins the pages of every large message
/// (CMA), and a 2 MiB page costs it what a 4 KiB page does — 128 KiB messages move ~1.4× faster
/// here. The mapping is the ring's own so that its pages are fresh: memory from the malloc heap may
/// have been touched before in 4 KiB pages, which the advice does not change (seen: a 1 MiB ring
/// reused from the heap moved 9k MB/s, one in huge pages 13–18k). With GPU staging each slot is
/// pinned host memory instead (a CpuBuffer imported into Vulkan), which the GPU's copy engine reaches.
constexpr std::uint64_t kHugeRing = 256u << 10, kHugePage = 2u << 20;
struct Unmap {
  std::size_t bytes = 0;
  void operator()(std::byte* p) const { ::munmap(p, bytes); }
};
struct Ring {
  std::unique_ptr<std::byte, Unmap> block;
  std::vector<CpuBuffer> pinned;  // GPU staging: one per slot
  std::vector<std::byte*> at;     // where each slot starts
  std::uint64_t slot_bytes = 0;   // slot_size + kMaxTrailer
  [[nodiscard]] std::byte* host_ptr(std::uint32_t slot) const { return at[slot]; }
  [[nodiscard]] std::span<std::byte> bytes(std::uint32_t slot) const { return {at[slot], slot_bytes}; }
};

/// `total` bytes of fresh anonymous memory aligned to `align` (a multiple of the page size): a
/// larger mapping whose unaligned head and tail are given back.
std::byte* map_aligned(std::uint64_t total, std::uint64_t align) {
  const std::uint64_t extra = align > 4096 ? align : 0;
  void* m = ::mmap(nullptr, total + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  auto* base = static_cast<std::byte*>(m);
  if (extra == 0) return base;
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  const std::uint64_t head = (align - addr % align) % align;
  if (head > 0) ::munmap(base, head);
  if (extra - head > 0) ::munmap(base + head + total, extra - head);
  return base + head;
}

Result<Ring> make_ring(std::uint32_t slots, std::uint64_t slot_size, const VulkanContext* vulkan, bool huge_pages) {
  Ring r;
  r.slot_bytes = slot_size + kMaxTrailer;
  const std::uint64_t stride = (r.slot_bytes + 4095) / 4096 * 4096;
  if (vulkan) {
    for (std::uint32_t k = 0; k < slots; ++k) {
      auto b = CpuBuffer::allocate({.size = stride, .strategy = CpuStrategy::GpuPinned, .gpu = vulkan, .strict = true});
      if (!b) return std::unexpected(b.error().within("mpi ring buffer (GPU staging)"));
      std::memset(b->host_ptr(), 0, stride);
      r.at.push_back(b->host_ptr());
      r.pinned.push_back(std::move(*b));
    }
    return r;
  }
  std::uint64_t total = stride * slots, align = 4096;
  const bool huge = huge_pages && total >= kHugeRing;  // asked for: the kernel may still say no
  if (huge) {
    align = kHugePage;
    total = (total + kHugePage - 1) / kHugePage * kHugePage;
  }
  std::byte* p = map_aligned(total, align);
  if (p == nullptr) return fail(Errc::OutOfMemory, "mpi ring", str_format("{} slots of {} bytes: {}", slots, stride, std::strerror(errno)));
  r.block = std::unique_ptr<std::byte, Unmap>(p, Unmap{total});
  if (huge) (void)::madvise(p, total, MADV_HUGEPAGE);  // advice: without THP the ring still works
  std::memset(p, 0, total);  // faulted in now (in huge pages where granted), not on the message path
  for (std::uint32_t k = 0; k < slots; ++k) r.at.push_back(p + k * stride);
  return r;
}

/// GPU copies between ring buffers and GPU buffers, one submission per chunk, each with its own
/// fence: the CPU sends (or the GPU uploads) chunk k while the GPU copies chunk k + 1. Fences, not a
/// timeline semaphore, so that it works on every driver (lavapipe included).
class ChunkCopier {
 public:
  static Result<std::unique_ptr<ChunkCopier>> create(const VulkanContext& vk) {
    try {
      auto c = std::unique_ptr<ChunkCopier>(new ChunkCopier(vk));
      c->pool_ = vk::raii::CommandPool(vk.device(), {vk::CommandPoolCreateFlagBits::eResetCommandBuffer, vk.queue_family()});
      return c;
    } catch (const vk::SystemError& e) {
      return fail(Errc::Driver, "vkCreateCommandPool", e.what());
    }
  }
  ~ChunkCopier() {
    for (auto& c : copies_)
      if (c.busy) (void)vk_.device().waitForFences(*c.fence, VK_TRUE, 10'000'000'000ull);
  }

  /// Queues a copy; returns a ticket for wait().
  Result<std::size_t> copy(vk::Buffer src, std::uint64_t src_offset, vk::Buffer dst, std::uint64_t dst_offset, std::uint64_t bytes) {
    try {
      std::size_t i = 0;  // a command buffer whose last copy is done, else a new one
      while (i < copies_.size() && copies_[i].busy && copies_[i].fence.getStatus() != vk::Result::eSuccess) ++i;
      if (i == copies_.size())
        copies_.push_back({std::move(vk::raii::CommandBuffers(vk_.device(), {*pool_, vk::CommandBufferLevel::ePrimary, 1})[0]),
                           vk::raii::Fence(vk_.device(), vk::FenceCreateInfo{}), false});
      auto& c = copies_[i];
      if (c.busy) vk_.device().resetFences(*c.fence);
      c.cb.reset();
      c.cb.begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
      c.cb.copyBuffer(src, dst, vk::BufferCopy(src_offset, dst_offset, bytes));
      vk::MemoryBarrier visible(vk::AccessFlagBits::eTransferWrite, vk::AccessFlagBits::eHostRead | vk::AccessFlagBits::eMemoryRead);
      c.cb.pipelineBarrier(vk::PipelineStageFlagBits::eTransfer, vk::PipelineStageFlagBits::eHost | vk::PipelineStageFlagBits::eAllCommands,
                           {}, visible, {}, {});
      c.cb.end();
      vk::CommandBuffer raw = *c.cb;
      vk_.queue().submit(vk::SubmitInfo({}, {}, raw), *c.fence);
      c.busy = true;
      return i;
    } catch (const vk::SystemError& e) {
      return fail(Errc::Driver, "vkQueueSubmit(chunk copy)", e.what());
    }
  }
  Status wait(std::size_t ticket, Duration timeout) {
    const auto ns = timeout == kForever ? UINT64_MAX : static_cast<std::uint64_t>(std::chrono::nanoseconds(timeout).count());
    if (vk_.device().waitForFences(*copies_.at(ticket).fence, VK_TRUE, ns) != vk::Result::eSuccess)
      return fail(Errc::Timeout, "vkWaitForFences(chunk copy)", "the GPU did not finish a chunk copy in time");
    return {};
  }

 private:
  explicit ChunkCopier(const VulkanContext& vk) : vk_(vk) {}
  struct Copy {
    vk::raii::CommandBuffer cb;
    vk::raii::Fence fence;
    bool busy;
  };
  const VulkanContext& vk_;
  vk::raii::CommandPool pool_{nullptr};
  std::vector<Copy> copies_;  // destroyed before the pool
};

Status check_staging(const RemoteOptions& o, const GpuBuffer& gpu, std::uint64_t offset, std::uint64_t size, const char* call) {
  if (!o.vulkan) return fail(Errc::InvalidArgument, call, "GPU staging needs RemoteOptions::vulkan (the GPU buffer's device)");
  if (offset > gpu.size() || size > gpu.size() - offset)
    return fail(Errc::InvalidArgument, call, str_format("range [{}, +{}) outside the {}-byte GPU buffer", offset, size, gpu.size()));
  return {};
}

class MpiTransport final : public Transport {
 public:
  TransportKind kind() const override { return TransportKind::Mpi; }
  Probe can_connect(const ProcessLocation& me, const std::optional<ProcessLocation>& peer,
                    const TransportEnv&) const override {
    if (!peer) return {true, "MPI point-to-point (any rank)"};
    const auto scope = detect_scope(me, *peer);
    return {true, str_format("MPI point-to-point: {}", scope.reason)};
  }
  Result<std::unique_ptr<Buffer>> allocate(const TransportEnv&, std::uint64_t) const override {
    return fail(Errc::Unsupported, "mpi transport", "remote channels move bytes: use lavaflow::mpi::RemoteProducer");
  }
  Result<std::unique_ptr<Buffer>> import(const TransportEnv&, const ExportDescriptor&, UniqueFd&&) const override {
    return fail(Errc::Unsupported, "mpi transport", "fds do not cross hosts: use lavaflow::mpi::RemoteConsumer");
  }
};

Status check_options(const RemoteOptions& o, const char* call) {
  LF_TRY_STATUS(detail::check_channel(o.channel, call));
  if (o.policy == FullPolicy::DropOldest)
    return fail(Errc::Unsupported, call, "DropOldest is not available over MPI: a sent message cannot be taken back");
  if (o.slots == 0 || o.slots > 1024) return fail(Errc::InvalidArgument, call, str_format("{} slots, allowed 1..1024", o.slots));
  if (o.slot_size == 0 || o.slot_size > (1ull << 31) - kMaxTrailer)
    return fail(Errc::InvalidArgument, call, str_format("slot size {} outside 1..2 GiB", o.slot_size));
  if (!std::has_single_bit(o.chunk) || o.chunk < (1u << kMinChunkLog2) || o.chunk > (1u << kMaxChunkLog2))
    return fail(Errc::InvalidArgument, call, str_format("chunk {} is not a power of two in 4 KiB..1 GiB", o.chunk));
  return {};
}

}  // namespace

Status detail::check_channel(int channel, const char* call) {
  if (channel < 0 || channel > kMaxChannel)
    return fail(Errc::InvalidArgument, call, str_format("channel {} outside 0..{}", channel, kMaxChannel));
  return {};
}

Status detail::check_peer(const Communicator& comm, int peer, const char* call) {
  if (peer < 0 || peer >= comm.size() || peer == comm.rank())
    return fail(Errc::InvalidArgument, call, str_format("peer rank {} (this is rank {} of {})", peer, comm.rank(), comm.size()));
  return {};
}

Error to_error(int code, std::string call) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, text, &len);
  int cls = MPI_ERR_UNKNOWN;
  MPI_Error_class(code, &cls);
  const Errc e = cls == MPI_ERR_TRUNCATE ? Errc::Malformed
                 : cls == MPI_ERR_RANK || cls == MPI_ERR_TAG || cls == MPI_ERR_COUNT ? Errc::InvalidArgument
                 : cls == MPI_ERR_NO_MEM ? Errc::OutOfMemory
                                          : Errc::System;
  return Error(e, std::move(call), str_format("MPI error class {}: {}", cls, std::string(text, static_cast<std::size_t>(len))));
}

std::shared_ptr<const Transport> mpi_transport() { return std::make_shared<MpiTransport>(); }

GpuAwareness gpu_awareness() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  const int yes = MPIX_Query_cuda_support();
  return {yes == 1, str_format("MPIX_Query_cuda_support() = {} (Open MPI built with CUDA support)", yes)};
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
  return {false, "Open MPI built without CUDA support (MPIX_CUDA_AWARE_SUPPORT = 0)"};
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int yes = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &yes) != MPI_SUCCESS) return {false, "MPIX_GPU_query_support(CUDA) failed"};
  return {yes != 0, str_format("MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA) = {}", yes)};
#else
  return {false, "this MPI library has no query for GPU support"};
#endif
}

// ----- Communicator

Communicator::Communicator(Communicator&& o) noexcept
    : comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
      rank_(o.rank_),
      locations_(std::move(o.locations_)),
      job_key_(std::move(o.job_key_)),
      exits_(std::move(o.exits_)) {}
Communicator& Communicator::operator=(Communicator&& o) noexcept {
  std::swap(comm_, o.comm_);
  std::swap(rank_, o.rank_);
  std::swap(locations_, o.locations_);
  std::swap(job_key_, o.job_key_);
  std::swap(exits_, o.exits_);
  return *this;
}
Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Result<Communicator> Communicator::create(MPI_Comm user, CommunicatorOptions o) {
  constexpr const char* call = "mpi::Communicator::create";
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return fail(Errc::Unsupported, call, "MPI_Init has not been called");
  Communicator c;
  LF_TRY_STATUS(check(MPI_Comm_dup(user, &c.comm_), "MPI_Comm_dup"));
  LF_TRY_STATUS(check(MPI_Comm_set_errhandler(c.comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler"));
  // MPICH 4.0.2 reports an error found while completing a request (MPI_Test on a truncated
  // message) through MPI_COMM_WORLD's handler, not the request's communicator: unless the world
  // returns errors too, malformed input from a peer aborts the whole job instead of becoming an
  // error. On by default; CommunicatorOptions::world_errors_return = false leaves it alone.
  if (o.world_errors_return)
    LF_TRY_STATUS(check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler(world)"));
  int size = 0;
  LF_TRY_STATUS(check(MPI_Comm_rank(c.comm_, &c.rank_), "MPI_Comm_rank"));
  LF_TRY_STATUS(check(MPI_Comm_size(c.comm_, &size), "MPI_Comm_size"));

  std::vector<DeviceIdentity> devices;
  if (o.vulkan) {
    devices.push_back(o.vulkan->capabilities().identity);
  } else if (auto all = enumerate_devices()) {
    for (const auto& d : *all) devices.push_back(d.identity);
  }
  ProcessLocation me;
  if (o.host) {
    me = ProcessLocation::current_with(*o.host, devices);
  } else {
    LF_TRY(me, ProcessLocation::current(devices));
  }
  me.mpi_rank = c.rank_;
  const auto mine = me.serialize();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  LF_TRY_STATUS(check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, c.comm_), "MPI_Allgather(location sizes)"));
  int total = 0;
  for (int i = 0; i < size; ++i) {
    if (lens[static_cast<std::size_t>(i)] <= 0 || lens[static_cast<std::size_t>(i)] > 1 << 20)
      return fail(Errc::Malformed, call, str_format("rank {} announced a {}-byte location", i, lens[static_cast<std::size_t>(i)]));
    offsets[static_cast<std::size_t>(i)] = total;
    total += lens[static_cast<std::size_t>(i)];
  }
  std::vector<std::byte> all(static_cast<std::size_t>(total));
  LF_TRY_STATUS(check(MPI_Allgatherv(mine.data(), len, MPI_BYTE, all.data(), lens.data(), offsets.data(), MPI_BYTE, c.comm_),
                      "MPI_Allgatherv(locations)"));
  for (int i = 0; i < size; ++i) {
    auto loc = ProcessLocation::deserialize(
        std::span(all).subspan(static_cast<std::size_t>(offsets[static_cast<std::size_t>(i)]), static_cast<std::size_t>(lens[static_cast<std::size_t>(i)])));
    if (!loc) return std::unexpected(loc.error().within(str_format("{}: location of rank {}", call, i)));
    loc->mpi_rank = i;
    c.locations_.push_back(std::move(*loc));
  }
  c.job_key_ = str_format("mpi{}-{}", c.locations_[0].pid, size);
  LF_TRY_STATUS(c.open_watches());
  return c;
}

namespace {

/// What tells whether a pid seen by another rank is a process this one can watch: the kernel
/// (boot id), the PID namespace (inode of /proc/self/ns/pid) and the process's start time (clock
/// ticks after boot, field 22 of /proc/PID/stat) — the last so that a reused pid is never taken
/// for the rank. Zeroes where this kernel does not say.
struct ProcessKey {
  char boot_id[40] = {};
  std::uint64_t pid_ns = 0, start = 0;
};

std::uint64_t start_time(const std::string& stat_path) {
  std::ifstream f(stat_path);
  std::string line;
  if (!std::getline(f, line)) return 0;
  const auto close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return 0;
  std::size_t at = close + 2;
  for (int field = 3; field < 22 && at < line.size(); ++field) {
    at = line.find(' ', at);
    if (at == std::string::npos) return 0;
    ++at;
  }
  return std::strtoull(line.c_str() + std::min(at, line.size()), nullptr, 10);
}

ProcessKey own_key() {
  ProcessKey k;
  // The real host, not CommunicatorOptions::host (which tests set to simulate hosts).
  if (auto host = HostIdentity::detect())
    std::memcpy(k.boot_id, host->boot_id.data(), std::min(host->boot_id.size(), sizeof k.boot_id - 1));
  struct stat st{};
  if (::stat("/proc/self/ns/pid", &st) == 0) k.pid_ns = st.st_ino;
  k.start = start_time("/proc/self/stat");
  return k;
}

}  // namespace

Status Communicator::open_watches() {
  const ProcessKey mine = own_key();
  std::vector<ProcessKey> keys(locations_.size());
  LF_TRY_STATUS(check(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, keys.data(), sizeof mine, MPI_BYTE, comm_), "MPI_Allgather(process keys)"));
  exits_.clear();
  exits_.resize(locations_.size());
  for (std::size_t r = 0; r < keys.size(); ++r) {
    const auto& k = keys[r];
    if (static_cast<int>(r) == rank_ || mine.pid_ns == 0 || k.start == 0 || k.pid_ns != mine.pid_ns ||
        std::memcmp(k.boot_id, mine.boot_id, sizeof k.boot_id) != 0)
      continue;
    const std::int32_t pid = locations_[r].pid;
    UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    // Opened, then checked: the start time read after the pidfd exists belongs to that process.
    if (fd && start_time(str_format("/proc/{}/stat", pid)) == k.start) exits_[r] = std::move(fd);
  }
  return {};
}

bool Communicator::watches(int r) const { return r >= 0 && r < static_cast<int>(exits_.size()) && exits_[static_cast<std::size_t>(r)].valid(); }

Status Communicator::check_alive(int r) const {
  if (watches(r) && exited(exits_[static_cast<std::size_t>(r)]))
    return fail(Errc::PeerLost, "mpi::Communicator::check_alive", str_format("rank {} (pid {}) has exited", r, location(r).pid));
  return {};
}

UniqueFd Communicator::watch(int r) const {
  if (!watches(r)) return {};
  auto d = exits_[static_cast<std::size_t>(r)].dup();
  return d ? std::move(*d) : UniqueFd{};
}

Result<PairRoute> Communicator::route(int from, int to) const {
  if (from < 0 || to < 0 || from >= size() || to >= size() || from == to)
    return fail(Errc::InvalidArgument, "mpi::Communicator::route", str_format("pair {} -> {} of {} ranks", from, to, size()));
  const auto& a = location(from);
  const auto& b = location(to);
  const auto scope = detect_scope(a, b);
  if (scope.scope == Scope::Remote) return PairRoute{from, to, TransportKind::Mpi, "remote: " + scope.reason + "; MPI point-to-point"};
  if (auto d = common_device(a, b))
    return PairRoute{from, to, TransportKind::Vulkan, str_format("Vulkan IPC: {}; both have device {}", scope.reason, d->name)};
  return PairRoute{from, to, TransportKind::Shm, "CPU shared memory: " + scope.reason + "; no common Vulkan device"};
}

std::vector<PairRoute> Communicator::routes() const {
  std::vector<PairRoute> out;
  for (int i = 0; i < size(); ++i)
    for (int j = 0; j < size(); ++j)
      if (i != j) out.push_back(*route(i, j));
  return out;
}

// ----- RemoteProducer

struct RemoteProducer::Impl {
  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();
  MPI_Comm comm = MPI_COMM_NULL;
  int peer = 0;
  PeerWatch watch;
  RemoteOptions o;
  Ring ring;
  std::vector<MPI_Request> sends;
  std::vector<std::vector<MPI_Request>> chunk_sends;  // per slot: chunks 1… of a chunked message
  std::unique_ptr<ChunkCopier> copier;                // GPU staging, made on first use
  std::vector<int> completed;  // MPI_Testsome's indices
  std::vector<bool> loaned;
  std::uint32_t loans = 0, cursor = 0;
  std::uint64_t next_seq = 0, released = 0;
  std::uint64_t credit = 0;
  MPI_Request credit_req = MPI_REQUEST_NULL;
  Hello hello{};
  MPI_Request hello_req = MPI_REQUEST_NULL;
  std::uint32_t ack = 0;
  MPI_Request ack_req = MPI_REQUEST_NULL;
  bool connected = false;

  Status post_credit() {
    return check(MPI_Irecv(&credit, 1, MPI_UINT64_T, peer, credit_tag(o.channel), comm, &credit_req), "MPI_Irecv(credit)");
  }

  /// Takes in whatever the consumer has said (answer, credits) without waiting.
  Status progress() {
    if (!connected) {
      MPI_Status st;
      LF_TRY(bool got, test(ack_req, &st, "MPI_Test(answer)"));
      if (!got) return {};
      if (ack != kHelloMagic)
        return fail(Errc::Malformed, "mpi::RemoteProducer", str_format("rank {} answered channel {} with {:#x}", peer, o.channel, ack));
      connected = true;
      LF_TRY_STATUS(post_credit());
    }
    bool credited = false;
    for (;;) {
      MPI_Status st;
      LF_TRY(bool got, test(credit_req, &st, "MPI_Test(credit)"));
      if (!got) break;
      if (credit > next_seq || credit < released)
        return fail(Errc::Malformed, "mpi::RemoteProducer",
                    str_format("rank {} released {} messages of {} sent (before: {})", peer, credit, next_seq, released));
      released = credit;
      credited = true;
      LF_TRY_STATUS(post_credit());
    }
    // The consumer has these messages: their sends are (nearly always) complete. Completing them
    // here, all in one call, keeps MPI_Test off the per-message path of free_slot().
    if (credited) {
      int done = 0;
      completed.resize(sends.size());
      LF_TRY_STATUS(check(MPI_Testsome(static_cast<int>(sends.size()), sends.data(), &done, completed.data(), MPI_STATUSES_IGNORE),
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
    const Trailer t{flags, Trailer::short_fits(info.size, flags), info.sequence, info.size, info.user_tag, info.timestamp_ns};
    t.write(ring.host_ptr(slot) + at);
    return t.length();
  }

  /// The message in `loan`'s slot is on its way: the loan no longer gives the slot back.
  void sent(RemoteLoan& loan) {
    loaned[loan.slot_] = false;
    --loans;
    ++next_seq;
    loan.producer_ = nullptr;
  }

  /// The chunked format's first part: `loan`'s trailer alone (total size, chunks of 2^chunk_log2),
  /// sent from the spare bytes after the slot. The loan is spent; the chunks follow with send_chunk.
  Status send_trailer_alone(RemoteLoan& loan, MessageInfo& info, unsigned chunk_log2) {
    const std::uint32_t slot = loan.slot_;
    const std::size_t trailer = write_trailer(slot, o.slot_size, info, static_cast<std::uint16_t>(kChunked | (chunk_log2 << 8)));
    LF_TRY_STATUS(check(MPI_Isend(ring.host_ptr(slot) + o.slot_size, static_cast<int>(trailer), MPI_BYTE, peer, data_tag(o.channel), comm,
                                  &sends[slot]),
                        "MPI_Isend(trailer)"));
    sent(loan);
    return {};
  }

  /// Bytes [at, at + len) of `slot`'s ring buffer as the next chunk of its message.
  Status send_chunk(std::uint32_t slot, std::uint64_t at, std::uint64_t len) {
    MPI_Request r = MPI_REQUEST_NULL;
    LF_TRY_STATUS(check(MPI_Isend(ring.host_ptr(slot) + at, static_cast<int>(len), MPI_BYTE, peer, chunk_tag(o.channel), comm, &r),
                        "MPI_Isend(chunk)"));
    chunk_sends[slot].push_back(r);
    return {};
  }

  /// A slot whose last send has completed and is not loaned, when the consumer has room. Every
  /// MPI_Test runs the MPI library's progress engine (hundreds of ns over UCX), so the hot path
  /// makes as few as it can: credits are read only when the window looks full, and the slot after
  /// the last one used is tried first.
  Result<std::optional<std::uint32_t>> free_slot() {
    if (!connected || next_seq - released + loans >= o.slots) LF_TRY_STATUS(progress());
    if (!connected || next_seq - released + loans >= o.slots) return std::optional<std::uint32_t>{};
    for (std::uint32_t k = 0; k < o.slots; ++k) {
      const std::uint32_t s = (cursor + k) % o.slots;
      if (loaned[s]) continue;
      if (!chunk_sends[s].empty()) {
        int all = 0;
        LF_TRY_STATUS(check(MPI_Testall(static_cast<int>(chunk_sends[s].size()), chunk_sends[s].data(), &all, MPI_STATUSES_IGNORE),
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
};

RemoteProducer::RemoteProducer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RemoteProducer::~RemoteProducer() = default;

/// Also when create() fails half-way: no request outlives the memory it reads or writes.
RemoteProducer::Impl::~Impl() {
  for (auto& r : sends) finish_or_cancel(r, std::chrono::seconds(2));
  for (auto& chunks : chunk_sends)
    for (auto& r : chunks) finish_or_cancel(r, std::chrono::seconds(2));
  finish_or_cancel(hello_req, std::chrono::milliseconds(100));
  cancel(ack_req);
  cancel(credit_req);
}

Result<std::unique_ptr<RemoteProducer>> RemoteProducer::create(const Communicator& comm, int consumer_rank, RemoteOptions o) {
  constexpr const char* call = "mpi::RemoteProducer::create";
  LF_TRY_STATUS(check_options(o, call));
  LF_TRY_STATUS(detail::check_peer(comm, consumer_rank, call));
  auto m = std::make_unique<Impl>();
  m->comm = comm.comm();
  m->peer = consumer_rank;
  m->watch = PeerWatch(comm, consumer_rank, o.channel);
  m->o = o;
  LF_TRY(m->ring, make_ring(o.slots, o.slot_size, o.vulkan, o.huge_pages));
  m->sends.assign(o.slots, MPI_REQUEST_NULL);
  m->chunk_sends.resize(o.slots);
  m->loaned.assign(o.slots, false);
  m->hello = Hello{kHelloMagic, kVersion, 0, o.slots, o.channel, o.slot_size};
  LF_TRY_STATUS(check(MPI_Irecv(&m->ack, 1, MPI_UINT32_T, consumer_rank, ack_tag(o.channel), m->comm, &m->ack_req), "MPI_Irecv(answer)"));
  LF_TRY_STATUS(check(MPI_Isend(&m->hello, sizeof(Hello), MPI_BYTE, consumer_rank, hello_tag(o.channel), m->comm, &m->hello_req),
                      "MPI_Isend(announce)"));
  return std::unique_ptr<RemoteProducer>(new RemoteProducer(std::move(m)));
}

Result<RemoteLoan> RemoteProducer::loan(Duration timeout) {
  auto& m = *impl_;
  if (m.o.policy == FullPolicy::FailFast) {  // waits for the consumer to open, never for room
    LF_TRY_STATUS(poll_until(
        [&]() -> Result<bool> {
          if (auto ok = m.progress(); !ok) return std::unexpected(ok.error());
          return m.connected;
        },
        timeout, m.o.wait, Errc::Timeout, [&] { return str_format("rank {} did not open channel {} in time", m.peer, m.o.channel); }, &m.watch));
    return try_loan();
  }
  std::optional<std::uint32_t> slot;
  LF_TRY_STATUS(poll_until(
      [&]() -> Result<bool> {
        LF_TRY(slot, m.free_slot());
        return slot.has_value();
      },
      timeout, m.o.wait, Errc::Timeout, [&] { return m.connected ? str_format("ring full: rank {} released no buffer of channel {} in time", m.peer, m.o.channel)
                  : str_format("rank {} did not open channel {} in time", m.peer, m.o.channel); }, &m.watch));
  return take(*slot);
}

Result<RemoteLoan> RemoteProducer::try_loan() {
  auto& m = *impl_;
  LF_TRY(auto slot, m.free_slot());
  if (!slot)
    return fail(Errc::WouldBlock, "mpi::RemoteProducer::try_loan",
                m.connected ? "ring full: the consumer has not released a buffer" : "the consumer has not opened the channel yet");
  return take(*slot);
}

Result<MessageInfo> RemoteProducer::publish(RemoteLoan&& loan, MessageInfo info) {
  constexpr const char* call = "mpi::RemoteProducer::publish";
  auto& m = *impl_;
  if (loan.producer_ != this) return fail(Errc::InvalidArgument, call, "loan belongs to another channel");
  const std::uint32_t slot = loan.slot_;
  if (info.size == 0) info.size = m.o.slot_size;
  if (info.size > m.o.slot_size)
    return fail(Errc::InvalidArgument, call, str_format("{} bytes do not fit a {}-byte ring buffer", info.size, m.o.slot_size));
  if (info.size >= kSeparateTrailer) {
    // A large message goes in the chunked format: the trailer alone first, then the payload as it
    // is (1 GiB chunks), so MPI moves a payload of the application's size. Measured (design note
    // 0010): Open MPI's copy-in/copy-out path (the H100 machine's default) has 512 KiB–1 MiB
    // round trips ~10 % shorter than with the trailer after the payload; MPICH over UCX showed no
    // difference beyond its run-to-run noise. The consumer posts the payload's receive when the
    // trailer is in; the payload's rendezvous waits for it without buffering anything.
    LF_TRY_STATUS(m.send_trailer_alone(loan, info, kMaxChunkLog2));
    const std::uint64_t chunk = 1ull << kMaxChunkLog2;
    for (std::uint64_t at = 0; at < info.size; at += chunk) LF_TRY_STATUS(m.send_chunk(slot, at, std::min(chunk, info.size - at)));
    return info;
  }
  const std::size_t trailer = m.write_trailer(slot, info.size, info, 0);
  const int bytes = static_cast<int>(info.size + trailer);
  if (bytes <= kBlockingSendMax) {
    // Small: a blocking send. Its receive is posted already (every credit stands for one), and a
    // message this small goes eagerly in every MPI: MPI_Send returns once it is copied out,
    // without waiting for the consumer — and costs MPI less than MPI_Isend + a later completion.
    LF_TRY_STATUS(check(MPI_Send(m.ring.host_ptr(slot), bytes, MPI_BYTE, m.peer, data_tag(m.o.channel), m.comm), "MPI_Send(message)"));
  } else {
    LF_TRY_STATUS(check(MPI_Isend(m.ring.host_ptr(slot), bytes, MPI_BYTE, m.peer, data_tag(m.o.channel), m.comm, &m.sends[slot]),
                        "MPI_Isend(message)"));
  }
  m.sent(loan);
  return info;
}

Result<MessageInfo> RemoteProducer::publish_gpu(RemoteLoan&& loan, const GpuBuffer& src, std::uint64_t offset, std::uint64_t size,
                                                MessageInfo info) {
  constexpr const char* call = "mpi::RemoteProducer::publish_gpu";
  auto& m = *impl_;
  if (loan.producer_ != this) return fail(Errc::InvalidArgument, call, "loan belongs to another channel");
  LF_TRY_STATUS(check_staging(m.o, src, offset, size, call));
  if (size == 0 || size > m.o.slot_size)
    return fail(Errc::InvalidArgument, call, str_format("{} bytes: outside 1..{} (the ring buffer)", size, m.o.slot_size));
  if (!m.copier) {
    LF_TRY(m.copier, ChunkCopier::create(*m.o.vulkan));
  }
  const std::uint32_t slot = loan.slot_;
  const std::uint64_t chunk = m.o.chunk;
  const std::uint64_t n = (size + chunk - 1) / chunk;
  // Queue every chunk's copy at once; the GPU works through them while chunks go out below.
  std::vector<std::size_t> done(n);
  for (std::uint64_t k = 0; k < n; ++k) {
    const std::uint64_t len = std::min(chunk, size - k * chunk);
    LF_TRY(done[k], m.copier->copy(src.buffer(), src.offset() + offset + k * chunk, m.ring.pinned[slot].gpu_buffer(), k * chunk, len));
  }
  // The trailer goes first, on its own (from the spare bytes after the slot): the consumer learns
  // the message's size and posts its chunk receives while the copies run.
  info.size = size;
  LF_TRY_STATUS(m.send_trailer_alone(loan, info, static_cast<unsigned>(std::countr_zero(chunk))));
  for (std::uint64_t k = 0; k < n; ++k) {
    // A failure here loses the message (chunks already sent cannot be withdrawn); the consumer
    // then times out on the rest of it, naming the chunk.
    LF_TRY_STATUS(m.copier->wait(done[k], std::chrono::seconds(10)));
    LF_TRY_STATUS(m.send_chunk(slot, k * chunk, std::min(chunk, size - k * chunk)));
  }
  return info;
}

Status RemoteProducer::flush(Duration timeout) {
  auto& m = *impl_;
  return poll_until(
      [&]() -> Result<bool> {
        LF_TRY_STATUS(m.progress());
        if (m.released != m.next_seq) return false;
        for (auto& r : m.sends) {
          LF_TRY(bool done, test(r, nullptr, "MPI_Test(send)"));
          if (!done) return false;
        }
        return true;
      },
      timeout, m.o.wait, Errc::Timeout, [&] { return str_format("rank {} released {} of {} messages of channel {} in time", m.peer, m.released, m.next_seq, m.o.channel); },
      &m.watch);
}

RemoteLoan RemoteProducer::take(std::uint32_t slot) {
  auto& m = *impl_;
  m.loaned[slot] = true;
  ++m.loans;
  m.cursor = (slot + 1) % m.o.slots;
  return RemoteLoan(this, slot, m.next_seq);
}

void RemoteProducer::give_back(std::uint32_t slot) {
  impl_->loaned[slot] = false;
  --impl_->loans;
}
std::uint64_t RemoteProducer::slot_size() const { return impl_->o.slot_size; }
std::uint32_t RemoteProducer::slots() const { return impl_->o.slots; }

RemoteLoan::RemoteLoan(RemoteLoan&& o) noexcept : producer_(std::exchange(o.producer_, nullptr)), slot_(o.slot_), seq_(o.seq_) {}
RemoteLoan::~RemoteLoan() {
  if (producer_) producer_->give_back(slot_);
}
std::span<std::byte> RemoteLoan::bytes() const {
  if (!producer_) return {};
  auto& m = *producer_->impl_;
  return m.ring.bytes(slot_).first(m.o.slot_size);
}

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
    LF_TRY_STATUS(check(MPI_Isend(value.get(), 1, MPI_UINT64_T, peer, credit_tag(o.channel), comm, &r), "MPI_Isend(credit)"));
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

Result<std::unique_ptr<RemoteConsumer>> RemoteConsumer::open(const Communicator& comm, int producer_rank, RemoteOptions o) {
  constexpr const char* call = "mpi::RemoteConsumer::open";
  LF_TRY_STATUS(detail::check_peer(comm, producer_rank, call));
  LF_TRY_STATUS(detail::check_channel(o.channel, call));
  auto m = std::make_unique<Impl>();
  m->comm = comm.comm();
  m->peer = producer_rank;
  m->watch = PeerWatch(comm, producer_rank, o.channel);
  Hello hello{};
  MPI_Request r = MPI_REQUEST_NULL;
  LF_TRY_STATUS(check(MPI_Irecv(&hello, sizeof hello, MPI_BYTE, producer_rank, hello_tag(o.channel), m->comm, &r), "MPI_Irecv(announce)"));
  MPI_Status st;
  auto got = poll_until([&] { return test(r, &st, "MPI_Test(announce)"); }, o.connect_timeout, o.wait,
                        Errc::Timeout, [&] { return str_format("rank {} did not announce channel {} in time", producer_rank, o.channel); }, &m->watch);
  if (!got) {
    cancel(r);
    return std::unexpected(got.error().within(call));
  }
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  if (count != static_cast<int>(sizeof hello) || hello.magic != kHelloMagic)
    return fail(Errc::Malformed, call, str_format("rank {} sent {} bytes that are not a channel announcement", producer_rank, count));
  if (hello.version != kVersion)
    return fail(Errc::VersionMismatch, call, str_format("announcement version {}, this build speaks {}", hello.version, kVersion));
  if (hello.channel != o.channel)
    return fail(Errc::Malformed, call, str_format("announcement for channel {} on channel {}'s tag", hello.channel, o.channel));
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
    LF_TRY_STATUS(check(MPI_Recv_init(m->ring.host_ptr(k), static_cast<int>(theirs.slot_size + kMaxTrailer), MPI_BYTE, producer_rank,
                                      data_tag(o.channel), m->comm, &m->recvs[k]),
                        "MPI_Recv_init(message)"));
    LF_TRY_STATUS(m->post(k));
  }
  std::uint32_t answer = kHelloMagic;
  LF_TRY_STATUS(check(MPI_Send(&answer, 1, MPI_UINT32_T, producer_rank, ack_tag(o.channel), m->comm), "MPI_Send(answer)"));
  return std::unique_ptr<RemoteConsumer>(new RemoteConsumer(std::move(m)));
}

/// Waits for the next message in posted order and checks it; for a chunked message, also receives
/// its chunks into the same ring buffer. `on_part` (may be empty) is called for each part of the
/// payload as it is in — the GPU path uploads it then. Returns the slot and the trailer. A channel
/// that loses its place inside a chunked message is marked broken, and that ring buffer is not
/// posted again (a GPU copy may still be reading it; the channel refuses every later call anyway).
Result<std::pair<std::uint32_t, MessageInfo>> RemoteConsumer::Impl::take_next(Duration timeout, const PartFn& on_part, const char* call) {
  auto& m = *this;
  if (m.broken) return fail(Errc::Malformed, call, "the channel lost its place in a chunked message earlier: " + m.broken_reason);
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
          if (misses == 16) wait_start = now;
          else if (now - wait_start > std::chrono::microseconds(20)) LF_TRY_STATUS(m.send_credit());
        }
        return arrived;
      },
      timeout, m.o.wait,
                        Errc::Timeout, [&] { return str_format("no message from rank {} on channel {} in time", m.peer, m.o.channel); }, &m.watch);
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
  const std::uint64_t arrived = t ? static_cast<std::uint64_t>(count) - t->length() : 0;  // payload bytes in this message
  std::string bad;
  if (!t) bad = t.error();
  else if (!t->is_sequence(m.expected))
    bad = str_format("sequence mismatch: message {} (low {} bits) arrived where {} was expected", t->seq, t->is_short ? 14 : 32, m.expected);
  else if (!chunked && arrived > m.o.slot_size) bad = str_format("{} payload bytes; the ring buffer holds {}", arrived, m.o.slot_size);
  else if (chunked && (arrived != 0 || t->total == 0 || t->total > m.o.slot_size))
    bad = str_format("chunked message of {} bytes with {} bytes before its trailer; the ring buffer holds {}", t->total, arrived, m.o.slot_size);
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
      status = check(MPI_Irecv(base + k * chunk, static_cast<int>(std::min(chunk, size - k * chunk)), MPI_BYTE, m.peer, chunk_tag(m.o.channel),
                               m.comm, &parts[k]),
                     "MPI_Irecv(chunk)");
    for (std::uint64_t k = 0; status && k < n; ++k) {
      MPI_Status cst;
      status = poll_until([&] { return test(parts[k], &cst, "MPI_Test(chunk)"); }, timeout, m.o.wait, Errc::Timeout,
                          [&] { return str_format("chunk {} of {} of message {} from rank {} did not arrive in time", k, n, seq, m.peer); }, &m.watch);
      if (!status) break;
      int c = 0;
      MPI_Get_count(&cst, MPI_BYTE, &c);
      const std::uint64_t want = std::min(chunk, size - k * chunk);
      if (static_cast<std::uint64_t>(c) != want)
        status = fail(Errc::Malformed, call, str_format("chunk {} of message {} holds {} bytes, expected {}", k, seq, c, want));
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
  std::vector<std::size_t> tickets;  // every copy is waited for: fences of separate submissions
  auto upload = [&](const Impl::Part& part) -> Status {  // may signal out of order
    if (part.offset == 0 && offset + part.total > dst.size())
      return fail(Errc::InvalidArgument, call, str_format("message {} of {} bytes does not fit at offset {} of a {}-byte GPU buffer",
                                                          part.sequence, part.total, offset, dst.size()));
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
