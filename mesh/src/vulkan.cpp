// SPDX-License-Identifier: MIT
#include "lavaflow/mesh/vulkan.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/core/unix_socket.hpp"
#include "lavaflow/mesh/native.hpp"
#include "staging.hpp"

namespace lavaflow::mesh {

DeviceSpan device_span(const GpuBuffer& buffer) { return {buffer.buffer(), buffer.offset(), buffer.size()}; }

DeviceSpan device_span(const GpuBuffer& buffer, std::uint64_t bytes) {
  return {buffer.buffer(), buffer.offset(), std::min(bytes, buffer.size())};
}

std::string_view to_string(VulkanSegment s) noexcept {
  switch (s) {
    case VulkanSegment::Auto:
      return "auto";
    case VulkanSegment::DeviceMemory:
      return "device memory";
    case VulkanSegment::HostMemory:
      return "host memory";
  }
  return "unknown segment";
}

#if LAVAFLOW_MESH_VULKAN

namespace {

constexpr std::uint32_t kReduceSpirv[] =
#include "reduce.comp.inc"
    ;

constexpr std::uint32_t kLocalSize = 256;  // reduce.comp's local_size_x
/// Parts of a step that ranks reduce apart begin on this boundary.
using staging::kPartAlign;
/// An all_reduce step up to this many bytes is reduced whole by every rank (one synchronisation);
/// above it each rank reduces its part and the others copy it (two synchronisations, each byte
/// reduced once). On a GPU a second synchronisation costs a host round trip and a submission,
/// which the flat form saves until reading every peer's data costs more.
constexpr std::uint64_t kFlatBytes = 64 << 10;

enum class Kind : std::uint32_t { AllReduce = 1, AllGather, ReduceScatter, Broadcast, Failed };

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::AllReduce:
      return "all_reduce";
    case Kind::AllGather:
      return "all_gather";
    case Kind::ReduceScatter:
      return "reduce_scatter";
    case Kind::Broadcast:
      return "broadcast";
    case Kind::Failed:
      return "failure";
  }
  return "unknown call";
}

/// What each rank says at every synchronisation: its call (so that mismatched calls are an error,
/// not corrupt data) or that it has failed (so that its peers fail at once, not at their timeout).
struct Record {
  std::uint64_t seq = 0;    ///< the call's number on this communicator
  std::uint64_t bytes = 0;  ///< send's length
  std::uint32_t kind = 0;
  std::uint32_t type = 0;
  std::uint32_t op = 0;
  std::uint32_t root = 0;
  friend bool operator==(const Record&, const Record&) = default;
};
static_assert(sizeof(Record) == 32);

/// What each rank says of itself at open: where it runs and whether its device can share memory
/// by fd.
struct Peer {
  std::uint64_t host = 0;  ///< hash of hostname and boot id
  Uuid device{};
  Uuid driver{};
  std::int32_t pid = 0;
  std::uint32_t shares_fds = 0;  ///< opaque-fd export and import of memory
  std::uint32_t uid = 0;
  std::uint8_t segment = 0;  ///< the options, which every rank must have alike
  std::uint8_t staged = 0;
  std::uint16_t reserved = 0;
  std::uint64_t chunk = 0;
};
static_assert(sizeof(Peer) == 64);

std::string describe(const Record& r) {
  const auto k = static_cast<Kind>(r.kind);
  if (k == Kind::Failed) return str_format("failed ({})", to_string(static_cast<Errc>(r.type)));
  std::string s = str_format("call {}: {} of {} bytes", r.seq, kind_name(k), r.bytes);
  if (r.type <= static_cast<std::uint32_t>(DType::U8)) s += str_format(" {}", to_string(static_cast<DType>(r.type)));
  if (k == Kind::AllReduce || k == Kind::ReduceScatter)
    if (r.op <= static_cast<std::uint32_t>(ReduceOp::Average))
      s += str_format(" {}", to_string(static_cast<ReduceOp>(r.op)));
  if (k == Kind::Broadcast) s += str_format(" from {}", r.root);
  return s;
}

Status within(const char* call, Status s) {
  if (!s) return std::unexpected(s.error().within(call));
  return s;
}

/// A page-aligned host mapping imported into the device as one buffer (VK_EXT_external_memory_host).
struct HostImport {
  vk::raii::Buffer buffer = nullptr;
  vk::raii::DeviceMemory memory = nullptr;
};

Result<HostImport> import_host(const VulkanContext& ctx, std::byte* base, std::uint64_t bytes) {
  constexpr auto handle = vk::ExternalMemoryHandleTypeFlagBits::eHostAllocationEXT;
  const auto& dev = ctx.device();
  return detail::vk_call("VulkanCollectives: host memory import", [&]() -> Result<HostImport> {
    HostImport h;
    const auto props = dev.getMemoryHostPointerPropertiesEXT(handle, base);
    // Coherent where the device offers it: the memory is never flushed or invalidated by hand.
    auto coherent = ctx.find_memory_type(
        props.memoryTypeBits, vk::MemoryPropertyFlagBits::eHostVisible | vk::MemoryPropertyFlagBits::eHostCoherent);
    LF_TRY(const std::uint32_t type,
           coherent ? coherent : ctx.find_memory_type(props.memoryTypeBits, vk::MemoryPropertyFlagBits::eHostVisible));
    vk::ExternalMemoryBufferCreateInfo ext(handle);
    h.buffer = vk::raii::Buffer(
        dev, vk::BufferCreateInfo({}, bytes,
                                  vk::BufferUsageFlagBits::eStorageBuffer | vk::BufferUsageFlagBits::eTransferSrc |
                                      vk::BufferUsageFlagBits::eTransferDst,
                                  vk::SharingMode::eExclusive, {}, &ext));
    vk::ImportMemoryHostPointerInfoEXT import(handle, base);
    h.memory = vk::raii::DeviceMemory(dev, vk::MemoryAllocateInfo(bytes, type, &import));
    h.buffer.bindMemory(*h.memory, 0);
    return h;
  });
}

/// An mmap that is unmapped with its owner.
class Mapping {
 public:
  Mapping() = default;
  Mapping(std::byte* p, std::uint64_t n) : p_(p), n_(n) {}
  Mapping(Mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = o.n_;
    }
    return *this;
  }
  ~Mapping() { reset(); }
  void reset() {
    if (p_) ::munmap(p_, n_);
    p_ = nullptr;
  }
  [[nodiscard]] std::byte* data() const { return p_; }

 private:
  std::byte* p_ = nullptr;
  std::uint64_t n_ = 0;
};

class Collectives final : public VulkanCollectives {
 public:
  Collectives(const VulkanContext& ctx, Communicator& host) : ctx_(ctx), host_(host) {}

  Status init(VulkanCollectiveOptions o) {
    constexpr const char* call = "VulkanCollectives::open";
    n_ = host_.size();
    me_ = host_.rank();
    if (o.chunk_bytes != 0 &&
        (!std::has_single_bit(o.chunk_bytes) || o.chunk_bytes < (4u << 10) || o.chunk_bytes > (64u << 20)))
      return fail(Errc::InvalidArgument, call,
                  str_format("chunk_bytes {} is neither 0 nor a power of two in 4 KiB … 64 MiB", o.chunk_bytes));
    if (o.key.empty()) return fail(Errc::InvalidArgument, call, "an empty key names no segment");
    if (o.segment != VulkanSegment::Auto && o.segment != VulkanSegment::DeviceMemory &&
        o.segment != VulkanSegment::HostMemory)
      return fail(Errc::InvalidArgument, call, "unknown VulkanSegment");
    const auto& caps = ctx_.capabilities();
    // One host or several, one device or several: the ranks compare where they run.
    auto here = HostIdentity::detect();
    // A host that cannot say who it is stages: sharing a segment with a rank elsewhere would fail.
    const Peer mine{here ? name_hash(here->hostname + "/" + here->boot_id)
                         : name_hash(str_format("unknown host, pid {}", ::getpid())),
                    caps.identity.device_uuid,
                    caps.identity.driver_uuid,
                    static_cast<std::int32_t>(::getpid()),
                    caps.memory_fd_export && caps.memory_fd_import ? 1u : 0u,
                    static_cast<std::uint32_t>(::geteuid()),
                    static_cast<std::uint8_t>(o.segment),
                    o.stage_through_host ? std::uint8_t{1} : std::uint8_t{0},
                    0,
                    o.chunk_bytes};
    std::vector<Peer> peers(n_);
    LF_TRY_STATUS(
        within(call, host_
                         .all_gather(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(peers)),
                                     DType::U8, {.timeout = o.attach_timeout})
                         .wait()));
    // Ranks that open with different options would wait for each other in different places.
    for (std::uint32_t r = 0; r < n_; ++r)
      if (peers[r].segment != mine.segment || peers[r].staged != mine.staged || peers[r].chunk != mine.chunk)
        return fail(Errc::InvalidArgument, call,
                    str_format("rank {} of group '{}' opened with other options (segment {}, staging {}, chunk_bytes "
                               "{}) than this rank (segment {}, staging {}, chunk_bytes {})",
                               r, host_.group(), peers[r].segment, peers[r].staged, peers[r].chunk, mine.segment,
                               mine.staged, mine.chunk));
    shared_ = std::ranges::all_of(peers, [&](const Peer& p) { return p.host == mine.host; }) && !o.stage_through_host;
    LF_TRY(const bool device, choose_segment(o, peers));

    // The storage-buffer binding covers every rank's region (two staging buffers and a scratch)
    // when shared, this rank's own when staged; each reduce-scatter piece is at least one part.
    const auto limits = ctx_.physical_device().getProperties().limits;
    const std::uint64_t regions = shared_ ? n_ : 1, least = std::bit_ceil(std::uint64_t{n_} * kPartAlign);
    const std::uint64_t asked = o.chunk_bytes ? o.chunk_bytes : device ? (16u << 20) : (4u << 20);
    chunk_ = std::max<std::uint64_t>(asked, least);
    while (chunk_ > least && 3 * chunk_ * regions > limits.maxStorageBufferRange) chunk_ /= 2;
    if (3 * chunk_ * regions > limits.maxStorageBufferRange)
      return fail(Errc::Unsupported, call,
                  str_format("{} ranks need more than the device's {}-byte storage buffer range", n_,
                             limits.maxStorageBufferRange));
    max_groups_ = std::max<std::uint32_t>(1, std::min<std::uint32_t>(limits.maxComputeWorkGroupCount[0], 1u << 16));
    stride_ = 3 * chunk_;
    range_ = stride_ * regions;
    half_ = (stride_ / 2) & ~(kPartAlign - 1);

    if (device) {
      auto attached = attach_device(o, peers);
      if (attached) {
        seg_buffer_ = dev_seg_->buffer();
        return detail::vk_call("VulkanCollectives: pipeline", [&] { make_pipeline(); });
      }
      // A failure every rank learnt of in the same agreement makes every rank fall back; an
      // agreement that did not end (a timeout, a lost rank) leaves nothing to fall back with.
      if (o.segment == VulkanSegment::DeviceMemory || agreement_broken_) return attached;
      dev_seg_.reset();
      segment_ = VulkanSegment::HostMemory;
      reason_ = str_format("the device's exported memory could not be shared ({}): host memory instead",
                           attached.error().message());
    }
    if (!caps.memory_host_import || !ctx_.has_extension(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME))
      return fail(Errc::Unsupported, call,
                  str_format("device {} lacks VK_EXT_external_memory_host", caps.identity.name));
    const auto align =
        std::max<std::uint64_t>(static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)), caps.host_import_alignment);
    if (shared_) {
      LF_TRY_STATUS(attach(o, align));
    } else {
      bytes_ = (stride_ + align - 1) / align * align;
      void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED)
        return std::unexpected(from_errno(errno, "mmap", str_format("{} bytes", bytes_)).within(call));
      map_ = Mapping(static_cast<std::byte*>(p), bytes_);
    }
    auto imported = import_host(ctx_, map_.data(), bytes_);
    LF_TRY_STATUS(agree(imported ? Status{} : Status(std::unexpected(imported.error())), o.attach_timeout, call));
    host_seg_ = std::move(*imported);
    seg_buffer_ = *host_seg_.buffer;
    return detail::vk_call("VulkanCollectives: pipeline", [&] { make_pipeline(); });
  }

  /// Whether the ranks of this host share the device's own memory; sets segment_ and reason_.
  /// Every rank decides alike from the same records.
  Result<bool> choose_segment(const VulkanCollectiveOptions& o, const std::vector<Peer>& peers) {
    constexpr const char* call = "VulkanCollectives::open";
    segment_ = VulkanSegment::HostMemory;
    if (!shared_) {
      if (o.segment == VulkanSegment::DeviceMemory)
        return fail(Errc::InvalidArgument, call, "device memory asked for, but the ranks stage through the host");
      reason_ = o.stage_through_host ? "asked to stage through the host: each rank's own pinned host memory"
                                     : "the group spans hosts: each rank stages through its own pinned host memory";
      return false;
    }
    if (o.segment == VulkanSegment::HostMemory) {
      reason_ = "host memory asked for";
      return false;
    }
    const Peer& me = peers[me_];
    for (std::uint32_t r = 0; r < n_; ++r) {
      std::string why;
      if (peers[r].device != me.device || peers[r].driver != me.driver)
        why = str_format("rank {} runs on another device", r);
      else if (!peers[r].shares_fds)
        why = str_format("rank {}'s device cannot export and import memory fds", r);
      if (why.empty()) continue;
      if (o.segment == VulkanSegment::DeviceMemory)
        return fail(Errc::Unsupported, call, str_format("device memory asked for, but {}", why));
      reason_ = why + ": host memory that every device imports";
      return false;
    }
    segment_ = VulkanSegment::DeviceMemory;
    reason_ = str_format("every rank runs on {}: its own memory, allocated by rank 0 and imported by the others",
                         ctx_.capabilities().identity.name);
    return true;
  }

  std::uint32_t rank() const override { return me_; }
  std::uint32_t size() const override { return n_; }
  bool shared_segment() const override { return shared_; }
  VulkanSegment segment() const override { return segment_; }
  const std::string& segment_reason() const override { return reason_; }

  Status all_reduce(DeviceSpan send, DeviceSpan recv, DType type, ReduceOp op, CallOptions options) override {
    LF_TRY_STATUS(check_args(Kind::AllReduce, send, recv, type, op, send.size == recv.size, "send and recv differ"));
    return run(Kind::AllReduce, send.size, type, op, 0, options, [&](const Deadline& d) {
      return shared_ ? shared_all_reduce(send, recv, type, op, d) : staged_all_reduce(send, recv, type, op, d);
    });
  }

  Status all_gather(DeviceSpan send, DeviceSpan recv, DType type, CallOptions options) override {
    LF_TRY_STATUS(check_args(Kind::AllGather, send, recv, type, ReduceOp::Sum,
                             send.size <= recv.size / n_ && recv.size == send.size * n_, "recv is not size × send"));
    return run(Kind::AllGather, send.size, type, ReduceOp::Sum, 0, options,
               [&](const Deadline& d) { return gather(send, recv, d); });
  }

  Status reduce_scatter(DeviceSpan send, DeviceSpan recv, DType type, ReduceOp op, CallOptions options) override {
    LF_TRY_STATUS(check_args(Kind::ReduceScatter, send, recv, type, op,
                             recv.size <= send.size / n_ && send.size == recv.size * n_, "send is not size × recv"));
    return run(Kind::ReduceScatter, send.size, type, op, 0, options,
               [&](const Deadline& d) { return scatter(send, recv, type, op, d); });
  }

  Status broadcast(DeviceSpan buffer, std::uint32_t root, DType type, CallOptions options) override {
    if (root >= n_)
      return fail(Errc::InvalidArgument, "VulkanCollectives::broadcast",
                  str_format("root {} is not a rank of {}", root, n_));
    LF_TRY_STATUS(check_args(Kind::Broadcast, buffer, buffer, type, ReduceOp::Sum, true, ""));
    return run(Kind::Broadcast, buffer.size, type, ReduceOp::Sum, root, options,
               [&](const Deadline& d) { return bcast(buffer, root, d); });
  }

 private:
  // ---- set-up ----

  /// Rank 0 creates the segment, the others map it, and rank 0 unlinks it as soon as everyone has
  /// (so that nothing stays in /dev/shm after a crash); each stage ends with every rank learning
  /// whether all succeeded.
  Status attach(const VulkanCollectiveOptions& o, std::uint64_t align) {
    constexpr const char* call = "VulkanCollectives::open";
    bytes_ = (stride_ * n_ + align - 1) / align * align;
    const std::string name = str_format("/lavaflow-vkc-{:016x}", name_hash(o.key));
    UniqueFd fd;
    Status created;
    // Rank 0 unlinks on every way out, a failed agreement included.
    struct Unlink {
      const std::string* name = nullptr;
      ~Unlink() {
        if (name) ::shm_unlink(name->c_str());
      }
    } unlink;
    if (me_ == 0) {
      fd = UniqueFd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
      if (!fd)
        created = std::unexpected(from_errno(errno, "shm_open", str_format("/dev/shm{} (key '{}')", name, o.key)));
      else if (::ftruncate(fd.get(), static_cast<off_t>(bytes_)) != 0)
        created = std::unexpected(from_errno(errno, "ftruncate", str_format("/dev/shm{}", name)));
      if (fd) unlink.name = &name;
    }
    LF_TRY_STATUS(agree(created, o.attach_timeout, call));
    Status opened;
    if (me_ != 0) {
      fd = UniqueFd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
      struct stat st {};
      if (!fd)
        opened = std::unexpected(from_errno(errno, "shm_open", str_format("/dev/shm{}", name)));
      else if (::fstat(fd.get(), &st) != 0)
        opened = std::unexpected(from_errno(errno, "fstat", str_format("/dev/shm{}", name)));
      else if (static_cast<std::uint64_t>(st.st_size) != bytes_)
        opened = fail(Errc::Malformed, "fstat",
                      str_format("/dev/shm{} holds {} bytes, not the {} this group needs", name, st.st_size, bytes_));
    }
    if (opened) {
      void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
      if (p == MAP_FAILED)
        opened = std::unexpected(from_errno(errno, "mmap", str_format("{} bytes of /dev/shm{}", bytes_, name)));
      else
        map_ = Mapping(static_cast<std::byte*>(p), bytes_);
    }
    return agree(opened, o.attach_timeout, call);
  }

  /// The device path: rank 0 allocates the whole segment on the device and exports it; every
  /// other rank takes the fd from rank 0 over an abstract Unix socket and imports it. The socket's
  /// name is public to the host's network namespace, so each end checks the other's pid and uid against
  /// the group's records (the host communicator's, which a stranger cannot write) and the
  /// importer checks the descriptor against the segment it expects.
  Status attach_device(const VulkanCollectiveOptions& o, const std::vector<Peer>& peers) {
    constexpr const char* call = "VulkanCollectives::open (device memory)";
    bytes_ = stride_ * n_;
    const Deadline deadline(o.attach_timeout);
    const std::string name = str_format("lavaflow-vkc-{:016x}-{}", name_hash(o.key), peers[0].pid);
    UniqueFd listener;
    Status made;
    if (me_ == 0) {
      made = [&]() -> Status {
        LF_TRY(auto b, GpuBuffer::allocate(ctx_, {.size = bytes_, .memory = GpuMemory::DeviceLocal}));
        LF_TRY(listener, listen_abstract(name, static_cast<int>(n_)));
        dev_seg_.emplace(std::move(b));
        return {};
      }();
    }
    LF_TRY_STATUS(agree(made, deadline.left(), call));

    if (me_ != 0) {
      auto imported = take_segment(name, peers[0], deadline);
      if (imported) dev_seg_.emplace(std::move(*imported));
      return agree(imported ? Status{} : Status(std::unexpected(imported.error())), deadline.left(), call);
    }
    // Rank 0 hands the fd to each rank of the group that connects, once, until every rank has
    // said how its import went; anything else that connects is closed unanswered. Each rank gets
    // an export of its own: one fd handed to several would share its file offset, which Mesa's
    // lavapipe reads a header through on import (export_handle() gives each its own).
    std::vector<bool> served(n_, false);
    served[0] = true;
    auto serve = [&] {
      pollfd p{listener.get(), POLLIN, 0};
      if (std::ranges::all_of(served, [](bool b) { return b; })) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        return;
      }
      if (::poll(&p, 1, 1) <= 0) return;
      // A bounded number per turn, so that a flood of connections cannot keep the agreement
      // from being driven.
      for (std::uint32_t k = 0; k < n_ + 8; ++k) {
        UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (!conn) return;
        const auto who = peer_credentials(conn.get());
        if (!who || who->uid != peers[0].uid) continue;
        for (std::uint32_t r = 1; r < n_; ++r)
          if (!served[r] && peers[r].pid == who->pid) {
            // A rank left unserved fails its import at the deadline and says so in the agreement.
            if (auto e = dev_seg_->export_handle()) {
              const int fd = e->fd.get();
              served[r] = send_message(conn.get(), e->descriptor.serialize(), std::span(&fd, 1)).has_value();
            }
            break;
          }
      }
    };
    return agree({}, deadline.left(), call, serve);
  }

  /// A rank other than 0: the segment from rank 0 (`rank0`), imported into this device. It takes
  /// at most half the time left, so that the agreement after it still ends in time to tell every
  /// rank (and to fall back together).
  Result<GpuBuffer> take_segment(const std::string& name, const Peer& rank0, const Deadline& deadline) {
    constexpr const char* call = "VulkanCollectives::open (device memory)";
    const Deadline mine(deadline.forever() ? std::chrono::seconds(30) : deadline.left() / 2);
    LF_TRY(auto sock, connect_abstract(name, mine.left()));
    LF_TRY(const auto who, peer_credentials(sock.get()));
    if (who.pid != rank0.pid || who.uid != rank0.uid)
      return fail(Errc::PermissionDenied, call,
                  str_format("process {} (uid {}) answers at @{}, not the group's rank 0 (pid {}, uid {}): refused",
                             who.pid, who.uid, name, rank0.pid, rank0.uid));
    LF_TRY(auto msg, recv_message(sock.get(), std::chrono::duration_cast<std::chrono::milliseconds>(mine.left()),
                                  ExportDescriptor::kSerializedSize, 1));
    LF_TRY(auto desc, ExportDescriptor::deserialize(msg.payload));
    if (msg.fds.size() != 1) return fail(Errc::Malformed, call, "rank 0's answer carries no fd");
    if (desc.offset != 0 || desc.size < bytes_ || !is_gpu(desc.kind))
      return fail(Errc::Malformed, call,
                  str_format("rank 0 sent {} bytes of {} at offset {}, not the {}-byte device segment", desc.size,
                             to_string(desc.kind), desc.offset, bytes_));
    return GpuBuffer::import(ctx_, desc, std::move(msg.fds.front()));
  }

  /// Every rank learns whether every rank's `mine` succeeded; a rank that failed returns its own
  /// error, the others one naming it. `meanwhile` runs until the exchange has ended.
  Status agree(const Status& mine, Duration timeout, const char* call, const std::function<void()>& meanwhile = {}) {
    const std::int32_t ok = mine ? 1 : 0;
    std::vector<std::int32_t> all(n_);
    auto work = host_.all_gather(std::as_bytes(std::span(&ok, 1)), std::as_writable_bytes(std::span(all)), DType::I32,
                                 {.timeout = timeout});
    if (meanwhile)
      while (!work.test()) meanwhile();
    if (auto s = work.wait(); !s) {
      agreement_broken_ = true;
      return std::unexpected(s.error().within(call));
    }
    if (!mine) return std::unexpected(mine.error().within(call));
    for (std::uint32_t r = 0; r < n_; ++r)
      if (!all[r])
        return fail(Errc::PeerLost, call, str_format("rank {} of group '{}' failed to set up", r, host_.group()));
    return {};
  }

  void make_pipeline() {
    const auto& dev = ctx_.device();
    vk::DescriptorSetLayoutBinding binding(0, vk::DescriptorType::eStorageBuffer, 1, vk::ShaderStageFlagBits::eCompute);
    set_layout_ = vk::raii::DescriptorSetLayout(dev, vk::DescriptorSetLayoutCreateInfo({}, binding));
    vk::PushConstantRange push(vk::ShaderStageFlagBits::eCompute, 0, sizeof(Push));
    layout_ = vk::raii::PipelineLayout(dev, vk::PipelineLayoutCreateInfo({}, *set_layout_, push));
    module_ = vk::raii::ShaderModule(dev, vk::ShaderModuleCreateInfo({}, sizeof kReduceSpirv, kReduceSpirv));
    vk::DescriptorPoolSize size(vk::DescriptorType::eStorageBuffer, 1);
    pool_ = vk::raii::DescriptorPool(
        dev, vk::DescriptorPoolCreateInfo(vk::DescriptorPoolCreateFlagBits::eFreeDescriptorSet, 1, size));
    set_ = std::move(vk::raii::DescriptorSets(dev, vk::DescriptorSetAllocateInfo(*pool_, *set_layout_)).front());
    vk::DescriptorBufferInfo whole(seg_buffer_, 0, range_);
    dev.updateDescriptorSets(vk::WriteDescriptorSet(*set_, 0, 0, vk::DescriptorType::eStorageBuffer, {}, whole), {});
    commands_ = vk::raii::CommandPool(
        dev, vk::CommandPoolCreateInfo(vk::CommandPoolCreateFlagBits::eResetCommandBuffer, ctx_.queue_family()));
    cb_ = std::move(vk::raii::CommandBuffers(dev, {*commands_, vk::CommandBufferLevel::ePrimary, 1}).front());
    fence_ = vk::raii::Fence(dev, vk::FenceCreateInfo{});
  }

  // ---- calls ----

  Status check_args(Kind kind, const DeviceSpan& a, const DeviceSpan& b, DType type, ReduceOp op, bool sizes_agree,
                    const char* sizes_why) {
    const std::string call = str_format("VulkanCollectives::{}", kind_name(kind));
    if (static_cast<std::uint8_t>(type) > static_cast<std::uint8_t>(DType::U8) ||
        static_cast<std::uint8_t>(op) > static_cast<std::uint8_t>(ReduceOp::Average))
      return fail(Errc::InvalidArgument, call, "unknown element type or reduce op");
    if ((a.size && !a.buffer) || (b.size && !b.buffer)) return fail(Errc::InvalidArgument, call, "a null buffer");
    if (!sizes_agree)
      return fail(Errc::InvalidArgument, call, str_format("{} ({} and {} bytes)", sizes_why, a.size, b.size));
    if (a.size % size_of(type) || b.size % size_of(type))
      return fail(Errc::InvalidArgument, call, str_format("not a whole number of {} elements", to_string(type)));
    if (broken_) return std::unexpected(*broken_);
    if (shared_ && (kind == Kind::AllReduce || kind == Kind::ReduceScatter))
      return detail::vk_call("VulkanCollectives: reduction pipeline", [&] { (void)pipeline(type, op); });
    return {};
  }

  template <class Body>
  Status run(Kind kind, std::uint64_t bytes, DType type, ReduceOp op, std::uint32_t root, CallOptions options,
             Body&& body) {
    call_ = Record{++seq_,
                   bytes,
                   static_cast<std::uint32_t>(kind),
                   static_cast<std::uint32_t>(type),
                   static_cast<std::uint32_t>(op),
                   root};
    const Deadline deadline(options.timeout);
    // Driver exceptions while recording end this call like any failure (and reach the peers).
    auto s = bytes == 0 ? sync(deadline)
                        : detail::vk_call(str_format("VulkanCollectives::{}", kind_name(kind)),
                                          [&]() -> Status { return body(deadline); });
    if (!s) {
      const std::string call = str_format("VulkanCollectives::{}", kind_name(kind));
      // Peers still waiting in a synchronisation learn of it at once; a rank that failed in one
      // has been told already (and its host communicator is broken).
      if (!synced_failure_) {
        call_ = Record{seq_, 0, static_cast<std::uint32_t>(Kind::Failed), static_cast<std::uint32_t>(s.error().code())};
        (void)sync(Deadline(std::chrono::seconds(1)));
      }
      broken_ = s.error().call().starts_with("VulkanCollectives") ? s.error() : s.error().within(call);
      return std::unexpected(*broken_);
    }
    return s;
  }

  /// Every rank has reached this point of the same call (and each rank's writes before it are
  /// visible to the others).
  Status sync(const Deadline& deadline) {
    std::vector<Record> all(n_);
    const auto s = host_
                       .all_gather(std::as_bytes(std::span(&call_, 1)), std::as_writable_bytes(std::span(all)),
                                   DType::U8, {.timeout = deadline.left()})
                       .wait();
    if (!s) {
      synced_failure_ = true;
      return s;
    }
    for (std::uint32_t r = 0; r < n_; ++r) {
      if (all[r] == call_) continue;
      synced_failure_ = true;
      const std::string call = str_format("VulkanCollectives::{}", kind_name(static_cast<Kind>(call_.kind)));
      if (all[r].kind == static_cast<std::uint32_t>(Kind::Failed))
        return fail(Errc::PeerLost, call,
                    str_format("rank {} of group '{}' failed its part of call {} ({})", r, host_.group(), seq_,
                               describe(all[r])));
      return fail(Errc::InvalidArgument, call,
                  str_format("rank {} of group '{}' made {}, this rank {}", r, host_.group(), describe(all[r]),
                             describe(call_)));
    }
    return {};
  }

  // GPU work: one command buffer per phase, submitted and waited for with the fence.
  struct Push {
    std::uint32_t src, stride, dst, units, ranks;
  };

  void begin() {
    cb_.reset();
    cb_.begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
    recorded_ = false;
  }

  /// Orders everything before against everything after, the host (other ranks' reads) included.
  void barrier() {
    vk::MemoryBarrier b(vk::AccessFlagBits::eMemoryWrite, vk::AccessFlagBits::eMemoryRead |
                                                              vk::AccessFlagBits::eMemoryWrite |
                                                              vk::AccessFlagBits::eHostRead);
    cb_.pipelineBarrier(vk::PipelineStageFlagBits::eAllCommands,
                        vk::PipelineStageFlagBits::eAllCommands | vk::PipelineStageFlagBits::eHost, {}, b, {}, {});
  }

  void copy(vk::Buffer src, std::uint64_t src_off, vk::Buffer dst, std::uint64_t dst_off, std::uint64_t n) {
    if (n) cb_.copyBuffer(src, dst, vk::BufferCopy(src_off, dst_off, n));
    recorded_ = recorded_ || n;
  }

  /// The reduction's pipeline for `type` and `op` (specialisation constants), made on first use.
  const vk::raii::Pipeline& pipeline(DType type, ReduceOp op) {
    auto& p = pipelines_[static_cast<std::size_t>(type) * 5 + static_cast<std::size_t>(op)];
    if (!p) {
      const std::array<std::uint32_t, 2> values{static_cast<std::uint32_t>(type), static_cast<std::uint32_t>(op)};
      const std::array<vk::SpecializationMapEntry, 2> entries{vk::SpecializationMapEntry(0, 0, 4),
                                                              vk::SpecializationMapEntry(1, 4, 4)};
      vk::SpecializationInfo spec(entries, vk::ArrayProxyNoTemporaries<const std::uint32_t>(values));
      vk::ComputePipelineCreateInfo info(
          {}, vk::PipelineShaderStageCreateInfo({}, vk::ShaderStageFlagBits::eCompute, *module_, "main", &spec),
          *layout_);
      p.emplace(ctx_.device(), nullptr, info);
    }
    return *p;
  }

  /// out (segment offset `dst`) = op over the `ranks` inputs at `src`, `src + stride`, …
  void reduce(std::uint64_t src, std::uint64_t dst, std::uint64_t n, DType type, ReduceOp op) {
    const std::uint64_t unit = type == DType::I64 ? 8 : 4;
    const Push p{static_cast<std::uint32_t>(src / 4), static_cast<std::uint32_t>(stride_ / 4),
                 static_cast<std::uint32_t>(dst / 4), static_cast<std::uint32_t>((n + unit - 1) / unit), n_};
    cb_.bindPipeline(vk::PipelineBindPoint::eCompute, *pipeline(type, op));
    cb_.bindDescriptorSets(vk::PipelineBindPoint::eCompute, *layout_, 0, *set_, {});
    cb_.pushConstants<Push>(*layout_, vk::ShaderStageFlagBits::eCompute, 0, p);
    cb_.dispatch(std::min<std::uint32_t>(max_groups_, (p.units + kLocalSize - 1) / kLocalSize), 1, 1);
    recorded_ = true;
  }

  Status submit(const Deadline& deadline, Work* alongside = nullptr) {
    return detail::vk_call("VulkanCollectives: GPU step", [&]() -> Status {
      barrier();
      cb_.end();
      ctx_.device().resetFences(*fence_);
      vk::CommandBuffer raw = *cb_;
      ctx_.queue().submit(vk::SubmitInfo({}, {}, raw), *fence_);
      // A host collective of the staged path advances in this thread (MPI, shared-memory steps):
      // it is driven while the GPU copies, until one of them is done.
      if (alongside)
        while (!alongside->test() && fence_.getStatus() == vk::Result::eNotReady && !deadline.passed())
          std::this_thread::yield();
      const auto left = deadline.left();
      const auto ns = left == kForever ? UINT64_MAX : static_cast<std::uint64_t>(left.count());
      if (ctx_.device().waitForFences(*fence_, VK_TRUE, ns) == vk::Result::eTimeout) {
        // The queue still holds this submission: wait for it without bound before anything else
        // reuses the command buffer (a GPU that never finishes is a lost device, not a timeout).
        (void)ctx_.device().waitForFences(*fence_, VK_TRUE, UINT64_MAX);
        return fail(Errc::Timeout, "vkWaitForFences", "a collective's GPU step outlived the call's timeout");
      }
      return {};
    });
  }

  [[nodiscard]] std::uint64_t stage(std::uint32_t r, std::uint32_t b) const { return r * stride_ + b * chunk_; }
  [[nodiscard]] std::uint64_t scratch(std::uint32_t r) const { return r * stride_ + 2 * chunk_; }
  std::uint32_t flip() { return static_cast<std::uint32_t>(step_++ & 1); }
  /// The staging buffer that the next flip() gives.
  [[nodiscard]] std::uint32_t next_buffer() const { return static_cast<std::uint32_t>(step_ & 1); }
  /// Submits what was recorded, if anything (a rank with no part in a step records nothing).
  Status flush(const Deadline& d) { return recorded_ ? submit(d) : Status{}; }
  [[nodiscard]] vk::Buffer seg() const { return seg_buffer_; }

  /// The shared path over steps of `len` bytes of `total`: `in(at, k, b)` records the copy of
  /// step (at, k) into this rank's staging buffer b; `body(at, k, b)` records the step's work
  /// once every rank's copy is in (and may submit and synchronise within). The next step's copy
  /// goes in with this step's last GPU work, so a step costs one submission (and its fence wait)
  /// fewer: it writes the staging buffer of the step before, whose reads by every peer ended
  /// before this step's synchronisation.
  template <class In, class Body>
  Status shared_steps(std::uint64_t total, std::uint64_t len, In&& in, Body&& body, const Deadline& d) {
    const std::uint64_t steps = (total + len - 1) / len;
    auto bytes = [&](std::uint64_t i) { return std::min(len, total - i * len); };
    begin();
    in(std::uint64_t{0}, bytes(0), next_buffer());
    for (std::uint64_t i = 0; i < steps; ++i) {
      LF_TRY_STATUS(flush(d));
      LF_TRY_STATUS(sync(d));
      const std::uint32_t b = flip();
      begin();
      LF_TRY_STATUS(body(i * len, bytes(i), b));
      if (i + 1 < steps) {
        barrier();  // after this step's writes to recv, which may be send
        in((i + 1) * len, bytes(i + 1), next_buffer());
      }
    }
    return flush(d);
  }

  Status shared_all_reduce(DeviceSpan send, DeviceSpan recv, DType type, ReduceOp op, const Deadline& d) {
    return shared_steps(
        send.size, chunk_,
        [&](std::uint64_t at, std::uint64_t len, std::uint32_t b) {
          copy(send.buffer, send.offset + at, seg(), stage(me_, b), len);
        },
        [&](std::uint64_t at, std::uint64_t len, std::uint32_t b) -> Status {
          if (len <= kFlatBytes) {
            reduce(stage(0, b), scratch(me_), len, type, op);
            barrier();
            copy(seg(), scratch(me_), recv.buffer, recv.offset + at, len);
            return {};
          }
          const std::uint64_t part = ((len + n_ - 1) / n_ + kPartAlign - 1) & ~(kPartAlign - 1);
          auto piece = [&](std::uint32_t r) {
            const std::uint64_t from = std::min(len, r * part);
            return std::pair{from, std::min(len, from + part) - from};
          };
          const auto [mine_at, mine_len] = piece(me_);
          if (mine_len) {
            reduce(stage(0, b) + mine_at, stage(me_, b) + mine_at, mine_len, type, op);
            barrier();
            copy(seg(), stage(me_, b) + mine_at, recv.buffer, recv.offset + at + mine_at, mine_len);
          }
          LF_TRY_STATUS(flush(d));
          LF_TRY_STATUS(sync(d));
          begin();
          for (std::uint32_t r = 0; r < n_; ++r) {
            const auto [from, n] = piece(r);
            if (r != me_) copy(seg(), stage(r, b) + from, recv.buffer, recv.offset + at + from, n);
          }
          return {};
        },
        d);
  }

  Status gather(DeviceSpan send, DeviceSpan recv, const Deadline& d) {
    if (!shared_) {
      // A slot holds this rank's piece, then every rank's piece side by side after it.
      const std::uint64_t len = staging::piece(send.size, half_ / (n_ + 1));
      return staged(
          send.size, len,
          [&](std::uint64_t at, std::uint64_t k, std::uint64_t slot) {
            copy(send.buffer, send.offset + at, seg(), slot, k);
          },
          [&](std::uint64_t, std::uint64_t k, std::uint64_t slot) {
            return host_.all_gather(host_span(slot, k), host_span(slot + len, k * n_), DType::U8,
                                    {.timeout = d.left()});
          },
          [&](std::uint64_t at, std::uint64_t k, std::uint64_t slot) {
            for (std::uint32_t r = 0; r < n_; ++r)
              copy(seg(), slot + len + r * k, recv.buffer, recv.offset + r * send.size + at, k);
          },
          d);
    }
    return shared_steps(
        send.size, chunk_,
        [&](std::uint64_t at, std::uint64_t len, std::uint32_t b) {
          copy(send.buffer, send.offset + at, seg(), stage(me_, b), len);
        },
        [&](std::uint64_t at, std::uint64_t len, std::uint32_t b) -> Status {
          for (std::uint32_t r = 0; r < n_; ++r)
            copy(seg(), stage(r, b), recv.buffer, recv.offset + r * send.size + at, len);
          return {};
        },
        d);
  }

  Status scatter(DeviceSpan send, DeviceSpan recv, DType type, ReduceOp op, const Deadline& d) {
    if (!shared_) {
      // A slot holds the same piece of every rank's block, packed (the host communicator reduces
      // n × len bytes), then this rank's result.
      const std::uint64_t len = staging::piece(recv.size, half_ / (n_ + 1));
      return staged(
          recv.size, len,
          [&](std::uint64_t at, std::uint64_t k, std::uint64_t slot) {
            for (std::uint32_t r = 0; r < n_; ++r)
              copy(send.buffer, send.offset + r * recv.size + at, seg(), slot + r * k, k);
          },
          [&](std::uint64_t, std::uint64_t k, std::uint64_t slot) {
            return host_.reduce_scatter(host_span(slot, n_ * k), host_span(slot + n_ * len, k), type, op,
                                        {.timeout = d.left()});
          },
          [&](std::uint64_t at, std::uint64_t k, std::uint64_t slot) {
            copy(seg(), slot + n_ * len, recv.buffer, recv.offset + at, k);
          },
          d);
    }
    // Each step takes the same piece of every rank's block: n pieces side by side in the staging,
    // at the same places on every rank (part me of each staging is read by rank me).
    const std::uint64_t len = std::max<std::uint64_t>(kPartAlign, (chunk_ / n_) & ~(kPartAlign - 1));
    return shared_steps(
        recv.size, len,
        [&](std::uint64_t at, std::uint64_t k, std::uint32_t b) {
          for (std::uint32_t r = 0; r < n_; ++r)
            copy(send.buffer, send.offset + r * recv.size + at, seg(), stage(me_, b) + r * len, k);
        },
        [&](std::uint64_t at, std::uint64_t k, std::uint32_t b) -> Status {
          reduce(stage(0, b) + me_ * len, scratch(me_), k, type, op);
          barrier();
          copy(seg(), scratch(me_), recv.buffer, recv.offset + at, k);
          return {};
        },
        d);
  }

  Status bcast(DeviceSpan buffer, std::uint32_t root, const Deadline& d) {
    if (!shared_)
      return staged(
          buffer.size, staging::piece(buffer.size, half_),
          [&](std::uint64_t at, std::uint64_t k, std::uint64_t slot) {
            if (me_ == root) copy(buffer.buffer, buffer.offset + at, seg(), slot, k);
          },
          [&](std::uint64_t, std::uint64_t k, std::uint64_t slot) {
            return host_.broadcast(host_span(slot, k), root, DType::U8, {.timeout = d.left()});
          },
          [&](std::uint64_t at, std::uint64_t k, std::uint64_t slot) {
            if (me_ != root) copy(seg(), slot, buffer.buffer, buffer.offset + at, k);
          },
          d);
    return shared_steps(
        buffer.size, chunk_,
        [&](std::uint64_t at, std::uint64_t len, std::uint32_t b) {
          if (me_ == root) copy(buffer.buffer, buffer.offset + at, seg(), stage(root, b), len);
        },
        [&](std::uint64_t at, std::uint64_t len, std::uint32_t b) -> Status {
          if (me_ != root) copy(seg(), stage(root, b), buffer.buffer, buffer.offset + at, len);
          return {};
        },
        d);
  }

  Status staged_all_reduce(DeviceSpan send, DeviceSpan recv, DType type, ReduceOp op, const Deadline& d) {
    return staged(
        send.size, staging::piece(send.size, half_),
        [&](std::uint64_t at, std::uint64_t k, std::uint64_t slot) {
          copy(send.buffer, send.offset + at, seg(), slot, k);
        },
        [&](std::uint64_t, std::uint64_t k, std::uint64_t slot) {
          const auto data = host_span(slot, k);
          return host_.all_reduce(data, data, type, op, {.timeout = d.left()});
        },
        [&](std::uint64_t at, std::uint64_t k, std::uint64_t slot) {
          copy(seg(), slot, recv.buffer, recv.offset + at, k);
        },
        d);
  }

  /// The staged path, pipelined: piece i (`len` bytes of `total`, the last one shorter) goes
  /// GPU → slot i % 2 of this rank's pinned memory → host collective → GPU, and the GPU's copies
  /// out of piece i − 1 and into piece i + 1 run while the host carries piece i. `in` and `out`
  /// record the copies of piece (at, k) to and from its slot; `carry` starts its host collective.
  template <class In, class Carry, class Out>
  Status staged(std::uint64_t total, std::uint64_t len, In&& in, Carry&& carry, Out&& out, const Deadline& d) {
    const std::uint64_t pieces = (total + len - 1) / len;
    auto at = [&](std::uint64_t i) { return i * len; };
    auto bytes = [&](std::uint64_t i) { return std::min(len, total - i * len); };
    auto slot = [&](std::uint64_t i) { return (i & 1) * half_; };
    begin();
    in(at(0), bytes(0), slot(0));
    if (recorded_) LF_TRY_STATUS(submit(d));
    for (std::uint64_t i = 0; i < pieces; ++i) {
      Work w = carry(at(i), bytes(i), slot(i));
      begin();
      if (i > 0) out(at(i - 1), bytes(i - 1), slot(i - 1));
      // Piece i + 1 takes the slot that piece i − 1 leaves.
      if (recorded_) barrier();
      if (i + 1 < pieces) in(at(i + 1), bytes(i + 1), slot(i + 1));
      if (recorded_) {
        const auto s = submit(d, &w);
        if (!s) {
          (void)host(std::move(w));
          return s;
        }
      }
      LF_TRY_STATUS(host(std::move(w)));
    }
    begin();
    out(at(pieces - 1), bytes(pieces - 1), slot(pieces - 1));
    return recorded_ ? submit(d) : Status{};
  }

  /// A host collective of the staged path; the host communicator reports (and remembers) failures.
  Status host(Work w) {
    auto s = staging::carried(std::move(w));
    if (!s) synced_failure_ = true;
    return s;
  }

  [[nodiscard]] std::span<std::byte> host_span(std::uint64_t at, std::uint64_t n) const {
    return {map_.data() + at, n};
  }

  const VulkanContext& ctx_;
  Communicator& host_;
  std::uint32_t n_ = 1, me_ = 0;
  std::uint64_t chunk_ = 0, stride_ = 0, bytes_ = 0, range_ = 0;
  std::uint64_t half_ = 0;  ///< the staged path's two slots, each half of this rank's region
  std::uint32_t max_groups_ = 1;
  bool shared_ = false;
  VulkanSegment segment_ = VulkanSegment::HostMemory;
  std::string reason_;
  Mapping map_;
  HostImport host_seg_;
  std::optional<GpuBuffer> dev_seg_;
  vk::Buffer seg_buffer_;  ///< the segment as one buffer, from offset 0: host_seg_'s or dev_seg_'s
  vk::raii::DescriptorSetLayout set_layout_ = nullptr;
  vk::raii::PipelineLayout layout_ = nullptr;
  vk::raii::ShaderModule module_ = nullptr;
  std::array<std::optional<vk::raii::Pipeline>, 6 * 5> pipelines_;  // by type × op
  vk::raii::DescriptorPool pool_ = nullptr;
  vk::raii::DescriptorSet set_ = nullptr;
  vk::raii::CommandPool commands_ = nullptr;
  vk::raii::CommandBuffer cb_ = nullptr;
  vk::raii::Fence fence_ = nullptr;
  Record call_;
  std::uint64_t seq_ = 0, step_ = 0;
  bool recorded_ = false;  ///< the command buffer being recorded holds work
  bool synced_failure_ = false;
  bool agreement_broken_ = false;  ///< an agreement at open did not end: the communicator is broken
  std::optional<Error> broken_;
};

}  // namespace

Result<std::unique_ptr<VulkanCollectives>> VulkanCollectives::open(const VulkanContext& ctx, Communicator& host,
                                                                   VulkanCollectiveOptions options) {
  auto c = std::make_unique<Collectives>(ctx, host);
  LF_TRY_STATUS(c->init(std::move(options)));
  return std::unique_ptr<VulkanCollectives>(std::move(c));
}

#else

Result<std::unique_ptr<VulkanCollectives>> VulkanCollectives::open(const VulkanContext&, Communicator&,
                                                                   VulkanCollectiveOptions) {
  return fail(Errc::Unsupported, "VulkanCollectives::open", "built without glslc, so without the reduction shader");
}

#endif

}  // namespace lavaflow::mesh
