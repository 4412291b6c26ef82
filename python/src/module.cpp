// SPDX-License-Identifier: MIT
// lavaflow._lavaflow: the Python face of the channels, buffers and pool. Messages and loans are
// exported zero-copy through the buffer protocol, __array_interface__ and DLPack; each export
// holds the Python object it came from, so the memory outlives every view of it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "dlpack.hpp"
#include "lavaflow/lavaflow.hpp"
#if LAVAFLOW_PY_CUDA
#include "lavaflow/cuda/cuda.hpp"
#endif

namespace py = pybind11;
using namespace lavaflow;
namespace dl = lavaflow::python::dlpack;

namespace {

// ---------------------------------------------------------------------------------------------
// Errors: lavaflow.Error and one subclass per Errc (plus Closed, for objects used after close).

constexpr std::array<std::pair<Errc, const char*>, 15> kErrorNames{{
    {Errc::InvalidArgument, "InvalidArgument"},
    {Errc::Malformed, "Malformed"},
    {Errc::VersionMismatch, "VersionMismatch"},
    {Errc::DeviceMismatch, "DeviceMismatch"},
    {Errc::Unsupported, "Unsupported"},
    {Errc::OutOfMemory, "OutOfMemory"},
    {Errc::NotFound, "NotFound"},
    {Errc::Timeout, "Timeout"},
    {Errc::WouldBlock, "WouldBlock"},
    {Errc::PeerLost, "PeerLost"},
    {Errc::PermissionDenied, "PermissionDenied"},
    {Errc::Unreachable, "Unreachable"},
    {Errc::System, "SystemCallError"},
    {Errc::Driver, "DriverError"},
    {Errc::Internal, "InternalError"},
}};

/// The module's exception classes: created once when the module is imported and kept for as
/// long as the interpreter runs (Python modules are never unloaded).
struct ErrorClasses {
  PyObject* base = nullptr;
  PyObject* closed = nullptr;
  std::array<PyObject*, kErrorNames.size()> by_code{};
};
ErrorClasses& error_classes() {
  static ErrorClasses classes;
  return classes;
}

[[noreturn]] void raise(const Error& e) {
  PyErr_SetString(error_classes().by_code[static_cast<std::size_t>(e.code())], e.message().c_str());
  throw py::error_already_set();
}
[[noreturn]] void raise_closed(const std::string& what) {
  PyErr_SetString(error_classes().closed, what.c_str());
  throw py::error_already_set();
}
template <class T>
T take(Result<T>&& r) {
  if (!r) raise(r.error());
  return std::move(*r);
}
void check(const Status& s) {
  if (!s) raise(s.error());
}

/// Seconds from Python (None: no bound) as a Duration.
Duration timeout_of(const std::optional<double>& seconds, const char* what) {
  if (!seconds) return kForever;
  if (!(*seconds >= 0) || *seconds > 1e9)
    throw py::value_error(std::string(what) + ": timeout must be None or between 0 and 1e9 seconds");
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(*seconds));
}

/// Runs a blocking call without the GIL in slices, so that Ctrl-C and other threads still run:
/// `once(slice)` returns a Result; a Timeout of a slice before the deadline waits again.
template <class F>
auto blocking(Duration timeout, F&& once) -> decltype(once(timeout)) {
  constexpr Duration kSlice = std::chrono::milliseconds(100);
  const auto deadline =
      timeout == kForever ? std::chrono::steady_clock::time_point::max() : std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    const Duration left = timeout == kForever ? kSlice : std::chrono::duration_cast<Duration>(deadline - now);
    const Duration slice = std::max(Duration::zero(), std::min(left, kSlice));
    decltype(once(timeout)) r = [&] {
      py::gil_scoped_release unlocked;
      return once(slice);
    }();
    if (r || r.error().code() != Errc::Timeout || std::chrono::steady_clock::now() >= deadline) return r;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

WaitMode wait_of(const std::string& s) {
  if (s == "spin_then_block") return WaitMode::SpinThenBlock;
  if (s == "busy_poll") return WaitMode::BusyPoll;
  if (s == "block") return WaitMode::Block;
  throw py::value_error("wait must be 'spin_then_block', 'busy_poll' or 'block', not '" + s + "'");
}
FullPolicy policy_of(const std::string& s) {
  if (s == "block") return FullPolicy::Block;
  if (s == "drop_oldest") return FullPolicy::DropOldest;
  if (s == "fail_fast") return FullPolicy::FailFast;
  throw py::value_error("policy must be 'block', 'drop_oldest' or 'fail_fast', not '" + s + "'");
}

// ---------------------------------------------------------------------------------------------
// Where a ring buffer's bytes are for Python: host memory, or CUDA device memory through the
// CUDA adapter (Vulkan rings in device-local memory).

enum class Want { Auto, Cpu, Cuda };
Want want_of(const std::string& s) {
  if (s == "auto") return Want::Auto;
  if (s == "cpu") return Want::Cpu;
  if (s == "cuda") return Want::Cuda;
  throw py::value_error("device must be 'auto', 'cpu' or 'cuda', not '" + s + "'");
}

struct Place {
  void* data = nullptr;
  dl::Device device{dl::kCPU, 0};
};

/// A channel's CUDA side, made on first need: the device under the channel's Vulkan context and
/// the imports of its ring buffers and semaphores.
struct CudaSide {
#if LAVAFLOW_PY_CUDA
  explicit CudaSide(cuda::Interop i) : interop(std::move(i)), imports(interop) {}
  cuda::Interop interop;
  cuda::ChannelImports imports;
#endif
};

/// What loans and messages share: where the bytes are, how many exports hold them.
struct Exported {
  Place place;
  std::uint64_t bytes = 0;
  Py_ssize_t shape = 0;   // buffer protocol views point here
  Py_ssize_t stride = 1;  // one byte
  int exports = 0;        // live buffer-protocol views and DLPack capsules
#if LAVAFLOW_PY_CUDA
  std::optional<cudaStream_t> stream;  // the CUDA stream that last took the bytes through DLPack
#endif
};

template <class Channel>
Place place_of(const Buffer& b, Want want, std::unique_ptr<CudaSide>& cuda_side, const Channel& channel,
               const VulkanContext* vulkan) {
  const bool gpu = is_gpu(b.kind());
  if (want == Want::Cpu || (want == Want::Auto && (!gpu || b.host_ptr()))) {
    if (!b.host_ptr())
      raise(Error(Errc::Unsupported, "lavaflow", "the ring is device-local GPU memory with no host mapping"));
    if (want == Want::Cpu || !gpu) return {b.host_ptr(), {dl::kCPU, 0}};
  }
#if LAVAFLOW_PY_CUDA
  if (gpu && vulkan) {
    if (!cuda_side) {
      auto i = cuda::Interop::create(*vulkan);
      if (!i) {
        if (want == Want::Cuda || !b.host_ptr()) raise(i.error());
        return {b.host_ptr(), {dl::kCPU, 0}};
      }
      cuda_side = std::make_unique<CudaSide>(std::move(*i));
    }
    auto mapped = take(cuda_side->imports.buffer(channel));
    return {mapped->data(), {dl::kCUDA, cuda_side->interop.device().ordinal}};
  }
#else
  (void)cuda_side;
  (void)channel;
  (void)vulkan;
#endif
  if (want == Want::Cuda)
    raise(
        Error(Errc::Unsupported, "lavaflow", gpu ? "this lavaflow was built without CUDA" : "the ring is host memory"));
  if (!b.host_ptr()) raise(Error(Errc::Unsupported, "lavaflow", "GPU memory without a host mapping and without CUDA"));
  return {b.host_ptr(), {dl::kCPU, 0}};
}

// ---------------------------------------------------------------------------------------------
// Producer side

struct ProducerBox {
  std::unique_ptr<Producer> producer;
  Want want = Want::Auto;
  std::unique_ptr<CudaSide> cuda;  // destroyed before the producer (declared after it)
  ~ProducerBox() { cuda.reset(); }
};

struct PyProducer {
  std::shared_ptr<ProducerBox> box;
  /// The channel ends now; loans and their views keep the ring mapped while they live.
  void close() {
    if (box) box->producer->close();
    box.reset();
  }
  ProducerBox& live() const {
    if (!box) raise_closed("the producer is closed");
    return *box;
  }
};

struct PyLoan {
  std::shared_ptr<ProducerBox> box;  // keeps the ring (and its CUDA mapping) while views live
  std::optional<Loan> loan;
  std::optional<MessageInfo> published;
  std::uint64_t size = 0;  // bytes to publish; 0: the whole slot
  std::uint64_t tag = 0;
  Exported ex;

  Loan& live() {
    if (!loan) raise_closed(published ? "the loan was published" : "the loan was given back");
    return *loan;
  }
  MessageInfo publish(std::optional<std::uint64_t> size_arg, std::optional<std::uint64_t> tag_arg,
                      std::optional<std::uintptr_t> stream) {
    Loan& l = live();
    if (size_arg) size = *size_arg;
    if (tag_arg) tag = *tag_arg;
    if (size > ex.bytes) throw py::value_error("size is larger than the slot");
#if LAVAFLOW_PY_CUDA
    // Bytes written by CUDA: the hand-off is ordered after the work in the given (or the last
    // DLPack) stream — on the GPU through the channel's timeline, else by waiting for it here.
    if (ex.place.device.device_type == dl::kCUDA && box->cuda) {
      const auto s = stream ? reinterpret_cast<cudaStream_t>(*stream) : ex.stream.value_or(cudaStreamLegacy);
      if (box->producer->has_gpu_timeline()) {
        check(box->cuda->imports.signal(s, l));
      } else {
        check(cuda::check(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
      }
    }
#else
    (void)stream;
#endif
    Loan moved = std::move(l);
    loan.reset();
    auto info = blocking(
        kForever, [&](Duration) { return box->producer->publish(std::move(moved), {.size = size, .user_tag = tag}); });
    published = take(std::move(info));
    unpin();
    return *published;
  }
  void give_back() {
    loan.reset();
    unpin();
  }
  /// A published or given-back loan holds the channel only while views of its bytes remain, so
  /// that closing the producer ends the channel once nothing can reach its memory.
  void unpin() {
    if (!loan && ex.exports == 0) box.reset();
  }
};

// ---------------------------------------------------------------------------------------------
// Consumer side

struct ConsumerBox {
  std::unique_ptr<Consumer> consumer;
  Want want = Want::Auto;
  std::unique_ptr<CudaSide> cuda;
  ~ConsumerBox() { cuda.reset(); }
};

struct PyConsumer {
  std::shared_ptr<ConsumerBox> box;
  /// Hangs up now; messages and their views keep the ring mapped while they live.
  void close() {
    if (box) box->consumer->close();
    box.reset();
  }
  ConsumerBox& live() const {
    if (!box) raise_closed("the consumer is closed");
    return *box;
  }
};

struct PyMessage {
  std::shared_ptr<ConsumerBox> box;
  std::optional<Received> message;
  MessageInfo info;
  std::uint64_t missed = 0;
  bool release_asked = false;
  Exported ex;

  void check_live() const {
    if (!message || release_asked) raise_closed("the message was released");
  }
  /// Gives the slot back. Views made of the message keep its memory mapped (never dangling), but
  /// once the slot is back the producer may write the next message into it. GPU readers (DLPack
  /// with a CUDA stream) are waited for on the GPU where the channel has a timeline, else here.
  void end() {
    if (!message) return;
#if LAVAFLOW_PY_CUDA
    if (ex.stream && box->cuda) {
      if (!box->consumer->has_gpu_timeline() || !box->cuda->imports.release(*ex.stream, *message))
        (void)cudaStreamSynchronize(*ex.stream);
    }
#endif
    message.reset();
    unpin();
  }
  /// A released message holds the channel only while views of its bytes remain.
  void unpin() {
    if (!message && ex.exports == 0) box.reset();
  }
  PyMessage() = default;
  PyMessage(PyMessage&& o) noexcept
      : box(std::move(o.box)),
        message(std::exchange(o.message, std::nullopt)),
        info(o.info),
        missed(o.missed),
        release_asked(o.release_asked),
        ex(o.ex) {}
  PyMessage& operator=(PyMessage&&) = delete;
  ~PyMessage() { end(); }
};

// ---------------------------------------------------------------------------------------------
// Pool

struct PyPool {
  std::shared_ptr<MemoryPool> pool;
  MemoryPool& live() const {
    if (!pool) raise_closed("the pool is closed");
    return *pool;
  }
};

/// A rented buffer; back to the pool at release() (or when it and its views are gone) once no
/// view of it remains: a pooled block is rented again, so a view must never outlive the rent.
struct PyPooled {
  std::shared_ptr<MemoryPool> pool;  // the pool outlives its buffers' Python objects
  std::optional<PooledBuffer> buffer;
  bool release_asked = false;
  Exported ex;

  PooledBuffer& live() {
    if (!buffer || release_asked) raise_closed("the buffer was released to its pool");
    return *buffer;
  }
  void unpin() {
    if (release_asked && ex.exports == 0) buffer.reset();
  }
};

BufferKind buffer_kind_of(const std::string& name) {
  for (int k = 1; k <= 6; ++k)
    if (to_string(static_cast<BufferKind>(k)) == name) return static_cast<BufferKind>(k);
  throw py::value_error("unknown buffer kind '" + name +
                        "' (cpu-shared, cpu-numa, cpu-hugepages, cpu-gpu-pinned, gpu-device-local, gpu-host-visible)");
}

// ---------------------------------------------------------------------------------------------
// Buffer protocol (PEP 3118), with the exports counted: views of a loan or message hold it, and
// a message asked to release waits for the last of them.

template <class T>
Exported& exported(T& t) {
  return t.ex;
}

template <class T>
int get_buffer(PyObject* self, Py_buffer* view, int flags) {
  T* t = nullptr;
  try {
    t = py::handle(self).cast<T*>();
    if constexpr (std::is_same_v<T, PyMessage>)
      t->check_live();
    else
      (void)t->live();
  } catch (py::error_already_set& e) {
    e.restore();
    return -1;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
    return -1;
  }
  Exported& ex = exported(*t);
  if (ex.place.device.device_type != dl::kCPU) {
    PyErr_SetString(PyExc_BufferError,
                    "the bytes are in CUDA device memory: take them with DLPack (torch.from_dlpack, cupy.from_dlpack)");
    return -1;
  }
  view->buf = ex.place.data;
  view->obj = Py_NewRef(self);
  view->len = static_cast<Py_ssize_t>(ex.bytes);
  view->readonly = 0;
  view->itemsize = 1;
  view->format = (flags & PyBUF_FORMAT) ? const_cast<char*>("B") : nullptr;
  view->ndim = 1;
  view->shape = (flags & PyBUF_ND) ? &ex.shape : nullptr;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? &ex.stride : nullptr;
  view->suboffsets = nullptr;
  view->internal = nullptr;
  ++ex.exports;
  return 0;
}

template <class T>
void release_buffer(PyObject* self, Py_buffer*) {
  T* t = py::handle(self).cast<T*>();
  --exported(*t).exports;
  t->unpin();
}

template <class T, class Class>
void install_buffer_protocol(Class& cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_as_buffer->bf_getbuffer = &get_buffer<T>;
  type->tp_as_buffer->bf_releasebuffer = &release_buffer<T>;
  PyType_Modified(type);
}

py::dict array_interface(Exported& ex, std::uint64_t bytes) {
  if (ex.place.device.device_type != dl::kCPU)
    throw py::type_error("the bytes are in CUDA device memory: use __dlpack__ (or __cuda_array_interface__)");
  py::dict d;
  d["shape"] = py::make_tuple(bytes);
  d["typestr"] = "|u1";
  d["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(ex.place.data), false);
  d["version"] = 3;
  return d;
}

// ---------------------------------------------------------------------------------------------
// DLPack

struct DlpackOwner {
  PyObject* owner = nullptr;  // the loan or message; a strong reference
  std::int64_t shape = 0;
  enum class Kind { Loan, Message, Pooled } kind = Kind::Loan;
  dl::ManagedTensor legacy{};
  dl::ManagedTensorVersioned versioned{};
};

void drop_owner(DlpackOwner* o) {
  // The deleter may run on any thread, with or without the GIL, even after the interpreter began
  // to finalize (then the owner is left to it).
  if (!Py_IsInitialized()) return;
  PyGILState_STATE g = PyGILState_Ensure();
  try {
    py::handle h(o->owner);
    auto done = [](auto* t) {
      --t->ex.exports;
      t->unpin();
    };
    switch (o->kind) {
      case DlpackOwner::Kind::Message:
        done(h.cast<PyMessage*>());
        break;
      case DlpackOwner::Kind::Loan:
        done(h.cast<PyLoan*>());
        break;
      case DlpackOwner::Kind::Pooled:
        done(h.cast<PyPooled*>());
        break;
    }
  } catch (...) {
    PyErr_Clear();
  }
  Py_DECREF(o->owner);
  delete o;
  PyGILState_Release(g);
}

void legacy_deleter(dl::ManagedTensor* t) { drop_owner(static_cast<DlpackOwner*>(t->manager_ctx)); }
void versioned_deleter(dl::ManagedTensorVersioned* t) { drop_owner(static_cast<DlpackOwner*>(t->manager_ctx)); }

void legacy_capsule_destructor(PyObject* capsule) {
  // A capsule nobody consumed (its name unchanged) still owns the tensor.
  if (PyCapsule_IsValid(capsule, dl::kCapsule)) {
    auto* t = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(capsule, dl::kCapsule));
    t->deleter(t);
  }
}
void versioned_capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, dl::kVersionedCapsule)) {
    auto* t = static_cast<dl::ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, dl::kVersionedCapsule));
    t->deleter(t);
  }
}

/// __dlpack__(stream=None, max_version=None, dl_device=None, copy=None) over `ex`.
template <class Sync>
py::object to_dlpack(py::handle self, Exported& ex, DlpackOwner::Kind kind, const py::object& stream,
                     const py::object& max_version, const py::object& dl_device, const py::object& copy, Sync&& sync) {
  if (!copy.is_none() && copy.cast<bool>())
    throw py::buffer_error("lavaflow shares its buffers and never copies them (copy=True)");
  if (!dl_device.is_none()) {
    auto d = dl_device.cast<std::pair<int, int>>();
    if (d.first != ex.place.device.device_type || d.second != ex.place.device.device_id)
      throw py::buffer_error("the bytes are not on the requested dl_device (lavaflow does not copy)");
  }
  if (ex.place.device.device_type == dl::kCPU) {
    if (!stream.is_none() && stream.cast<long long>() != -1)
      throw py::buffer_error("stream must be None for host memory");
  } else {
    // CUDA: None is the legacy default stream, -1 asks for no ordering.
    const long long s = stream.is_none() ? 1 : stream.cast<long long>();
    if (s != -1) sync(static_cast<std::uintptr_t>(s == 1 || s == 0 ? 1 : s));
  }
  bool versioned = false;
  if (!max_version.is_none()) versioned = max_version.cast<std::pair<int, int>>().first >= 1;

  auto* o = new DlpackOwner;
  o->owner = Py_NewRef(self.ptr());
  o->shape = static_cast<std::int64_t>(ex.bytes);
  o->kind = kind;
  const dl::Tensor tensor{ex.place.data, ex.place.device, 1, {dl::kUInt, 8, 1}, &o->shape, nullptr, 0};
  ++ex.exports;
  PyObject* capsule = nullptr;
  if (versioned) {
    o->versioned = {{dl::kMajor, dl::kMinor}, o, &versioned_deleter, 0, tensor};
    capsule = PyCapsule_New(&o->versioned, dl::kVersionedCapsule, &versioned_capsule_destructor);
  } else {
    o->legacy = {tensor, o, &legacy_deleter};
    capsule = PyCapsule_New(&o->legacy, dl::kCapsule, &legacy_capsule_destructor);
  }
  if (!capsule) {
    drop_owner(o);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

py::tuple dlpack_device(const Exported& ex) {
  return py::make_tuple(ex.place.device.device_type, ex.place.device.device_id);
}

// ---------------------------------------------------------------------------------------------
// lavaflow.info()

py::dict info(const std::optional<PyPool>& pool) {
  py::dict out;
  if (pool && pool->pool) out["pool"] = py::module_::import("json").attr("loads")(pool->pool->stats().to_json());
  out["version"] = LAVAFLOW_PY_VERSION;
  py::list vk;
  std::vector<DeviceCapabilities> devices;
  if (auto d = enumerate_devices()) {
    devices = std::move(*d);
  } else {
    out["vulkan_error"] = d.error().message();
  }
  for (const auto& d : devices) {
    py::dict e;
    e["name"] = d.identity.name;
    e["type"] = device_type_name(d.type);
    e["driver"] = d.driver_name;
    e["device_uuid"] = to_string(d.identity.device_uuid);
    e["device_local_bytes"] = d.device_local_bytes;
    e["memory_fd_export"] = d.memory_fd_export;
    e["memory_fd_import"] = d.memory_fd_import;
    e["memory_host_import"] = d.memory_host_import;
    e["timeline_semaphore_fd_export"] = d.timeline_fd_export;
    vk.append(e);
  }
  out["vulkan_devices"] = vk;
  py::list cu;
  py::list matrix;
#if LAVAFLOW_PY_CUDA
  if (auto c = cuda::devices()) {
    for (const auto& d : *c) {
      py::dict e;
      e["ordinal"] = d.ordinal;
      e["name"] = d.name;
      e["device_uuid"] = to_string(d.uuid);
      e["compute_capability"] = py::make_tuple(d.compute_major, d.compute_minor);
      e["memory_bytes"] = d.memory_bytes;
      e["timeline_semaphore_interop"] = d.timeline_semaphore_interop;
      e["mps"] = d.mps;
      cu.append(e);
    }
  } else {
    out["cuda_error"] = c.error().message();
  }
#else
  out["cuda_error"] = "this lavaflow was built without CUDA";
#endif
  // The interop matrix: for each Vulkan device, whether its memory reaches another process
  // (fd export and import) and CUDA (a CUDA device of the same UUID).
  for (const auto& d : devices) {
    py::dict row;
    row["from"] = "vulkan:" + d.identity.name;
    row["to"] = "process";
    row["ok"] = d.memory_fd_export && d.memory_fd_import;
    matrix.append(row);
    py::dict cuda_row;
    cuda_row["from"] = "vulkan:" + d.identity.name;
    cuda_row["to"] = "cuda";
    bool match = false;
    for (auto c : cu)
      if (c["device_uuid"].cast<std::string>() == to_string(d.identity.device_uuid)) match = true;
    cuda_row["ok"] = match && d.memory_fd_export;
    matrix.append(cuda_row);
  }
  out["cuda_devices"] = cu;
  out["interop"] = matrix;
  // The accelerator manager's list: every API's devices matched by UUID.
  auto acc = Accelerators::from(devices);
#if LAVAFLOW_PY_CUDA
  (void)cuda::add_devices(acc);  // its failure is cuda_error above
#endif
  py::list accelerators;
  for (std::size_t i = 0; i < acc.list().size(); ++i) {
    const auto& a = acc.list()[i];
    py::dict e;
    e["name"] = a.name;
    e["uuid"] = a.uuid ? to_string(*a.uuid) : std::string();
    e["type"] = device_type_name(a.type);
    e["memory_bytes"] = a.memory_bytes;
    e["pci_address"] = a.pci_address;
    e["numa_node"] = a.numa_node;
    py::list apis;
    for (const auto& d : a.apis) apis.append(std::string(to_string(d.api)));
    e["apis"] = apis;
    py::list shares;
    for (std::size_t k = 0; k < acc.list().size(); ++k)
      if (auto how = acc.share(i, k); !how.empty()) shares.append(py::make_tuple(k, how));
    e["shares_memory_with"] = shares;
    accelerators.append(e);
  }
  out["accelerators"] = accelerators;
  return out;
}

py::dict message_info_dict(const MessageInfo& i) {
  py::dict d;
  d["size"] = i.size;
  d["tag"] = i.user_tag;
  d["sequence"] = i.sequence;
  d["timestamp_ns"] = i.timestamp_ns;
  return d;
}

}  // namespace

PYBIND11_MODULE(_lavaflow, m) {
  m.doc() = "lava-flow: zero-copy buffers between processes, into NumPy, PyTorch and CuPy";
  m.attr("__version__") = LAVAFLOW_PY_VERSION;
  m.attr("cuda_built") = bool(LAVAFLOW_PY_CUDA);

  auto& classes = error_classes();
  classes.base = PyErr_NewExceptionWithDoc("lavaflow.Error", "A lava-flow failure: the call and its cause.",
                                           PyExc_RuntimeError, nullptr);
  m.add_object("Error", py::handle(classes.base).inc_ref());
  for (const auto& [code, name] : kErrorNames) {
    PyObject* bases = classes.base;
    py::tuple extra;
    if (code == Errc::Timeout) extra = py::make_tuple(py::handle(classes.base), py::handle(PyExc_TimeoutError));
    if (code == Errc::InvalidArgument) extra = py::make_tuple(py::handle(classes.base), py::handle(PyExc_ValueError));
    if (code == Errc::PermissionDenied)
      extra = py::make_tuple(py::handle(classes.base), py::handle(PyExc_PermissionError));
    if (!extra.empty()) bases = extra.ptr();
    PyObject* cls = PyErr_NewException((std::string("lavaflow.") + name).c_str(), bases, nullptr);
    classes.by_code[static_cast<std::size_t>(code)] = cls;
    m.add_object(name, py::handle(cls).inc_ref());
  }
  classes.closed = PyErr_NewExceptionWithDoc(
      "lavaflow.Closed", "The producer, consumer, loan or message was closed or released.", classes.base, nullptr);
  m.add_object("Closed", py::handle(classes.closed).inc_ref());

  // ---- Loan
  py::class_<PyLoan> loan(m, "Loan", py::buffer_protocol(),
                          "A free ring buffer to write; published when its `with` block ends without an exception.");
  install_buffer_protocol<PyLoan>(loan);
  loan.def_property(
          "size", [](PyLoan& l) { return l.size ? l.size : l.ex.bytes; },
          [](PyLoan& l, std::uint64_t s) {
            if (s > l.ex.bytes) throw py::value_error("size is larger than the slot");
            l.size = s;
          },
          "bytes to publish (default: the whole slot)")
      .def_property(
          "tag", [](PyLoan& l) { return l.tag; }, [](PyLoan& l, std::uint64_t t) { l.tag = t; }, "user tag")
      .def_property_readonly("capacity", [](PyLoan& l) { return l.ex.bytes; })
      .def_property_readonly("sequence", [](PyLoan& l) { return l.live().sequence(); })
      .def_property_readonly("published", [](PyLoan& l) { return l.published.has_value(); })
      .def_property_readonly("views", [](PyLoan& l) { return l.ex.exports; })
      .def_property_readonly("data_ptr", [](PyLoan& l) { return reinterpret_cast<std::uintptr_t>(l.ex.place.data); })
      .def_property_readonly("__array_interface__",
                             [](PyLoan& l) {
                               (void)l.live();
                               return array_interface(l.ex, l.ex.bytes);
                             })
      .def(
          "__dlpack__",
          [](py::object self, py::object stream, py::object max_version, py::object dl_device, py::object copy) {
            auto& l = self.cast<PyLoan&>();
            (void)l.live();
            return to_dlpack(self, l.ex, DlpackOwner::Kind::Loan, stream, max_version, dl_device, copy,
                             [&](std::uintptr_t s) {
#if LAVAFLOW_PY_CUDA
                               l.ex.stream = reinterpret_cast<cudaStream_t>(s);
                               if (l.box->cuda) check(l.box->cuda->imports.wait(*l.ex.stream, *l.loan));
#else
              (void)s;
#endif
                             });
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](PyLoan& l) { return dlpack_device(l.ex); })
      .def(
          "publish",
          [](PyLoan& l, std::optional<std::uint64_t> size, std::optional<std::uint64_t> tag,
             std::optional<std::uintptr_t> stream) { return message_info_dict(l.publish(size, tag, stream)); },
          py::arg("size") = py::none(), py::arg("tag") = py::none(), py::arg("stream") = py::none(),
          "Publishes the loan to every consumer; `stream`: the CUDA stream whose work wrote it.")
      .def("give_back", &PyLoan::give_back, "Returns the slot unpublished.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyLoan& l, py::object type, py::object, py::object) {
        if (!l.loan) return false;
        if (type.is_none())
          l.publish(std::nullopt, std::nullopt, std::nullopt);
        else
          l.give_back();
        return false;
      });

  // ---- Producer
  py::class_<PyProducer>(m, "Producer", "The producing end of channel `name`.")
      .def(py::init([](const std::string& name, std::uint32_t slots, std::uint64_t slot_size,
                       std::uint32_t max_consumers, const std::string& policy, const std::string& wait,
                       const std::optional<std::string>& transport, bool timestamps,
                       const std::optional<std::string>& directory, const std::string& device) {
             ProducerOptions o;
             o.slots = slots;
             o.slot_size = slot_size;
             o.max_consumers = max_consumers;
             o.policy = policy_of(policy);
             o.wait = wait_of(wait);
             if (transport) o.transport = take(parse_transport(*transport));
             o.timestamps = timestamps;
             if (directory) o.directory = *directory;
             auto box = std::make_shared<ProducerBox>();
             box->want = want_of(device);
             box->producer = take(Producer::create(name, o));
             return PyProducer{std::move(box)};
           }),
           py::arg("name"), py::kw_only(), py::arg("slots") = 0, py::arg("slot_size") = 1 << 20,
           py::arg("max_consumers") = 16, py::arg("policy") = "block", py::arg("wait") = "spin_then_block",
           py::arg("transport") = py::none(), py::arg("timestamps") = false, py::arg("directory") = py::none(),
           py::arg("device") = "auto")
      .def(
          "loan",
          [](PyProducer& p, std::optional<double> timeout) {
            auto box = p.live().producer ? p.box : nullptr;
            auto l = take(blocking(timeout_of(timeout, "loan"), [&](Duration t) { return box->producer->loan(t); }));
            PyLoan out;
            out.box = box;
            out.ex.bytes = l.buffer().size();
            out.ex.shape = static_cast<Py_ssize_t>(out.ex.bytes);
            out.ex.place = place_of(l.buffer(), box->want, box->cuda, l, box->producer->vulkan());
            out.loan.emplace(std::move(l));
            return out;
          },
          py::arg("timeout") = py::none(), "A free ring buffer; waits at most `timeout` seconds (None: no bound).")
      .def(
          "wait_for_consumers",
          [](PyProducer& p, std::uint32_t n, std::optional<double> timeout) {
            auto box = p.box;
            (void)p.live();
            check(blocking(timeout_of(timeout, "wait_for_consumers"),
                           [&](Duration t) { return box->producer->wait_for_consumers(n, t); }));
          },
          py::arg("count") = 1, py::arg("timeout") = py::none())
      .def(
          "flush",
          [](PyProducer& p, std::optional<double> timeout) {
            auto box = p.box;
            (void)p.live();
            check(blocking(timeout_of(timeout, "flush"), [&](Duration t) { return box->producer->flush(t); }));
          },
          py::arg("timeout") = py::none(), "Waits until every consumer released every published message.")
      .def("close", &PyProducer::close,
           "Ends the channel: consumers see PeerLost after what was published. Views of its buffers stay valid.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyProducer& p, py::object, py::object, py::object) {
             p.close();
             return false;
           })
      .def_property_readonly("name", [](PyProducer& p) { return p.live().producer->name(); })
      .def_property_readonly("route",
                             [](PyProducer& p) {
                               const auto& r = p.live().producer->route();
                               return py::make_tuple(std::string(to_string(r.transport)), r.reason);
                             })
      .def_property_readonly("slots", [](PyProducer& p) { return p.live().producer->slots(); })
      .def_property_readonly("slot_size", [](PyProducer& p) { return p.live().producer->slot_size(); })
      .def_property_readonly("consumer_count", [](PyProducer& p) { return p.live().producer->consumer_count(); })
      .def_property_readonly("closed", [](PyProducer& p) { return !p.box; });

  // ---- Message
  py::class_<PyMessage> message(m, "Message", py::buffer_protocol(),
                                "A received message; released when its `with` block ends, at release(), or when "
                                "it and every view of it are gone.");
  install_buffer_protocol<PyMessage>(message);
  message.def_property_readonly("size", [](PyMessage& msg) { return msg.info.size; })
      .def_property_readonly("tag", [](PyMessage& msg) { return msg.info.user_tag; })
      .def_property_readonly("sequence", [](PyMessage& msg) { return msg.info.sequence; })
      .def_property_readonly("timestamp_ns", [](PyMessage& msg) { return msg.info.timestamp_ns; })
      .def_property_readonly("missed", [](PyMessage& msg) { return msg.missed; })
      .def_property_readonly("info", [](PyMessage& msg) { return message_info_dict(msg.info); })
      .def_property_readonly("released", [](PyMessage& msg) { return !msg.message || msg.release_asked; })
      .def_property_readonly(
          "views", [](PyMessage& msg) { return msg.ex.exports; },
          "live buffer-protocol views and DLPack capsules of the message")
      .def_property_readonly("data_ptr",
                             [](PyMessage& msg) { return reinterpret_cast<std::uintptr_t>(msg.ex.place.data); })
      .def_property_readonly("__array_interface__",
                             [](PyMessage& msg) {
                               msg.check_live();
                               return array_interface(msg.ex, msg.ex.bytes);
                             })
      .def(
          "__dlpack__",
          [](py::object self, py::object stream, py::object max_version, py::object dl_device, py::object copy) {
            auto& msg = self.cast<PyMessage&>();
            msg.check_live();
            return to_dlpack(self, msg.ex, DlpackOwner::Kind::Message, stream, max_version, dl_device, copy,
                             [&](std::uintptr_t s) {
#if LAVAFLOW_PY_CUDA
                               msg.ex.stream = reinterpret_cast<cudaStream_t>(s);
                               if (msg.box->cuda) check(msg.box->cuda->imports.wait(*msg.ex.stream, *msg.message));
#else
              (void)s;
#endif
                             });
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](PyMessage& msg) { return dlpack_device(msg.ex); })
      .def(
          "release",
          [](PyMessage& msg) {
            msg.release_asked = true;
            msg.end();
          },
          "Gives the slot back to the producer; views of the message stay mapped but may see later messages.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyMessage& msg, py::object, py::object, py::object) {
        msg.release_asked = true;
        msg.end();
        return false;
      });

  // ---- Consumer
  auto receive = [](PyConsumer& c, std::optional<double> timeout) {
    auto box = c.box;
    (void)c.live();
    auto r = take(blocking(timeout_of(timeout, "receive"), [&](Duration t) { return box->consumer->receive(t); }));
    PyMessage out;
    out.box = box;
    out.info = r.info();
    out.missed = r.missed();
    out.ex.bytes = r.info().size;
    out.ex.shape = static_cast<Py_ssize_t>(out.ex.bytes);
    out.ex.place = place_of(r.buffer(), box->want, box->cuda, r, box->consumer->vulkan());
    out.message.emplace(std::move(r));
    return out;
  };
  py::class_<PyConsumer>(m, "Consumer",
                         "A consuming end of channel `name`; iterating it receives until the producer is gone.")
      .def(py::init([](const std::string& name, const std::string& wait, double connect_timeout, bool host_wait_for_gpu,
                       const std::optional<std::string>& directory, const std::string& device) {
             ConsumerOptions o;
             o.wait = wait_of(wait);
             o.connect_timeout = timeout_of(connect_timeout, "connect_timeout");
             o.host_wait_for_gpu = host_wait_for_gpu;
             if (directory) o.directory = *directory;
             auto box = std::make_shared<ConsumerBox>();
             box->want = want_of(device);
             {
               py::gil_scoped_release unlocked;
               auto c = Consumer::open(name, o);
               if (c)
                 box->consumer = std::move(*c);
               else {
                 py::gil_scoped_acquire locked;
                 raise(c.error());
               }
             }
             return PyConsumer{std::move(box)};
           }),
           py::arg("name"), py::kw_only(), py::arg("wait") = "spin_then_block", py::arg("connect_timeout") = 10.0,
           py::arg("host_wait_for_gpu") = true, py::arg("directory") = py::none(), py::arg("device") = "auto")
      .def("receive", receive, py::arg("timeout") = py::none(),
           "The next message; waits at most `timeout` seconds (None: no bound). PeerLost once the producer is gone "
           "and everything it published was received.")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__",
           [receive](PyConsumer& c) {
             try {
               return receive(c, std::nullopt);
             } catch (py::error_already_set& e) {
               if (e.matches(error_classes().by_code[static_cast<std::size_t>(Errc::PeerLost)]))
                 throw py::stop_iteration();
               throw;
             }
           })
      .def("close", &PyConsumer::close,
           "Hangs up: the producer stops waiting for this consumer. Views of its messages stay valid.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyConsumer& c, py::object, py::object, py::object) {
             c.close();
             return false;
           })
      .def_property_readonly("producer_pid", [](PyConsumer& c) { return c.live().consumer->producer_pid(); })
      .def_property_readonly("route",
                             [](PyConsumer& c) {
                               const auto& r = c.live().consumer->route();
                               return py::make_tuple(std::string(to_string(r.transport)), r.reason);
                             })
      .def_property_readonly("slots", [](PyConsumer& c) { return c.live().consumer->slots(); })
      .def_property_readonly("slot_size", [](PyConsumer& c) { return c.live().consumer->slot_size(); })
      .def_property_readonly("closed", [](PyConsumer& c) { return !c.box; });

  // ---- Pool
  py::class_<PyPooled> pooled(m, "PooledBuffer", py::buffer_protocol(),
                              "A buffer rented from a Pool (buffer protocol, __array_interface__, DLPack).");
  install_buffer_protocol<PyPooled>(pooled);
  pooled.def_property_readonly("size", [](PyPooled& b) { return b.live().size(); })
      .def_property_readonly("capacity", [](PyPooled& b) { return b.live().capacity(); })
      .def_property_readonly("kind", [](PyPooled& b) { return std::string(to_string(b.live().kind())); })
      .def_property_readonly("data_ptr", [](PyPooled& b) { return reinterpret_cast<std::uintptr_t>(b.ex.place.data); })
      .def_property_readonly("views", [](PyPooled& b) { return b.ex.exports; })
      .def_property_readonly("released", [](PyPooled& b) { return !b.buffer || b.release_asked; })
      .def_property_readonly("__array_interface__",
                             [](PyPooled& b) {
                               (void)b.live();
                               return array_interface(b.ex, b.ex.bytes);
                             })
      .def(
          "__dlpack__",
          [](py::object self, py::object stream, py::object max_version, py::object dl_device, py::object copy) {
            auto& b = self.cast<PyPooled&>();
            (void)b.live();
            return to_dlpack(self, b.ex, DlpackOwner::Kind::Pooled, stream, max_version, dl_device, copy,
                             [](std::uintptr_t) {});
          },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](PyPooled& b) { return dlpack_device(b.ex); })
      .def(
          "release",
          [](PyPooled& b) {
            b.release_asked = true;
            b.unpin();
          },
          "Returns the buffer to its pool once no view of it remains.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyPooled& b, py::object, py::object, py::object) {
        b.release_asked = true;
        b.unpin();
        return false;
      });

  py::class_<PyPool>(m, "Pool", "A memory pool: host (and with vulkan=True, GPU) buffers rented from cached segments.")
      .def(py::init([](bool vulkan, std::uint64_t segment_bytes, std::optional<std::uint64_t> max_cached_bytes) {
             PoolOptions o;
             if (vulkan) o.vulkan = take(VulkanContext::create());
             if (segment_bytes) o.segment_bytes = segment_bytes;
             if (max_cached_bytes) o.max_cached_bytes = *max_cached_bytes;
             return PyPool{std::make_shared<MemoryPool>(take(MemoryPool::create(std::move(o))))};
           }),
           py::kw_only(), py::arg("vulkan") = false, py::arg("segment_bytes") = 0,
           py::arg("max_cached_bytes") = py::none())
      .def(
          "rent",
          [](PyPool& p, std::uint64_t size, const std::string& kind) {
            auto b = take(p.live().rent(size, buffer_kind_of(kind)));
            if (!b.host_ptr())
              raise(Error(Errc::Unsupported, "Pool.rent", "device-local GPU memory has no host view here"));
            PyPooled out;
            out.pool = p.pool;
            out.ex.bytes = b.size();
            out.ex.shape = static_cast<Py_ssize_t>(b.size());
            out.ex.place = {b.host_ptr(), {dl::kCPU, 0}};
            out.buffer.emplace(std::move(b));
            return out;
          },
          py::arg("size"), py::arg("kind") = "cpu-shared")
      .def(
          "trim", [](PyPool& p) { p.live().trim(); }, "Frees the cached memory no buffer uses.")
      .def(
          "stats", [](PyPool& p) { return py::module_::import("json").attr("loads")(p.live().stats().to_json()); },
          "Statistics with PyTorch's memory_stats() keys.")
      .def("close", [](PyPool& p) { p.pool.reset(); });

  m.def("info", &info, py::arg("pool") = py::none(),
        "The accelerators of this machine and what can share memory with what, as dicts (with a pool's "
        "statistics when given one).");
}
