// SPDX-License-Identifier: MIT
#include "lavaflow/opencl/opencl.hpp"

#include <chrono>
#include <cstring>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/vulkan_context.hpp"

namespace lavaflow::cl {

std::string_view error_name(cl_int code) noexcept {
  switch (code) {
#define LF_CL_CASE(x) \
  case x:             \
    return #x;
    LF_CL_CASE(CL_SUCCESS)
    LF_CL_CASE(CL_DEVICE_NOT_FOUND)
    LF_CL_CASE(CL_OUT_OF_RESOURCES)
    LF_CL_CASE(CL_OUT_OF_HOST_MEMORY)
    LF_CL_CASE(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    LF_CL_CASE(CL_INVALID_VALUE)
    LF_CL_CASE(CL_INVALID_DEVICE)
    LF_CL_CASE(CL_INVALID_CONTEXT)
    LF_CL_CASE(CL_INVALID_COMMAND_QUEUE)
    LF_CL_CASE(CL_INVALID_HOST_PTR)
    LF_CL_CASE(CL_INVALID_MEM_OBJECT)
    LF_CL_CASE(CL_INVALID_BUFFER_SIZE)
    LF_CL_CASE(CL_INVALID_OPERATION)
    LF_CL_CASE(CL_INVALID_PROPERTY)
    LF_CL_CASE(CL_PLATFORM_NOT_FOUND_KHR)
#undef LF_CL_CASE
    default:
      return "OpenCL error";
  }
}

namespace {

std::unexpected<Error> cl_fail(cl_int code, std::string call, std::string_view what) {
  const Errc e =
      code == CL_OUT_OF_HOST_MEMORY || code == CL_OUT_OF_RESOURCES || code == CL_MEM_OBJECT_ALLOCATION_FAILURE
          ? Errc::OutOfMemory
          : Errc::Driver;
  return fail(e, std::move(call), str_format("{} ({}) while {}", error_name(code), code, what));
}

template <class T>
Result<T> device_value(cl_device_id d, cl_device_info what, const char* name) {
  T v{};
  if (cl_int r = clGetDeviceInfo(d, what, sizeof v, &v, nullptr); r != CL_SUCCESS)
    return cl_fail(r, "clGetDeviceInfo", name);
  return v;
}

std::string device_string(cl_device_id d, cl_device_info what) {
  std::size_t n = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  if (clGetDeviceInfo(d, what, n, s.data(), nullptr) != CL_SUCCESS) return {};
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

std::string platform_string(cl_platform_id p, cl_platform_info what) {
  std::size_t n = 0;
  if (clGetPlatformInfo(p, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  if (clGetPlatformInfo(p, what, n, s.data(), nullptr) != CL_SUCCESS) return {};
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

bool has_word(std::string_view list, std::string_view word) {
  for (std::size_t pos = 0; (pos = list.find(word, pos)) != std::string_view::npos; pos += word.size()) {
    const bool start = pos == 0 || list[pos - 1] == ' ';
    const bool end = pos + word.size() == list.size() || list[pos + word.size()] == ' ';
    if (start && end) return true;
  }
  return false;
}

bool lists_handle(cl_device_id d, cl_device_info what, cl_uint handle) {
  std::size_t n = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return false;
  std::vector<cl_uint> v(n / sizeof(cl_uint));
  if (clGetDeviceInfo(d, what, n, v.data(), nullptr) != CL_SUCCESS) return false;
  for (auto h : v)
    if (h == handle) return true;
  return false;
}

}  // namespace

Result<DeviceInfo> describe(cl_device_id device) {
  DeviceInfo info;
  info.device = device;
  LF_TRY(info.platform, device_value<cl_platform_id>(device, CL_DEVICE_PLATFORM, "CL_DEVICE_PLATFORM"));
  LF_TRY(auto type, device_value<cl_device_type>(device, CL_DEVICE_TYPE, "CL_DEVICE_TYPE"));
  info.cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
  info.platform_name = platform_string(info.platform, CL_PLATFORM_NAME);
  info.name = device_string(device, CL_DEVICE_NAME);
  info.version = device_string(device, CL_DEVICE_VERSION);
  info.driver_version = device_string(device, CL_DRIVER_VERSION);
  const auto ext = device_string(device, CL_DEVICE_EXTENSIONS);
  if (has_word(ext, "cl_khr_device_uuid")) {
    cl_uchar dev[CL_UUID_SIZE_KHR] = {}, drv[CL_UUID_SIZE_KHR] = {};
    if (clGetDeviceInfo(device, CL_DEVICE_UUID_KHR, sizeof dev, dev, nullptr) == CL_SUCCESS &&
        clGetDeviceInfo(device, CL_DRIVER_UUID_KHR, sizeof drv, drv, nullptr) == CL_SUCCESS) {
      std::memcpy(info.device_uuid.data(), dev, 16);
      std::memcpy(info.driver_uuid.data(), drv, 16);
      info.uuid_known = true;
    }
  }
  info.external_memory_fd =
      has_word(ext, "cl_khr_external_memory_opaque_fd") &&
      lists_handle(device, CL_DEVICE_EXTERNAL_MEMORY_IMPORT_HANDLE_TYPES_KHR, CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR);
  info.external_semaphore_fd =
      has_word(ext, "cl_khr_external_semaphore_opaque_fd") &&
      lists_handle(device, CL_DEVICE_SEMAPHORE_IMPORT_HANDLE_TYPES_KHR, CL_SEMAPHORE_HANDLE_OPAQUE_FD_KHR);
  info.host_pointer_path = info.cpu;
  return info;
}

Result<std::vector<DeviceInfo>> devices() {
  cl_uint np = 0;
  if (cl_int r = clGetPlatformIDs(0, nullptr, &np); r == CL_PLATFORM_NOT_FOUND_KHR || np == 0)
    return std::vector<DeviceInfo>{};
  else if (r != CL_SUCCESS)
    return cl_fail(r, "clGetPlatformIDs", "listing OpenCL platforms");
  std::vector<cl_platform_id> platforms(np);
  if (cl_int r = clGetPlatformIDs(np, platforms.data(), nullptr); r != CL_SUCCESS)
    return cl_fail(r, "clGetPlatformIDs", "listing OpenCL platforms");
  std::vector<DeviceInfo> out;
  for (auto p : platforms) {
    cl_uint nd = 0;
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS || nd == 0) continue;
    std::vector<cl_device_id> ds(nd);
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, ds.data(), nullptr) != CL_SUCCESS) continue;
    for (auto d : ds) {
      LF_TRY(auto info, describe(d));
      out.push_back(std::move(info));
    }
  }
  return out;
}

Status add_devices(Accelerators& accelerators) {
  LF_TRY(auto list, devices());
  std::uint32_t index = 0;
  for (const auto& d : list) {
    cl_ulong memory = 0;
    (void)clGetDeviceInfo(d.device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof memory, &memory, nullptr);
    accelerators.add({Api::OpenCL, str_format("{} ({})", d.name, d.platform_name), index++,
                      str_format("{}; external memory fd {}{}", d.version, d.external_memory_fd ? "yes" : "no",
                                 d.host_pointer_path ? "; CPU device: host pointers in place" : "")},
                     d.uuid_known ? std::optional<Uuid>(d.device_uuid) : std::nullopt, memory, {},
                     d.cpu ? vk::PhysicalDeviceType::eCpu : vk::PhysicalDeviceType::eOther);
  }
  return {};
}

std::string_view to_string(ImportPath p) noexcept {
  return p == ImportPath::ExternalMemory ? "external-memory (cl_khr_external_memory_opaque_fd)"
                                         : "host-pointer (CL_MEM_USE_HOST_PTR, zero copy on a CPU device)";
}

// ----- extension entry points, per platform

struct Interop::Fns {
  clEnqueueAcquireExternalMemObjectsKHR_fn acquire = nullptr;
  clEnqueueReleaseExternalMemObjectsKHR_fn release = nullptr;
  clCreateSemaphoreWithPropertiesKHR_fn create_semaphore = nullptr;
  clEnqueueWaitSemaphoresKHR_fn wait = nullptr;
  clEnqueueSignalSemaphoresKHR_fn signal = nullptr;
  clReleaseSemaphoreKHR_fn release_semaphore = nullptr;
};

Interop::Interop(cl_context c, cl_device_id d, DeviceInfo info, std::shared_ptr<const Fns> fns)
    : context_(c), device_(d), info_(std::move(info)), fns_(std::move(fns)) {}
Interop::Interop(Interop&& o) noexcept
    : context_(std::exchange(o.context_, nullptr)),
      device_(std::exchange(o.device_, nullptr)),
      info_(std::move(o.info_)),
      fns_(std::move(o.fns_)) {}
Interop& Interop::operator=(Interop&& o) noexcept {
  if (this != &o) {
    std::swap(context_, o.context_);
    std::swap(device_, o.device_);
    std::swap(info_, o.info_);
    std::swap(fns_, o.fns_);
  }
  return *this;
}
Interop::~Interop() {
  if (context_) clReleaseContext(context_);
  if (device_) clReleaseDevice(device_);
}

Result<Interop> Interop::create(cl_context context, cl_device_id device) {
  constexpr const char* call = "cl::Interop::create";
  if (context == nullptr || device == nullptr) return fail(Errc::InvalidArgument, call, "null context or device");
  auto info = describe(device);
  if (!info) return std::unexpected(info.error().within(call));
  auto fns = std::make_shared<Fns>();
  auto load = [&](const char* name) { return clGetExtensionFunctionAddressForPlatform(info->platform, name); };
  if (info->external_memory_fd) {
    fns->acquire =
        reinterpret_cast<clEnqueueAcquireExternalMemObjectsKHR_fn>(load("clEnqueueAcquireExternalMemObjectsKHR"));
    fns->release =
        reinterpret_cast<clEnqueueReleaseExternalMemObjectsKHR_fn>(load("clEnqueueReleaseExternalMemObjectsKHR"));
    if (!fns->acquire || !fns->release) info->external_memory_fd = false;
  }
  if (info->external_semaphore_fd) {
    fns->create_semaphore =
        reinterpret_cast<clCreateSemaphoreWithPropertiesKHR_fn>(load("clCreateSemaphoreWithPropertiesKHR"));
    fns->wait = reinterpret_cast<clEnqueueWaitSemaphoresKHR_fn>(load("clEnqueueWaitSemaphoresKHR"));
    fns->signal = reinterpret_cast<clEnqueueSignalSemaphoresKHR_fn>(load("clEnqueueSignalSemaphoresKHR"));
    fns->release_semaphore = reinterpret_cast<clReleaseSemaphoreKHR_fn>(load("clReleaseSemaphoreKHR"));
    if (!fns->create_semaphore || !fns->wait || !fns->signal || !fns->release_semaphore)
      info->external_semaphore_fd = false;
  }
  if (cl_int r = clRetainContext(context); r != CL_SUCCESS)
    return cl_fail(r, "clRetainContext", "wrapping the context");
  if (cl_int r = clRetainDevice(device); r != CL_SUCCESS) {
    clReleaseContext(context);
    return cl_fail(r, "clRetainDevice", "wrapping the device");
  }
  return Interop(context, device, std::move(*info), std::move(fns));
}

Result<Memory> Interop::import_buffer(const ExportDescriptor& d, UniqueFd&& fd, cl_mem_flags flags) const {
  constexpr const char* call = "cl::Interop::import_buffer";
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  if (!info_.external_memory_fd)
    return fail(
        Errc::Unsupported, call,
        str_format("OpenCL device {} ({}) lacks cl_khr_external_memory_opaque_fd", info_.name, info_.platform_name));
  if (!is_gpu(d.kind))
    return fail(Errc::Unsupported, call, str_format("{} memory is not Vulkan memory", to_string(d.kind)));
  if (!info_.uuid_known)
    return fail(Errc::Unsupported, call,
                str_format("OpenCL device {} does not report its UUID (cl_khr_device_uuid): cannot tell it is the "
                           "exporting device",
                           info_.name));
  // The device UUID decides. Driver UUIDs are not comparable across APIs: NVIDIA's OpenCL reports
  // its device UUID as CL_DRIVER_UUID_KHR, unlike its Vulkan driver UUID (seen with driver 580).
  if (d.device_uuid != info_.device_uuid)
    return fail(Errc::DeviceMismatch, call,
                str_format("memory comes from device {}, OpenCL device {} is {}", lavaflow::to_string(d.device_uuid),
                           info_.name, lavaflow::to_string(info_.device_uuid)));
  LF_TRY_STATUS(check_memory_fd(fd, d.allocation_size, call));
  if (d.offset != 0)
    return fail(Errc::Unsupported, call,
                str_format("range starts at offset {}: OpenCL imports whole allocations; import the whole buffer and "
                           "use clCreateSubBuffer",
                           d.offset));
  const cl_mem_properties props[] = {static_cast<cl_mem_properties>(CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR),
                                     static_cast<cl_mem_properties>(fd.get()),
                                     static_cast<cl_mem_properties>(CL_DEVICE_HANDLE_LIST_KHR),
                                     reinterpret_cast<cl_mem_properties>(device_),
                                     CL_DEVICE_HANDLE_LIST_END_KHR,
                                     0};
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBufferWithProperties(context_, props, flags, d.size, nullptr, &err);
  if (err != CL_SUCCESS || m == nullptr)
    return cl_fail(err, "clCreateBufferWithProperties", str_format("importing {} bytes from fd {}", d.size, fd.get()));
  (void)fd.release();  // the OpenCL implementation owns it now
  return Memory(m, ImportPath::ExternalMemory, d.size);
}

Result<Memory> Interop::import_buffer(const lavaflow::Buffer& buffer, cl_mem_flags flags) const {
  constexpr const char* call = "cl::Interop::import_buffer";
  if (is_gpu(buffer.kind()) && info_.external_memory_fd) {
    LF_TRY(auto ex, buffer.export_handle());
    return import_buffer(ex.descriptor, std::move(ex.fd), flags);
  }
  if (!info_.host_pointer_path)
    return fail(
        Errc::Unsupported, call,
        str_format("OpenCL device {} has no cl_khr_external_memory_opaque_fd and is not a CPU device: {} memory "
                   "cannot be shared without a copy",
                   info_.name, to_string(buffer.kind())));
  if (buffer.kind() == BufferKind::GpuDeviceLocal)
    return fail(Errc::Unsupported, call,
                str_format("device-local Vulkan memory cannot be used by CPU OpenCL device {} (no "
                           "cl_khr_external_memory_opaque_fd); allocate it host-visible or in CPU memory",
                           info_.name));
  if (buffer.host_ptr() == nullptr)
    return fail(Errc::Unsupported, call,
                str_format("{} memory is not mapped in this process", to_string(buffer.kind())));
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(context_, flags | CL_MEM_USE_HOST_PTR, buffer.size(), buffer.host_ptr(), &err);
  if (err != CL_SUCCESS || m == nullptr)
    return cl_fail(err, "clCreateBuffer(CL_MEM_USE_HOST_PTR)", str_format("wrapping {} mapped bytes", buffer.size()));
  return Memory(m, ImportPath::HostPointer, buffer.size());
}

Result<Semaphore> Interop::import_semaphore(UniqueFd&& fd) const {
  constexpr const char* call = "cl::Interop::import_semaphore";
  if (!info_.external_semaphore_fd)
    return fail(Errc::Unsupported, call,
                str_format("OpenCL device {} lacks cl_khr_external_semaphore_opaque_fd: finish Vulkan work with a CPU "
                           "wait instead",
                           info_.name));
  LF_TRY_STATUS(check_handle_fd(fd, call));
  // No device list: the semaphore then belongs to every device of the context. (The list's
  // property id changed between the provisional and final extension — 0x2051 vs 0x2053 — and
  // NVIDIA's driver 580 rejects the provisional one that Debian's headers name.)
  const cl_semaphore_properties_khr props[] = {CL_SEMAPHORE_TYPE_KHR, CL_SEMAPHORE_TYPE_BINARY_KHR,
                                               CL_SEMAPHORE_HANDLE_OPAQUE_FD_KHR,
                                               static_cast<cl_semaphore_properties_khr>(fd.get()), 0};
  cl_int err = CL_SUCCESS;
  cl_semaphore_khr s = fns_->create_semaphore(context_, props, &err);
  if (err != CL_SUCCESS || s == nullptr)
    return cl_fail(err, "clCreateSemaphoreWithPropertiesKHR", str_format("importing a semaphore from fd {}", fd.get()));
  (void)fd.release();
  return Semaphore(s, fns_->release_semaphore);
}

Status Interop::wait(cl_command_queue queue, const Semaphore& s) const {
  const cl_semaphore_khr sem = s.get();
  if (cl_int r = fns_->wait(queue, 1, &sem, nullptr, 0, nullptr, nullptr); r != CL_SUCCESS)
    return cl_fail(r, "clEnqueueWaitSemaphoresKHR", "waiting on an imported semaphore");
  return {};
}

Status Interop::signal(cl_command_queue queue, const Semaphore& s) const {
  const cl_semaphore_khr sem = s.get();
  if (cl_int r = fns_->signal(queue, 1, &sem, nullptr, 0, nullptr, nullptr); r != CL_SUCCESS)
    return cl_fail(r, "clEnqueueSignalSemaphoresKHR", "signalling an imported semaphore");
  return {};
}

Result<Access> Interop::acquire(cl_command_queue queue, std::span<const Memory* const> memory) const {
  std::vector<cl_mem> external;
  for (const auto* m : memory)
    if (m->path() == ImportPath::ExternalMemory) external.push_back(m->get());
  if (!external.empty()) {
    if (cl_int r = fns_->acquire(queue, static_cast<cl_uint>(external.size()), external.data(), 0, nullptr, nullptr);
        r != CL_SUCCESS)
      return cl_fail(r, "clEnqueueAcquireExternalMemObjectsKHR", str_format("acquiring {} buffers", external.size()));
  }
  return Access(fns_->release, queue, std::move(external));
}

// ----- owners

Access::Access(Access&& o) noexcept : release_(o.release_), queue_(o.queue_), objects_(std::exchange(o.objects_, {})) {}
Access::~Access() { (void)release(); }
Status Access::release() {
  if (objects_.empty()) return {};
  auto objs = std::exchange(objects_, {});
  if (cl_int r = release_(queue_, static_cast<cl_uint>(objs.size()), objs.data(), 0, nullptr, nullptr); r != CL_SUCCESS)
    return cl_fail(r, "clEnqueueReleaseExternalMemObjectsKHR", str_format("releasing {} buffers", objs.size()));
  return {};
}

Memory::Memory(Memory&& o) noexcept : mem_(std::exchange(o.mem_, nullptr)), path_(o.path_), size_(o.size_) {}
Memory& Memory::operator=(Memory&& o) noexcept {
  if (this != &o) {
    std::swap(mem_, o.mem_);
    path_ = o.path_;
    size_ = o.size_;
  }
  return *this;
}
Memory::~Memory() {
  if (mem_) clReleaseMemObject(mem_);
}

Semaphore::Semaphore(Semaphore&& o) noexcept : sem_(std::exchange(o.sem_, nullptr)), release_(o.release_) {}
Semaphore& Semaphore::operator=(Semaphore&& o) noexcept {
  if (this != &o) {
    std::swap(sem_, o.sem_);
    std::swap(release_, o.release_);
  }
  return *this;
}
Semaphore::~Semaphore() {
  if (sem_ && release_) release_(sem_);
}

ChannelImports::~ChannelImports() {
  if (!vk_ready_ && !vk_done_) return;
  // A semaphore must not go while the Vulkan queue still has a wait or signal on it queued.
  if (const VulkanContext* vk = consumer_->vulkan()) {
    try {
      vk->queue().waitIdle();
    } catch (const vk::SystemError&) {  // a lost device has nothing queued left to wait for
    }
  }
}

Result<const Memory*> ChannelImports::buffer(const Received& message) {
  const lavaflow::Buffer* key = &message.buffer();
  if (auto it = cache_.find(key); it != cache_.end()) return &it->second;
  auto imported = cl_->import_buffer(*key, flags_);
  if (!imported) return std::unexpected(imported.error().within("cl::ChannelImports::buffer"));
  return &cache_.emplace(key, std::move(*imported)).first->second;
}

Status ChannelImports::setup() {
  tried_ = true;
  const VulkanContext* vk = consumer_ ? consumer_->vulkan() : nullptr;
  if (vk == nullptr || !cl_->device().external_semaphore_fd) return {};
  if (!GpuSemaphore::supported(*vk, SemaphoreKind::Binary, false)) return {};
  auto bridge = [&](std::optional<GpuSemaphore>& v, std::optional<Semaphore>& c) -> Status {
    LF_TRY(auto sem, GpuSemaphore::create(*vk, SemaphoreKind::Binary));
    LF_TRY(UniqueFd fd, sem.export_fd());
    LF_TRY(auto imported, cl_->import_semaphore(std::move(fd)));
    v.emplace(std::move(sem));
    c.emplace(std::move(imported));
    return {};
  };
  LF_TRY_STATUS(bridge(vk_ready_, cl_ready_));
  if (auto ok = bridge(vk_done_, cl_done_); !ok) {
    vk_ready_.reset();
    cl_ready_.reset();
    return ok;
  }
  return {};
}

namespace {
/// One submission on the consumer's Vulkan queue: waits on `wait` (timeline value, or binary), then
/// signals `signal` (timeline value, or binary).
Status bridge_submit(const VulkanContext& vk, vk::Semaphore wait, std::uint64_t wait_value, vk::Semaphore signal,
                     std::uint64_t signal_value, const char* call) {
  const vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eAllCommands;
  vk::TimelineSemaphoreSubmitInfo values(1, &wait_value, 1, &signal_value);
  vk::SubmitInfo submit(1, &wait, &stage, 0, nullptr, 1, &signal, &values);
  try {
    vk.queue().submit(submit);
  } catch (const vk::SystemError& e) {
    return std::unexpected(from_vk(e.code().value(), "vkQueueSubmit(OpenCL hand-off)").within(call));
  }
  return {};
}
}  // namespace

Status ChannelImports::wait(cl_command_queue queue, const Received& message) {
  constexpr const char* call = "cl::ChannelImports::wait";
  const auto w = message.gpu_wait();
  if (!w) return {};
  if (!tried_)
    if (auto ok = setup(); !ok) return std::unexpected(ok.error().within(call));
  // OpenCL cannot wait on a GPU flag, nor without the semaphore bridge: the CPU waits then.
  if (!cl_ready_ || w->kind() == GpuSyncKind::Flag) return wait_on_host(*w, std::chrono::seconds(60));
  LF_TRY_STATUS(bridge_submit(*consumer_->vulkan(), w->semaphore, w->value, vk_ready_->semaphore(), 0, call));
  return cl_->wait(queue, *cl_ready_);
}

Status ChannelImports::release(cl_command_queue queue, Received& message) {
  constexpr const char* call = "cl::ChannelImports::release";
  if (!tried_)
    if (auto ok = setup(); !ok) return std::unexpected(ok.error().within(call));
  if (!cl_done_ || consumer_->gpu_release_timeline() == nullptr) {
    if (cl_int r = clFinish(queue); r != CL_SUCCESS) return cl_fail(r, "clFinish", "finishing the message's work");
    return {};
  }
  LF_TRY(auto sync, message.gpu_release_point());
  // The release is promised only once its signal is queued; if queuing fails, OpenCL finishes
  // instead, so that the message can still be dropped safely.
  auto queued = [&]() -> Status {
    LF_TRY_STATUS(cl_->signal(queue, *cl_done_));
    // The Vulkan wait below must come after the signal reaches the device.
    if (cl_int r = clFlush(queue); r != CL_SUCCESS) return cl_fail(r, "clFlush", "submitting the release signal");
    return bridge_submit(*consumer_->vulkan(), vk_done_->semaphore(), 0, sync.semaphore, sync.value, call);
  }();
  if (!queued) {
    (void)clFinish(queue);
    return queued;
  }
  (void)message.gpu_release();
  return {};
}

}  // namespace lavaflow::cl
