// SPDX-License-Identifier: MIT
#include "lavaflow/cuda/cuda.hpp"

#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "lavaflow/core/detail/format.hpp"
#include "pci.hpp"
#include "runtime.hpp"

namespace lavaflow::cuda {

Error to_error(cudaError_t e, std::string call) {
  const Errc code = e == cudaErrorMemoryAllocation                               ? Errc::OutOfMemory
                    : e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? Errc::Unsupported
                    : e == cudaErrorInvalidValue                                 ? Errc::InvalidArgument
                                                                                 : Errc::Driver;
  return Error(code, std::move(call), str_format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e)));
}

Status check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return {};
  return std::unexpected(to_error(e, call));
}

#define LF_CUDA(expr) LF_TRY_STATUS(check((expr), #expr))

// ----- driver entry points for cuMemCreate & co., found at run time through the runtime

struct ExportableAllocation::Driver {
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) properties = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) attribute = nullptr;
  decltype(&::cuStreamWaitValue64) wait_value = nullptr;
  decltype(&::cuStreamWriteValue64) write_value = nullptr;

  [[nodiscard]] bool posix_fd_supported(int ordinal) const {
    CUdevice dev = 0;
    int v = 0;
    return device_get(&dev, ordinal) == CUDA_SUCCESS &&
           attribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev) == CUDA_SUCCESS &&
           v != 0;
  }

  [[nodiscard]] Status check(CUresult r, const char* call) const {
    if (r == CUDA_SUCCESS) return {};
    const char* s = nullptr;
    if (error_string) error_string(r, &s);
    return fail(r == CUDA_ERROR_OUT_OF_MEMORY ? Errc::OutOfMemory : Errc::Driver, call,
                str_format("CUresult {}: {}", static_cast<int>(r), s ? s : "unknown"));
  }
};

namespace {

template <class F>
bool entry(const char* name, F& out) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess || p == nullptr)
    return false;
  out = reinterpret_cast<F>(p);
  return true;
}

std::shared_ptr<const ExportableAllocation::Driver> load_driver() {
  auto d = std::make_shared<ExportableAllocation::Driver>();
  const bool ok =
      entry("cuMemGetAllocationGranularity", d->granularity) && entry("cuMemCreate", d->create) &&
      entry("cuMemRelease", d->release) && entry("cuMemAddressReserve", d->reserve) &&
      entry("cuMemAddressFree", d->address_free) && entry("cuMemMap", d->map) && entry("cuMemUnmap", d->unmap) &&
      entry("cuMemSetAccess", d->set_access) && entry("cuMemExportToShareableHandle", d->export_handle) &&
      entry("cuMemImportFromShareableHandle", d->import_handle) &&
      entry("cuMemGetAllocationPropertiesFromHandle", d->properties) && entry("cuGetErrorString", d->error_string) &&
      entry("cuDeviceGet", d->device_get) && entry("cuDeviceGetAttribute", d->attribute) &&
      entry("cuStreamWaitValue64", d->wait_value) && entry("cuStreamWriteValue64", d->write_value);
  return ok ? d : nullptr;
}

Result<cudaChannelFormatDesc> channel_format(PixelFormat f) {
  switch (f) {
    case PixelFormat::Rgba8:
      return cudaCreateChannelDesc(8, 8, 8, 8, cudaChannelFormatKindUnsigned);
    case PixelFormat::R8:
      return cudaCreateChannelDesc(8, 0, 0, 0, cudaChannelFormatKindUnsigned);
    case PixelFormat::R32f:
      return cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
    case PixelFormat::Rgba32f:
      return cudaCreateChannelDesc(32, 32, 32, 32, cudaChannelFormatKindFloat);
    case PixelFormat::Rgba16f:
      return cudaCreateChannelDesc(16, 16, 16, 16, cudaChannelFormatKindFloat);
  }
  return fail(Errc::InvalidArgument, "cuda::channel_format", "unknown pixel format");
}

Status check_device(const DeviceInfo& info, const Uuid& exporter, const char* call) {
  if (exporter != info.uuid)
    return fail(Errc::DeviceMismatch, call,
                str_format("memory comes from device {}, this CUDA device ({}, ordinal {}) is {}", to_string(exporter),
                           info.name, info.ordinal, to_string(info.uuid)));
  return {};
}

Result<cudaExternalMemory_t> import_memory(const DeviceInfo& info, std::uint64_t allocation_size, bool dedicated,
                                           UniqueFd& fd, const char* call) {
  LF_TRY_STATUS(check_memory_fd(fd, allocation_size, call));
  LF_TRY_STATUS(check(cudaSetDevice(info.ordinal), "cudaSetDevice"));
  cudaExternalMemoryHandleDesc desc{};
  desc.type = cudaExternalMemoryHandleTypeOpaqueFd;
  desc.handle.fd = fd.get();
  desc.size = allocation_size;
  desc.flags = dedicated ? cudaExternalMemoryDedicated : 0;
  cudaExternalMemory_t mem = nullptr;
  if (auto ok = check(cudaImportExternalMemory(&mem, &desc), "cudaImportExternalMemory"); !ok)
    return std::unexpected(ok.error().within(call));  // the caller keeps its fd
  (void)fd.release();                                 // CUDA owns it now
  return mem;
}

}  // namespace

namespace detail {
Result<int> device_count() {
  int n = 0;
  if (auto e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::unexpected(to_error(e, "cudaGetDeviceCount"));
  }
  return n;
}

std::string pci_address(int ordinal) {
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  std::string pci = bus;
  std::ranges::transform(pci, pci.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return pci;
}
}  // namespace detail

Result<std::vector<DeviceInfo>> devices() {
  LF_TRY(const int n, detail::device_count());
  const auto driver = load_driver();
  std::vector<DeviceInfo> out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    LF_CUDA(cudaGetDeviceProperties(&p, i));
    DeviceInfo d;
    d.ordinal = i;
    d.name = p.name;
    std::memcpy(d.uuid.data(), p.uuid.bytes, 16);
    d.compute_major = p.major;
    d.compute_minor = p.minor;
    d.memory_bytes = p.totalGlobalMem;
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrTimelineSemaphoreInteropSupported, i) == cudaSuccess)
      d.timeline_semaphore_interop = v != 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, i) == cudaSuccess) d.mps = v != 0;
    d.posix_fd_allocations = driver && driver->posix_fd_supported(i);
    out.push_back(std::move(d));
  }
  return out;
}

Status add_devices(Accelerators& accelerators) {
  LF_TRY(auto list, devices());
  for (const auto& d : list) {
    std::string pci = detail::pci_address(d.ordinal);
    int integrated = 0;
    (void)cudaDeviceGetAttribute(&integrated, cudaDevAttrIntegrated, d.ordinal);
    accelerators.add({Api::Cuda, d.name, static_cast<std::uint32_t>(d.ordinal),
                      str_format("compute {}.{}, {}", d.compute_major, d.compute_minor,
                                 d.mps ? "MPS active" : "no MPS (processes time-slice)")},
                     d.uuid, d.memory_bytes, std::move(pci),
                     integrated ? vk::PhysicalDeviceType::eIntegratedGpu : vk::PhysicalDeviceType::eDiscreteGpu);
  }
  return {};
}

// ----- Interop

Result<Interop> Interop::create(const Uuid& device_uuid) {
  constexpr const char* call = "cuda::Interop::create";
  auto all = devices();
  if (!all) return std::unexpected(all.error().within(call));
  std::string seen;
  for (auto& d : *all) {
    if (d.uuid == device_uuid) return Interop(std::move(d), load_driver());
    seen += str_format("{}{} {}", seen.empty() ? "" : ", ", d.name, to_string(d.uuid));
  }
  return fail(all->empty() ? Errc::NotFound : Errc::DeviceMismatch, call,
              str_format("no CUDA device has UUID {} (CUDA sees: {})", to_string(device_uuid),
                         seen.empty() ? std::string("no device") : seen));
}

Result<Interop> Interop::create(const VulkanContext& vulkan) {
  return create(vulkan.capabilities().identity.device_uuid);
}

Status Interop::make_current() const { return check(cudaSetDevice(info_.ordinal), "cudaSetDevice"); }

Result<ExternalBuffer> Interop::import_buffer(const ExportDescriptor& d, UniqueFd&& fd) const {
  constexpr const char* call = "cuda::Interop::import_buffer";
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  if (!is_gpu(d.kind))
    return fail(
        Errc::Unsupported, call,
        str_format("{} memory is not Vulkan memory: use cudaHostRegister on its mapping instead", to_string(d.kind)));
  LF_TRY_STATUS(check_device(info_, d.device_uuid, call));
  LF_TRY(cudaExternalMemory_t mem, import_memory(info_, d.allocation_size, d.dedicated, fd, call));
  // Mapped from the allocation's start: CUDA rejects offsets that are not suitably aligned
  // (cudaErrorInvalidValue for 66048 on an H100), lava-flow ranges may start anywhere.
  cudaExternalMemoryBufferDesc bd{};
  bd.offset = 0;
  bd.size = d.offset + d.size;
  void* base = nullptr;
  if (auto ok = check(cudaExternalMemoryGetMappedBuffer(&base, mem, &bd), "cudaExternalMemoryGetMappedBuffer"); !ok) {
    cudaDestroyExternalMemory(mem);
    return std::unexpected(ok.error().within(call));
  }
  return ExternalBuffer(mem, base, d.offset, d.size);
}

Result<ExternalBuffer> Interop::import_buffer(const lavaflow::Buffer& buffer) const {
  LF_TRY(auto ex, buffer.export_handle());
  return import_buffer(ex.descriptor, std::move(ex.fd));
}

Result<ExternalArray> Interop::import_image(const ImageDescriptor& d, UniqueFd&& fd) const {
  constexpr const char* call = "cuda::Interop::import_image";
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  if (d.tiling != ImageTiling::Optimal)
    return fail(Errc::Unsupported, call,
                "CUDA imports optimally tiled Vulkan images only; import linear ones as buffers");
  LF_TRY_STATUS(check_device(info_, d.device_uuid, call));
  LF_TRY(auto format, channel_format(d.format));
  LF_TRY(cudaExternalMemory_t mem, import_memory(info_, d.allocation_size, d.dedicated, fd, call));
  cudaExternalMemoryMipmappedArrayDesc ad{};
  ad.offset = 0;
  ad.formatDesc = format;
  ad.extent = cudaExtent{d.width, d.height, 0};
  ad.flags = cudaArraySurfaceLoadStore;
  ad.numLevels = 1;
  cudaMipmappedArray_t array = nullptr;
  if (auto ok = check(cudaExternalMemoryGetMappedMipmappedArray(&array, mem, &ad),
                      "cudaExternalMemoryGetMappedMipmappedArray");
      !ok) {
    cudaDestroyExternalMemory(mem);
    return std::unexpected(ok.error().within(call));
  }
  cudaArray_t level0 = nullptr;
  if (auto ok = check(cudaGetMipmappedArrayLevel(&level0, array, 0), "cudaGetMipmappedArrayLevel"); !ok) {
    cudaFreeMipmappedArray(array);
    cudaDestroyExternalMemory(mem);
    return std::unexpected(ok.error().within(call));
  }
  return ExternalArray(mem, array, level0);
}

Result<ExternalArray> Interop::import_image(const GpuImage& image) const {
  LF_TRY(auto ex, image.export_handle());
  return import_image(ex.descriptor, std::move(ex.fd));
}

Result<ExternalSemaphore> Interop::import_semaphore(SemaphoreKind kind, UniqueFd&& fd) const {
  constexpr const char* call = "cuda::Interop::import_semaphore";
  LF_TRY_STATUS(check_handle_fd(fd, call));
  if (kind == SemaphoreKind::Timeline && !info_.timeline_semaphore_interop)
    return fail(Errc::Unsupported, call, str_format("CUDA device {} cannot import timeline semaphores", info_.name));
  LF_CUDA(cudaSetDevice(info_.ordinal));
  cudaExternalSemaphoreHandleDesc desc{};
  desc.type = kind == SemaphoreKind::Timeline ? cudaExternalSemaphoreHandleTypeTimelineSemaphoreFd
                                              : cudaExternalSemaphoreHandleTypeOpaqueFd;
  desc.handle.fd = fd.get();
  cudaExternalSemaphore_t sem = nullptr;
  if (auto ok = check(cudaImportExternalSemaphore(&sem, &desc), "cudaImportExternalSemaphore"); !ok)
    return std::unexpected(ok.error().within(call));
  (void)fd.release();
  return ExternalSemaphore(sem, kind);
}

Result<ExternalSemaphore> Interop::import_semaphore(const GpuSemaphore& semaphore) const {
  LF_TRY(UniqueFd fd, semaphore.export_fd());
  return import_semaphore(semaphore.kind(), std::move(fd));
}

namespace {

/// `e` with `why` in front of its cause: what the failure means here.
Error explained(const Error& e, std::string_view why, const char* call) {
  return Error(e.code(), e.call(), str_format("{} ({})", why, e.cause())).within(call);
}

/// Reserves an address range for `handle` (`alloc` bytes), maps it and grants read/write to every
/// device in `devices`; releases what it made (not the handle) on failure.
Result<CUdeviceptr> map_allocation(const ExportableAllocation::Driver& d, CUmemGenericAllocationHandle handle,
                                   std::uint64_t alloc, std::size_t alignment, const std::vector<int>& devices,
                                   const char* call, const char* map_failure) {
  CUdeviceptr ptr = 0;
  LF_TRY_STATUS(d.check(d.reserve(&ptr, alloc, alignment, 0, 0), "cuMemAddressReserve"));
  if (auto ok = d.check(d.map(ptr, alloc, 0, handle, 0), "cuMemMap"); !ok) {
    d.address_free(ptr, alloc);
    return std::unexpected(explained(ok.error(), map_failure, call));
  }
  std::vector<CUmemAccessDesc> access(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = devices[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  if (auto ok = d.check(d.set_access(ptr, alloc, access.data(), access.size()), "cuMemSetAccess"); !ok) {
    d.unmap(ptr, alloc);
    d.address_free(ptr, alloc);
    return std::unexpected(ok.error().within(call));
  }
  return ptr;
}

CUmemAllocationProp device_allocation(int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace

Result<ExportableAllocation> Interop::allocate_exportable(std::uint64_t size, bool whole) const {
  constexpr const char* call = "cuda::Interop::allocate_exportable";
  if (!driver_ || !info_.posix_fd_allocations)
    return fail(Errc::Unsupported, call,
                str_format("CUDA device {} cannot make POSIX-fd-shareable allocations (cuMemCreate)", info_.name));
  if (size == 0) return fail(Errc::InvalidArgument, call, "size is 0");
  const auto& d = *driver_;
  const CUmemAllocationProp prop = device_allocation(info_.ordinal);
  std::size_t granularity = 0;
  LF_TRY_STATUS(d.check(d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                        "cuMemGetAllocationGranularity"));
  // Vulkan importers see a buffer over the whole allocation; keep lava-flow's tail padding too.
  const std::uint64_t padded = size + kGpuTailPadding;
  const std::uint64_t alloc = (padded + granularity - 1) / granularity * granularity;
  LF_CUDA(cudaSetDevice(info_.ordinal));
  CUmemGenericAllocationHandle handle = 0;
  LF_TRY_STATUS(d.check(d.create(&handle, alloc, &prop, 0), "cuMemCreate"));
  auto ptr = map_allocation(d, handle, alloc, granularity, {info_.ordinal}, call, "mapping the new allocation");
  if (!ptr) {
    d.release(handle);
    return std::unexpected(ptr.error());
  }
  return ExportableAllocation(driver_, handle, *ptr, whole ? alloc - kGpuTailPadding : size, alloc, info_.uuid);
}

Result<ExportableAllocation> Interop::import_allocation(int fd, std::uint64_t allocation_size, std::uint64_t size,
                                                        const std::vector<int>& peers) const {
  constexpr const char* call = "cuda::Interop::import_allocation";
  if (!driver_ || !info_.posix_fd_allocations)
    return fail(Errc::Unsupported, call,
                str_format("CUDA device {} cannot import POSIX-fd-shareable allocations", info_.name));
  if (fd < 0) return fail(Errc::InvalidArgument, call, "no fd");
  if (size == 0 || size > allocation_size)
    return fail(Errc::InvalidArgument, call,
                str_format("size {} is not within the allocation's {} bytes", size, allocation_size));
  const auto& d = *driver_;
  const CUmemAllocationProp prop = device_allocation(info_.ordinal);
  std::size_t granularity = 0;
  LF_TRY_STATUS(
      d.check(d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity"));
  if (allocation_size % granularity != 0)
    return fail(Errc::InvalidArgument, call,
                str_format("allocation size {} is not a multiple of the device's granularity {}", allocation_size,
                           granularity));
  LF_TRY(const int count, detail::device_count());
  std::vector<int> devices{info_.ordinal};
  for (int p : peers) {
    if (p < 0 || p >= count)
      return fail(Errc::InvalidArgument, call, str_format("device {} does not exist ({} CUDA devices)", p, count));
    if (std::find(devices.begin(), devices.end(), p) != devices.end()) continue;
    int can = 0;
    LF_CUDA(cudaDeviceCanAccessPeer(&can, p, info_.ordinal));
    if (!can)
      return fail(Errc::Unsupported, call,
                  str_format("CUDA device {} has no peer access to device {} ({})", p, info_.ordinal, info_.name));
    devices.push_back(p);
  }
  LF_CUDA(cudaSetDevice(info_.ordinal));
  CUmemGenericAllocationHandle handle = 0;
  // The driver takes its own reference: the fd stays open and the caller's.
  if (auto ok = d.check(d.import_handle(&handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                        "cuMemImportFromShareableHandle");
      !ok)
    return std::unexpected(explained(ok.error(), str_format("fd {} is not a CUDA allocation's", fd), call));
  CUmemAllocationProp got{};
  if (auto ok = d.check(d.properties(&got, handle), "cuMemGetAllocationPropertiesFromHandle"); !ok) {
    d.release(handle);
    return std::unexpected(ok.error().within(call));
  }
  if (got.location.type != CU_MEM_LOCATION_TYPE_DEVICE || got.location.id != info_.ordinal) {
    d.release(handle);
    return fail(Errc::DeviceMismatch, call,
                str_format("the allocation lives on {} {}, this interop is CUDA device {} ({})",
                           got.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? "CUDA device" : "location type",
                           got.location.id, info_.ordinal, info_.name));
  }
  const std::string too_small = str_format("the allocation is smaller than the {} bytes announced", allocation_size);
  auto ptr = map_allocation(d, handle, allocation_size, granularity, devices, call, too_small.c_str());
  if (!ptr) {
    d.release(handle);
    return std::unexpected(ptr.error());
  }
  return ExportableAllocation(driver_, handle, *ptr, size, allocation_size, info_.uuid, true);
}

// ----- owners

ExternalBuffer::ExternalBuffer(ExternalBuffer&& o) noexcept
    : memory_(std::exchange(o.memory_, nullptr)),
      base_(std::exchange(o.base_, nullptr)),
      offset_(o.offset_),
      size_(o.size_) {}
ExternalBuffer& ExternalBuffer::operator=(ExternalBuffer&& o) noexcept {
  std::swap(memory_, o.memory_);
  std::swap(base_, o.base_);
  std::swap(offset_, o.offset_);
  std::swap(size_, o.size_);
  return *this;
}
ExternalBuffer::~ExternalBuffer() {
  if (base_) cudaFree(base_);
  if (memory_) cudaDestroyExternalMemory(memory_);
}

ExternalArray::ExternalArray(ExternalArray&& o) noexcept
    : memory_(std::exchange(o.memory_, nullptr)),
      mipmapped_(std::exchange(o.mipmapped_, nullptr)),
      level0_(std::exchange(o.level0_, nullptr)) {}
ExternalArray& ExternalArray::operator=(ExternalArray&& o) noexcept {
  std::swap(memory_, o.memory_);
  std::swap(mipmapped_, o.mipmapped_);
  std::swap(level0_, o.level0_);
  return *this;
}
ExternalArray::~ExternalArray() {
  if (mipmapped_) cudaFreeMipmappedArray(mipmapped_);
  if (memory_) cudaDestroyExternalMemory(memory_);
}

ExternalSemaphore::ExternalSemaphore(ExternalSemaphore&& o) noexcept
    : sem_(std::exchange(o.sem_, nullptr)), kind_(o.kind_) {}
ExternalSemaphore& ExternalSemaphore::operator=(ExternalSemaphore&& o) noexcept {
  std::swap(sem_, o.sem_);
  std::swap(kind_, o.kind_);
  return *this;
}
ExternalSemaphore::~ExternalSemaphore() {
  if (sem_) cudaDestroyExternalSemaphore(sem_);
}

Status ExternalSemaphore::wait(cudaStream_t stream, std::uint64_t value) const {
  cudaExternalSemaphoreWaitParams p{};
  p.params.fence.value = value;
  return check(cudaWaitExternalSemaphoresAsync(&sem_, &p, 1, stream), "cudaWaitExternalSemaphoresAsync");
}

Status ExternalSemaphore::signal(cudaStream_t stream, std::uint64_t value) const {
  cudaExternalSemaphoreSignalParams p{};
  p.params.fence.value = value;
  return check(cudaSignalExternalSemaphoresAsync(&sem_, &p, 1, stream), "cudaSignalExternalSemaphoresAsync");
}

ExportableAllocation::ExportableAllocation(ExportableAllocation&& o) noexcept
    : driver_(std::move(o.driver_)),
      handle_(std::exchange(o.handle_, 0)),
      ptr_(std::exchange(o.ptr_, 0)),
      size_(o.size_),
      allocation_size_(o.allocation_size_),
      device_(o.device_),
      imported_(o.imported_) {}
ExportableAllocation& ExportableAllocation::operator=(ExportableAllocation&& o) noexcept {
  std::swap(driver_, o.driver_);
  std::swap(handle_, o.handle_);
  std::swap(ptr_, o.ptr_);
  std::swap(size_, o.size_);
  std::swap(allocation_size_, o.allocation_size_);
  std::swap(device_, o.device_);
  std::swap(imported_, o.imported_);
  return *this;
}
ExportableAllocation::~ExportableAllocation() {
  if (!ptr_ || !driver_) return;
  driver_->unmap(ptr_, allocation_size_);
  driver_->address_free(ptr_, allocation_size_);
  driver_->release(handle_);
}

Result<Export> ExportableAllocation::export_for(const VulkanContext& ctx) const {
  constexpr const char* call = "cuda::ExportableAllocation::export_for";
  if (imported_)
    return fail(Errc::Unsupported, call,
                "the allocation was imported from another process: its real size is not known here");
  if (ctx.capabilities().identity.device_uuid != device_)
    return fail(
        Errc::DeviceMismatch, call,
        str_format("allocation lives on CUDA device {}, the Vulkan context's device {} is {}", to_string(device_),
                   ctx.capabilities().identity.name, to_string(ctx.capabilities().identity.device_uuid)));
  LF_TRY(auto desc, GpuBuffer::describe_foreign(ctx, allocation_size_, size_));
  int raw = -1;
  LF_TRY_STATUS(driver_->check(driver_->export_handle(&raw, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                               "cuMemExportToShareableHandle"));
  UniqueFd fd(raw);
  LF_TRY_STATUS(fd.set_cloexec());
  return Export{desc, std::move(fd)};
}

Result<UniqueFd> ExportableAllocation::export_fd() const {
  if (!driver_) return fail(Errc::InvalidArgument, "cuda::ExportableAllocation::export_fd", "moved-from allocation");
  int raw = -1;
  LF_TRY_STATUS(driver_->check(driver_->export_handle(&raw, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                               "cuMemExportToShareableHandle"));
  UniqueFd fd(raw);
  LF_TRY_STATUS(fd.set_cloexec());
  return fd;
}

// ----- channel imports

namespace {

/// Whether `stream` is being captured into a graph, whose operations run later in its own order
/// (unknown counts as captured: no shortcuts then).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // ours, not the caller's
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

/// Handles that name a different stream by calling thread or current device (the legacy and
/// per-thread default streams): a signal deferred there could later be queued on another stream.
bool thread_dependent(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

/// How many (stream, counter) waits are remembered; past that the memory starts again (a wait
/// forgotten is only queued once more).
constexpr std::size_t kMaxWaited = 64;

constexpr const char* kCaptured = "signals deferred there are not queued yet: flush() before capturing the stream";

}  // namespace

ChannelImports::~ChannelImports() { settle(); }

ChannelImports::ChannelImports(ChannelImports&& o) noexcept
    : cuda_(o.cuda_),
      waited_(std::exchange(o.waited_, {})),
      deferred_(std::exchange(o.deferred_, {})),
      waits_skipped_(std::exchange(o.waits_skipped_, 0)),
      cache_(std::move(o.cache_)),
      semaphores_(std::move(o.semaphores_)),
      copied_(std::move(o.copied_)),
      ordered_(std::move(o.ordered_)) {}

ChannelImports& ChannelImports::operator=(ChannelImports&& o) noexcept {
  if (this != &o) {
    settle();
    cuda_ = o.cuda_;
    waited_ = std::exchange(o.waited_, {});
    deferred_ = std::exchange(o.deferred_, {});
    waits_skipped_ = std::exchange(o.waits_skipped_, 0);
    cache_ = std::move(o.cache_);
    semaphores_ = std::move(o.semaphores_);
    copied_ = std::move(o.copied_);
    ordered_ = std::move(o.ordered_);
  }
  return *this;
}

// The semaphores and flag blocks are freed next: each deferred signal is queued and its stream
// finished first (no CUDA object may go with an operation on it pending). One that cannot be
// queued is left to the channel's end, which signals what a departed peer owed.
void ChannelImports::settle() noexcept {
  for (const auto& d : deferred_)
    if (!capturing(d.stream) && queue_signal(d.stream, d.sync)) (void)cudaStreamSynchronize(d.stream);
  deferred_.clear();
}

Result<const ExternalBuffer*> ChannelImports::import(const lavaflow::Buffer& buffer) {
  if (auto it = cache_.find(&buffer); it != cache_.end()) return &it->second;
  auto imported = cuda_->import_buffer(buffer);
  if (!imported) return std::unexpected(imported.error().within("cuda::ChannelImports::buffer"));
  return &cache_.emplace(&buffer, std::move(*imported)).first->second;
}

Result<const ExternalBuffer*> ChannelImports::buffer(const Received& message) { return import(message.buffer()); }
Result<const ExternalBuffer*> ChannelImports::buffer(const Loan& loan) { return import(loan.buffer()); }
Result<const ExternalBuffer*> ChannelImports::buffer(const Consumer::Upcoming& message) {
  return import(*message.buffer);
}

Status ChannelImports::wait(cudaStream_t stream, const Consumer::Upcoming& message) {
  return wait(stream, message.gpu_wait);
}

Result<CUdeviceptr> ChannelImports::flag_address(const GpuSync& sync) {
  if (!cuda_->driver_)
    return fail(Errc::Unsupported, "cuda::ChannelImports",
                "the CUDA driver entry points (stream memory operations, cuMem*) could not be loaded");
  if (sync.flag_offset % 8 != 0 || sync.flag_offset > sync.flag_buffer->size() ||
      sync.flag_buffer->size() - sync.flag_offset < 8)
    return fail(Errc::InvalidArgument, "cuda::ChannelImports",
                str_format("flag offset {} is not an aligned word of the {}-byte buffer", sync.flag_offset,
                           sync.flag_buffer->size()));
  LF_TRY(const auto* b, import(*sync.flag_buffer));
  return reinterpret_cast<CUdeviceptr>(b->data()) + sync.flag_offset;
}

Result<ChannelImports::CounterKey> ChannelImports::counter_key(const GpuSync& sync) {
  if (sync.kind() == GpuSyncKind::Flag) {
    LF_TRY(const auto at, flag_address(sync));
    return reinterpret_cast<CounterKey>(at);
  }
  if (sync.source == nullptr)
    return fail(Errc::InvalidArgument, "cuda::ChannelImports", "GPU sync point without its semaphore");
  return static_cast<CounterKey>(sync.source);
}

// Deferred signals of the stream go first: a signal held back behind this wait could be what the
// wait (through the peer) is waiting for.
Status ChannelImports::wait(cudaStream_t stream, const GpuSync& sync) {
  LF_TRY(const auto key, counter_key(sync));
  const bool captured = capturing(stream);
  unsigned long long id = 0;
  bool remember = false;
  if (!captured) {
    remember = cudaStreamGetId(stream, &id) == cudaSuccess;
    if (!remember) (void)cudaGetLastError();
  }
  auto seen = waited_.end();
  if (remember) {
    seen = std::ranges::find_if(waited_, [&](const Waited& w) { return w.stream_id == id && w.counter == key; });
    if (seen != waited_.end() && seen->value >= sync.value) {
      ++waits_skipped_;
      return {};
    }
  }
  LF_TRY_STATUS(queue_deferred(stream, captured));
  // A promised later value (a loan's GpuSync::ahead) is waited for instead: it covers the next
  // loans' waits, which are then skipped.
  const std::uint64_t target = std::max(sync.value, sync.ahead);
  if (sync.kind() == GpuSyncKind::Flag) {
    LF_TRY(const auto at, flag_address(sync));
    LF_TRY_STATUS(cuda_->driver_->check(
        cuda_->driver_->wait_value(reinterpret_cast<CUstream>(stream), at, target, CU_STREAM_WAIT_VALUE_GEQ),
        "cuStreamWaitValue64"));
  } else {
    LF_TRY(const auto* sem, semaphore(sync));
    LF_TRY_STATUS(sem->wait(stream, target));
  }
  if (!remember) return {};
  if (seen != waited_.end()) {
    seen->value = target;
  } else {
    if (waited_.size() >= kMaxWaited) waited_.clear();
    waited_.push_back({id, key, target});
  }
  return {};
}

Status ChannelImports::queue_deferred(cudaStream_t stream, bool captured) {
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    if (it->stream != stream) {
      ++it;
      continue;
    }
    if (captured) return fail(Errc::InvalidArgument, "cuda::ChannelImports::wait", kCaptured);
    LF_TRY_STATUS(queue_signal(it->stream, it->sync));
    it = deferred_.erase(it);
  }
  return {};
}

Status ChannelImports::order_after(cudaStream_t earlier, cudaStream_t later) {
  constexpr const char* call = "cuda::ChannelImports::signal";
  if (!ordered_) {
    cudaEvent_t e = nullptr;
    LF_TRY_STATUS(
        detail::cuda_step(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", call));
    ordered_.reset(e);
  }
  LF_TRY_STATUS(detail::cuda_step(cudaEventRecord(ordered_.get(), earlier), "cudaEventRecord", call));
  return detail::cuda_step(cudaStreamWaitEvent(later, ordered_.get(), 0), "cudaStreamWaitEvent", call);
}

// A signal deferred on the counter is covered by this one, which comes after it in the same
// stream, or in another stream made to wait for the first one's work so far (the counter only
// moves up). It is dropped only once this one is queued.
Status ChannelImports::signal(cudaStream_t stream, const GpuSync& sync) {
  constexpr const char* call = "cuda::ChannelImports::signal";
  LF_TRY(const auto key, counter_key(sync));
  const auto it = std::ranges::find(deferred_, key, &Deferred::counter);
  if (it != deferred_.end()) {
    if (capturing(stream) || capturing(it->stream)) return fail(Errc::InvalidArgument, call, kCaptured);
    if (it->stream != stream) LF_TRY_STATUS(order_after(it->stream, stream));
  }
  LF_TRY_STATUS(queue_signal(stream, sync));
  if (it != deferred_.end()) deferred_.erase(it);
  return {};
}

// Everything a later queue_signal needs is imported here, before the channel is told: a promise
// is not broken for want of an import.
Status ChannelImports::raise(cudaStream_t stream, const GpuSync& sync, Queue when) {
  if (when == Queue::Now || thread_dependent(stream) || capturing(stream)) return signal(stream, sync);
  LF_TRY(const auto key, counter_key(sync));
  if (sync.kind() == GpuSyncKind::Semaphore)
    if (auto sem = semaphore(sync); !sem) return std::unexpected(sem.error());
  const auto it = std::ranges::find(deferred_, key, &Deferred::counter);
  if (it == deferred_.end()) {
    deferred_.push_back({stream, key, sync});
    return {};
  }
  if (it->stream != stream) {
    if (capturing(it->stream)) return fail(Errc::InvalidArgument, "cuda::ChannelImports::signal", kCaptured);
    LF_TRY_STATUS(order_after(it->stream, stream));
  }
  *it = {stream, key, sync};
  return {};
}

Status ChannelImports::flush() {
  Status first;
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    const Status ok = capturing(it->stream) ? fail(Errc::InvalidArgument, "cuda::ChannelImports::flush",
                                                   "a stream with deferred signals is being captured")
                                            : queue_signal(it->stream, it->sync);
    if (ok) {
      it = deferred_.erase(it);
      continue;
    }
    if (first) first = std::unexpected(ok.error());
    ++it;
  }
  return first;
}

// The default write orders the kernels' memory writes before the flag (a fence precedes it).
Status ChannelImports::queue_signal(cudaStream_t stream, const GpuSync& sync) {
  if (sync.kind() == GpuSyncKind::Flag) {
    LF_TRY(const auto at, flag_address(sync));
    return cuda_->driver_->check(
        cuda_->driver_->write_value(reinterpret_cast<CUstream>(stream), at, sync.value, CU_STREAM_WRITE_VALUE_DEFAULT),
        "cuStreamWriteValue64");
  }
  LF_TRY(const auto* sem, semaphore(sync));
  return sem->signal(stream, sync.value);
}

Result<const ExternalSemaphore*> ChannelImports::semaphore(const GpuSync& sync) {
  if (sync.source == nullptr)
    return fail(Errc::InvalidArgument, "cuda::ChannelImports", "GPU sync point without its semaphore");
  if (auto it = semaphores_.find(sync.source); it != semaphores_.end()) return &it->second;
  auto sem = cuda_->import_semaphore(*sync.source);
  if (!sem) return std::unexpected(sem.error().within("cuda::ChannelImports"));
  return &semaphores_.emplace(sync.source, std::move(*sem)).first->second;
}

Status ChannelImports::wait(cudaStream_t stream, const Received& message) {
  const auto sync = message.gpu_wait();
  if (!sync) return {};
  return wait(stream, *sync);
}

Status ChannelImports::wait(cudaStream_t stream, const Loan& loan) {
  for (const auto& sync : loan.gpu_waits()) LF_TRY_STATUS(wait(stream, sync));
  return {};
}

// The signal is queued (or deferred) before the channel is told of it: should that fail, nobody
// is left waiting for a signal that will never come.
Status ChannelImports::signal(cudaStream_t stream, Loan& loan, Queue when) {
  const auto sync = loan.gpu_signal_point();
  if (!sync)
    return fail(Errc::Unsupported, "cuda::ChannelImports::signal",
                "the channel has no GPU ordering (timeline or flags): synchronise the stream before publishing");
  LF_TRY_STATUS(raise(stream, *sync, when));
  (void)loan.gpu_signal();
  return {};
}

Status ChannelImports::release(cudaStream_t stream, Received& message, Queue when) {
  LF_TRY(auto sync, message.gpu_release_point());
  LF_TRY_STATUS(raise(stream, sync, when));
  (void)message.gpu_release();
  return {};
}

}  // namespace lavaflow::cuda
