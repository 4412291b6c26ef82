// SPDX-License-Identifier: MIT
#include "lavaflow/core/cpu_buffer.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <thread>

#include "lavaflow/core/detail/format.hpp"

#if LAVAFLOW_HAVE_NUMA
#include <numa.h>
#endif

#include "lavaflow/core/detail/vk_call.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "round_up.hpp"
#include "vulkan_state.hpp"

namespace lavaflow {

std::string_view to_string(CpuStrategy s) noexcept {
  switch (s) {
    case CpuStrategy::Auto:
      return "auto";
    case CpuStrategy::SharedMemory:
      return "shared-memory";
    case CpuStrategy::NumaBound:
      return "numa-bound";
    case CpuStrategy::HugePages:
      return "huge-pages";
    case CpuStrategy::GpuPinned:
      return "gpu-pinned";
  }
  return "unknown";
}

BufferKind kind_of(CpuStrategy s) noexcept {
  switch (s) {
    case CpuStrategy::NumaBound:
      return BufferKind::CpuNuma;
    case CpuStrategy::HugePages:
      return BufferKind::CpuHugePages;
    case CpuStrategy::GpuPinned:
      return BufferKind::CpuGpuPinned;
    default:
      return BufferKind::CpuShared;
  }
}

CpuStrategy strategy_of(BufferKind k) noexcept {
  switch (k) {
    case BufferKind::CpuNuma:
      return CpuStrategy::NumaBound;
    case BufferKind::CpuHugePages:
      return CpuStrategy::HugePages;
    case BufferKind::CpuGpuPinned:
      return CpuStrategy::GpuPinned;
    default:
      return CpuStrategy::SharedMemory;
  }
}

CpuTopology CpuTopology::detect() {
  CpuTopology t;
  t.cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#if LAVAFLOW_HAVE_NUMA
  if (numa_available() >= 0) {
    t.numa_library = true;
    t.numa_nodes = std::max(1, numa_num_configured_nodes());
  }
#endif
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "HugePages_Total:")
      t.huge_pages_total = value;
    else if (key == "HugePages_Free:")
      t.huge_pages_free = value;
    else if (key == "Hugepagesize:")
      t.huge_page_size = value * 1024;
  }
  return t;
}

namespace {

using detail::round_up;

std::optional<std::string> unavailable(CpuStrategy s, const CpuTopology& t, const CpuBufferOptions& o) {
  switch (s) {
    case CpuStrategy::NumaBound:
      if (!t.numa_library) return "NUMA binding unavailable (built without libnuma, or the kernel has no NUMA support)";
      if (t.numa_nodes < 2) return "this machine has 1 NUMA node, so binding to a node changes nothing";
      if (o.numa_node >= t.numa_nodes)
        return str_format("NUMA node {} does not exist ({} nodes)", o.numa_node, t.numa_nodes);
      return std::nullopt;
    case CpuStrategy::HugePages: {
      if (t.huge_page_size == 0 || t.huge_pages_total == 0) return "no huge pages reserved (vm.nr_hugepages is 0)";
      const auto need = round_up(o.size, t.huge_page_size) / t.huge_page_size;
      if (need > t.huge_pages_free)
        return str_format("{} huge pages needed, {} free of {} reserved", need, t.huge_pages_free, t.huge_pages_total);
      return std::nullopt;
    }
    case CpuStrategy::GpuPinned:
      if (!o.gpu) return "no Vulkan context given for the GPU to read the memory";
      if (!o.gpu->capabilities().memory_host_import)
        return str_format("device {} lacks VK_EXT_external_memory_host", o.gpu->capabilities().identity.name);
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

}  // namespace

StrategyChoice choose_cpu_strategy(const CpuTopology& t, const CpuBufferOptions& o) {
  if (o.strategy != CpuStrategy::Auto) {
    if (auto why = unavailable(o.strategy, t, o))
      return {CpuStrategy::SharedMemory,
              str_format("{} requested but {}; using shared memory", to_string(o.strategy), *why)};
    return {o.strategy, str_format("{} requested", to_string(o.strategy))};
  }
  if (o.gpu && !unavailable(CpuStrategy::GpuPinned, t, o))
    return {CpuStrategy::GpuPinned, "a GPU reads this memory and can import host memory, so it is pinned for the GPU"};
  if (t.huge_page_size && o.size >= t.huge_page_size && !unavailable(CpuStrategy::HugePages, t, o))
    return {CpuStrategy::HugePages,
            str_format("buffer spans >= one {} KiB huge page and enough are free", t.huge_page_size / 1024)};
  if (!unavailable(CpuStrategy::NumaBound, t, o))
    return {CpuStrategy::NumaBound, str_format("{} NUMA nodes: bound to the caller's node", t.numa_nodes)};
  std::string why = t.numa_nodes < 2 ? "one NUMA node" : "NUMA binding unavailable";
  why += t.huge_pages_total == 0
             ? ", no huge pages reserved"
             : (o.size < t.huge_page_size ? ", smaller than a huge page" : ", too few huge pages free");
  if (!o.gpu) why += ", no GPU consumer named";
  return {CpuStrategy::SharedMemory, why + ": plain shared memory"};
}

struct CpuBuffer::Impl {
  UniqueFd fd;
  UniqueMapping mapping;
  ExportDescriptor desc;
  CpuStrategy strategy = CpuStrategy::SharedMemory;
  std::string reason;
  // GpuPinned: Vulkan objects over the same pages; declared after the mapping, so released before
  // the pages are unmapped.
  std::shared_ptr<const detail::VulkanState> vk_state;
  vk::raii::Buffer vk_buffer{nullptr};
  vk::raii::DeviceMemory vk_memory{nullptr};

  [[nodiscard]] std::byte* base() const { return mapping.get().data(); }
  [[nodiscard]] std::uint64_t mapped_size() const { return mapping.get().size(); }
};

CpuBuffer::CpuBuffer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuBuffer::CpuBuffer(CpuBuffer&&) noexcept = default;
CpuBuffer& CpuBuffer::operator=(CpuBuffer&&) noexcept = default;
CpuBuffer::~CpuBuffer() = default;

namespace {

constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

Status pin_for_gpu(CpuBuffer::Impl& b, const VulkanContext& ctx) {
  const auto& dev = ctx.device();
  constexpr auto handle = vk::ExternalMemoryHandleTypeFlagBits::eHostAllocationEXT;
  LF_TRY(auto props, detail::vk_call("vkGetMemoryHostPointerPropertiesEXT",
                                     [&] { return dev.getMemoryHostPointerPropertiesEXT(handle, b.base()); }));
  LF_TRY(const std::uint32_t type,
         ctx.find_memory_type(props.memoryTypeBits, vk::MemoryPropertyFlagBits::eHostVisible));
  vk::ExternalMemoryBufferCreateInfo ext(handle);
  vk::BufferCreateInfo info({}, b.mapped_size(),
                            vk::BufferUsageFlagBits::eStorageBuffer | vk::BufferUsageFlagBits::eTransferSrc |
                                vk::BufferUsageFlagBits::eTransferDst,
                            vk::SharingMode::eExclusive, {}, &ext);
  LF_TRY(b.vk_buffer, detail::vk_call("vkCreateBuffer", [&] { return vk::raii::Buffer(dev, info); }));
  vk::ImportMemoryHostPointerInfoEXT import(handle, b.base());
  vk::MemoryAllocateInfo alloc(b.mapped_size(), type, &import);
  LF_TRY(b.vk_memory,
         detail::vk_call("vkAllocateMemory(host pointer)", [&] { return vk::raii::DeviceMemory(dev, alloc); }));
  LF_TRY_STATUS(detail::vk_call("vkBindBufferMemory", [&] { b.vk_buffer.bindMemory(*b.vk_memory, 0); }));
  b.vk_state = detail::state_of(ctx);
  return {};
}

Result<std::unique_ptr<CpuBuffer::Impl>> map_new(const CpuBufferOptions& o, const CpuTopology& t,
                                                 StrategyChoice choice) {
  constexpr const char* call = "CpuBuffer::allocate";
  auto b = std::make_unique<CpuBuffer::Impl>();
  b->strategy = choice.strategy;
  b->reason = std::move(choice.reason);
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  std::uint64_t align = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (b->strategy == CpuStrategy::HugePages) {
    flags |= MFD_HUGETLB;
    align = t.huge_page_size;
  } else if (b->strategy == CpuStrategy::GpuPinned) {
    align = std::max<std::uint64_t>(align, o.gpu->capabilities().host_import_alignment);
  }
  const std::uint64_t mapped_size = round_up(o.size, align);
  int raw = ::memfd_create("lavaflow-cpu", flags);
  if (raw < 0 && b->strategy == CpuStrategy::HugePages)
    raw = ::memfd_create("lavaflow-cpu", flags & ~MFD_ALLOW_SEALING);
  if (raw < 0) return std::unexpected(from_errno(errno, "memfd_create").within(call));
  b->fd.reset(raw);
  if (::ftruncate(b->fd.get(), static_cast<off_t>(mapped_size)) != 0)
    return std::unexpected(from_errno(errno, "ftruncate", str_format("{} bytes", mapped_size)).within(call));
  (void)::fcntl(b->fd.get(), F_ADD_SEALS, kSeals);  // hugetlbfs may not support seals; import checks
  int mflags = MAP_SHARED;
  if (b->strategy == CpuStrategy::HugePages) mflags |= MAP_POPULATE;  // fail now, not with SIGBUS later
  void* p = ::mmap(nullptr, mapped_size, PROT_READ | PROT_WRITE, mflags, b->fd.get(), 0);
  if (p == MAP_FAILED)
    return std::unexpected(from_errno(errno, "mmap", str_format("{} bytes", mapped_size)).within(call));
  b->mapping.reset({static_cast<std::byte*>(p), mapped_size});
#if LAVAFLOW_HAVE_NUMA
  if (b->strategy == CpuStrategy::NumaBound) {
    int node = o.numa_node >= 0 ? o.numa_node : numa_node_of_cpu(sched_getcpu());
    numa_tonode_memory(b->base(), mapped_size, std::max(node, 0));
    b->reason += str_format(" (node {})", std::max(node, 0));
  }
#endif
  if (b->strategy == CpuStrategy::GpuPinned) {
    if (auto ok = pin_for_gpu(*b, *o.gpu); !ok) return std::unexpected(ok.error().within(call));
  }
  auto& d = b->desc;
  d.kind = kind_of(b->strategy);
  d.allocation_size = d.buffer_size = mapped_size;
  d.size = o.size;
  return b;
}

}  // namespace

Result<CpuBuffer> CpuBuffer::allocate(const CpuBufferOptions& o) { return allocate(o, CpuTopology::detect()); }

Result<CpuBuffer> CpuBuffer::allocate(const CpuBufferOptions& o, const CpuTopology& t) {
  constexpr const char* call = "CpuBuffer::allocate";
  if (o.size == 0) return fail(Errc::InvalidArgument, call, "size is 0");
  auto choice = choose_cpu_strategy(t, o);
  if (o.strict && o.strategy != CpuStrategy::Auto && choice.strategy != o.strategy)
    return fail(Errc::Unsupported, call, choice.reason);
  auto impl = map_new(o, t, choice);
  if (!impl && !o.strict && choice.strategy != CpuStrategy::SharedMemory) {
    // The strategy looked possible but the kernel or driver refused: fall back, saying why.
    std::string why =
        str_format("{} failed ({}); using shared memory", to_string(choice.strategy), impl.error().message());
    impl = map_new(o, t, {CpuStrategy::SharedMemory, std::move(why)});
  }
  if (!impl) return std::unexpected(impl.error());
  return CpuBuffer(std::move(*impl));
}

Result<CpuBuffer> CpuBuffer::import(const ExportDescriptor& d, UniqueFd&& fd) {
  constexpr const char* call = "CpuBuffer::import";
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  if (is_gpu(d.kind))
    return fail(Errc::InvalidArgument, call,
                str_format("descriptor is for {} memory; use GpuBuffer::import", to_string(d.kind)));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0)
    return fail(Errc::InvalidArgument, call, str_format("fd {} is not an open file descriptor", fd.get()));
  if (!S_ISREG(st.st_mode)) return fail(Errc::InvalidArgument, call, "fd is not a memory file");
  // hugetlbfs files take no seals; their size is still checked.
  LF_TRY_STATUS(check_memory_fd(fd, d.allocation_size, call, d.kind != BufferKind::CpuHugePages));
  auto b = std::make_unique<Impl>();
  void* p = ::mmap(nullptr, d.allocation_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return std::unexpected(from_errno(errno, "mmap").within(call));
  b->mapping.reset({static_cast<std::byte*>(p), d.allocation_size});
  b->desc = d;
  b->strategy = strategy_of(d.kind);
  b->reason = "imported";
  b->fd = std::move(fd);
  return CpuBuffer(std::move(b));
}

std::uint64_t CpuBuffer::size() const { return impl_->desc.size; }
BufferKind CpuBuffer::kind() const { return impl_->desc.kind; }
std::byte* CpuBuffer::host_ptr() const { return impl_->base() + impl_->desc.offset; }
CpuStrategy CpuBuffer::strategy() const { return impl_->strategy; }
const std::string& CpuBuffer::reason() const { return impl_->reason; }
vk::Buffer CpuBuffer::gpu_buffer() const { return *impl_->vk_buffer; }

Result<Export> CpuBuffer::export_handle() const {
  LF_TRY(UniqueFd fd, impl_->fd.dup());
  return Export{impl_->desc, std::move(fd)};
}

}  // namespace lavaflow
