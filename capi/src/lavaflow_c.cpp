// SPDX-License-Identifier: MIT
// The C API over the C++ library: each handle owns one C++ object, each call translates an
// lf_status from the Result it got, and every C++ exception stops at this boundary.
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <variant>

#include "lavaflow/lavaflow.h"
#include "lavaflow/lavaflow.hpp"
#include "lavaflow/mesh/launch.hpp"
#if LAVAFLOW_C_CUDA
#include "lavaflow/cuda/cuda.hpp"
#endif

using namespace lavaflow;

struct lf_context {
  VulkanContext ctx;
};
/// A buffer the caller owns, or a borrowed view of a loan's or message's ring buffer (which
/// lf_buffer_destroy leaves alone).
struct lf_buffer {
  std::variant<std::monostate, CpuBuffer, GpuBuffer, PooledBuffer> owned;
  Buffer* view = nullptr;
  template <class B>
  static lf_buffer* own(B&& b) {
    auto* out = new lf_buffer{std::forward<B>(b), nullptr};
    out->view = &std::get<std::decay_t<B>>(out->owned);
    return out;
  }
  [[nodiscard]] Buffer& get() const { return *view; }
};
struct lf_pool {
  MemoryPool pool;
};
struct lf_producer {
  std::unique_ptr<Producer> producer;
};
struct lf_consumer {
  std::unique_ptr<Consumer> consumer;
};
/// A loan or a message also offers its ring buffer as an lf_buffer view (not owned).
struct lf_loan {
  Loan loan;
  lf_buffer view{std::monostate{}, &loan.buffer()};
};
struct lf_message {
  Received message;
  lf_buffer view{std::monostate{}, &message.buffer()};
};

namespace {

// The message of the last failure, per thread: the one piece of state the C convention needs.
thread_local std::string t_last_error;

lf_status status_of(Errc code) { return static_cast<lf_status>(static_cast<int>(code) + 1); }

lf_status record(const Error& e) {
  t_last_error = e.message();
  return status_of(e.code());
}

lf_status invalid(const char* call, const char* cause) { return record(Error(Errc::InvalidArgument, call, cause)); }

/// Runs `body` (returning lf_status) with every exception turned into a status.
template <class F>
lf_status guarded(const char* call, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return record(Error(Errc::OutOfMemory, call, "out of host memory"));
  } catch (const std::exception& e) {
    return record(Error(Errc::Internal, call, e.what()));
  } catch (...) {
    return record(Error(Errc::Internal, call, "unknown exception"));
  }
}

/// Options structs are read up to the size the caller compiled against (older callers pass a
/// prefix); anything not given keeps the library's default.
template <class T>
bool options_ok(const T* options, std::size_t first_field_end) {
  return options == nullptr || options->struct_size >= first_field_end;
}

Duration duration_of(std::int64_t ns) {
  return ns < 0 ? kForever : std::chrono::duration_cast<Duration>(std::chrono::nanoseconds(ns));
}

/// An enum argument's value without loading it as the enum: a C caller may pass any int, and a
/// value outside a C++ enum's range is undefined behaviour once read as that enum.
template <class E>
int raw(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<int>(v);
}

std::optional<BufferKind> kind_of_c(int k) {
  switch (k) {
    case LF_GPU_DEVICE_LOCAL:
    case LF_GPU_HOST_VISIBLE:
    case LF_CPU_SHARED:
    case LF_CPU_NUMA:
    case LF_CPU_HUGE_PAGES:
    case LF_CPU_GPU_PINNED:
      return static_cast<BufferKind>(k);
  }
  return std::nullopt;
}

lf_message_info info_of(const MessageInfo& i, std::uint64_t missed) {
  return {i.size, i.user_tag, i.timestamp_ns, i.sequence, missed};
}

}  // namespace

extern "C" {

void lf_version(int* major, int* minor, int* patch) {
  if (major) *major = LAVAFLOW_VERSION_MAJOR;
  if (minor) *minor = LAVAFLOW_VERSION_MINOR;
  if (patch) *patch = LAVAFLOW_VERSION_PATCH;
}
int lf_abi_version(void) { return LAVAFLOW_C_ABI_VERSION; }

const char* lf_status_name(lf_status status) {
  static constexpr const char* names[] = {
      "LF_OK",          "LF_INVALID_ARGUMENT",  "LF_MALFORMED",   "LF_VERSION_MISMATCH", "LF_DEVICE_MISMATCH",
      "LF_UNSUPPORTED", "LF_OUT_OF_MEMORY",     "LF_NOT_FOUND",   "LF_TIMEOUT",          "LF_WOULD_BLOCK",
      "LF_PEER_LOST",   "LF_PERMISSION_DENIED", "LF_UNREACHABLE", "LF_SYSTEM",           "LF_DRIVER",
      "LF_INTERNAL"};
  const auto i = raw(status);
  return i >= 0 && i < static_cast<int>(std::size(names)) ? names[i] : "unknown";
}

const char* lf_last_error(void) { return t_last_error.c_str(); }

// ---- context

lf_status lf_context_create(const lf_context_options* options, lf_context** out) {
  return guarded("lf_context_create", [&] {
    if (!out) return invalid("lf_context_create", "out is NULL");
    if (!options_ok(options, offsetof(lf_context_options, device_index) + sizeof(int32_t)))
      return invalid("lf_context_create", "options->struct_size too small");
    VulkanContextOptions o;
    if (options && options->device_index >= 0) o.device = static_cast<std::uint32_t>(options->device_index);
    auto ctx = VulkanContext::create(o);
    if (!ctx) return record(ctx.error());
    *out = new lf_context{std::move(*ctx)};
    return LF_OK;
  });
}
void lf_context_destroy(lf_context* context) { delete context; }
const char* lf_context_device_name(const lf_context* context) {
  return context ? context->ctx.capabilities().identity.name.c_str() : "";
}

// ---- buffers

lf_status lf_buffer_allocate(lf_context* context, lf_buffer_kind kind, uint64_t size, lf_buffer** out) {
  constexpr const char* call = "lf_buffer_allocate";
  return guarded(call, [&] {
    if (!out) return invalid(call, "out is NULL");
    const auto k = kind_of_c(raw(kind));
    if (!k) return invalid(call, "unknown buffer kind");
    if ((is_gpu(*k) || *k == BufferKind::CpuGpuPinned) && !context)
      return invalid(call, "GPU kinds and CPU_GPU_PINNED need a context");
    if (is_gpu(*k)) {
      auto b = GpuBuffer::allocate(
          context->ctx,
          {.size = size, .memory = *k == BufferKind::GpuDeviceLocal ? GpuMemory::DeviceLocal : GpuMemory::HostVisible});
      if (!b) return record(b.error());
      *out = lf_buffer::own(std::move(*b));
      return LF_OK;
    }
    auto b = CpuBuffer::allocate(
        {.size = size, .strategy = strategy_of(*k), .gpu = context ? &context->ctx : nullptr, .strict = true});
    if (!b) return record(b.error());
    *out = lf_buffer::own(std::move(*b));
    return LF_OK;
  });
}

lf_status lf_buffer_import(lf_context* context, const lf_descriptor* descriptor, int fd, lf_buffer** out) {
  constexpr const char* call = "lf_buffer_import";
  return guarded(call, [&] {
    if (!out || !descriptor) return invalid(call, "out or descriptor is NULL");
    if (fd < 0) return invalid(call, "fd is negative");
    static_assert(ExportDescriptor::kSerializedSize <= LF_DESCRIPTOR_BYTES);
    auto d =
        ExportDescriptor::deserialize(std::as_bytes(std::span(descriptor->bytes, ExportDescriptor::kSerializedSize)));
    if (!d) return record(d.error());
    // The fd stays the caller's on failure: the import consumes a duplicate.
    UniqueFd mine(::dup(fd));
    if (!mine) return record(from_errno(errno, "dup"));
    if (is_gpu(d->kind)) {
      if (!context) return invalid(call, "a GPU buffer needs a context to import into");
      auto b = GpuBuffer::import(context->ctx, *d, std::move(mine));
      if (!b) return record(b.error());
      *out = lf_buffer::own(std::move(*b));
    } else {
      auto b = CpuBuffer::import(*d, std::move(mine));
      if (!b) return record(b.error());
      *out = lf_buffer::own(std::move(*b));
    }
    ::close(fd);
    return LF_OK;
  });
}

void lf_buffer_destroy(lf_buffer* buffer) {
  if (buffer && !std::holds_alternative<std::monostate>(buffer->owned)) delete buffer;
}
uint64_t lf_buffer_size(const lf_buffer* buffer) { return buffer ? buffer->get().size() : 0; }
lf_buffer_kind lf_buffer_get_kind(const lf_buffer* buffer) {
  return buffer ? static_cast<lf_buffer_kind>(buffer->get().kind()) : LF_CPU_SHARED;
}
void* lf_buffer_data(const lf_buffer* buffer) { return buffer ? buffer->get().host_ptr() : nullptr; }

lf_status lf_buffer_export(const lf_buffer* buffer, lf_descriptor* descriptor, int* fd) {
  constexpr const char* call = "lf_buffer_export";
  return guarded(call, [&] {
    if (!buffer || !descriptor || !fd) return invalid(call, "buffer, descriptor or fd is NULL");
    auto e = buffer->get().export_handle();
    if (!e) return record(e.error());
    const auto bytes = e->descriptor.serialize();
    std::memset(descriptor->bytes, 0, sizeof descriptor->bytes);
    std::memcpy(descriptor->bytes, bytes.data(), bytes.size());
    *fd = e->fd.release();
    return LF_OK;
  });
}

// ---- pool

lf_status lf_pool_create(lf_context* context, const lf_pool_options* options, lf_pool** out) {
  constexpr const char* call = "lf_pool_create";
  return guarded(call, [&] {
    if (!out) return invalid(call, "out is NULL");
    if (!options_ok(options, offsetof(lf_pool_options, max_cached_bytes) + sizeof(uint64_t)))
      return invalid(call, "options->struct_size too small");
    PoolOptions o;
    if (context) o.vulkan = context->ctx;
    if (options && options->segment_bytes) o.segment_bytes = options->segment_bytes;
    if (options && options->max_cached_bytes) o.max_cached_bytes = options->max_cached_bytes;
    auto p = MemoryPool::create(std::move(o));
    if (!p) return record(p.error());
    *out = new lf_pool{std::move(*p)};
    return LF_OK;
  });
}
void lf_pool_destroy(lf_pool* pool) { delete pool; }

lf_status lf_pool_rent(lf_pool* pool, lf_buffer_kind kind, uint64_t size, lf_buffer** out) {
  constexpr const char* call = "lf_pool_rent";
  return guarded(call, [&] {
    if (!pool || !out) return invalid(call, "pool or out is NULL");
    const auto k = kind_of_c(raw(kind));
    if (!k) return invalid(call, "unknown buffer kind");
    auto b = pool->pool.rent(size, *k);
    if (!b) return record(b.error());
    *out = lf_buffer::own(std::move(*b));
    return LF_OK;
  });
}
void lf_pool_trim(lf_pool* pool) {
  if (pool) pool->pool.trim();
}

lf_status lf_pool_stats_json(const lf_pool* pool, char* buffer, size_t capacity, size_t* needed) {
  constexpr const char* call = "lf_pool_stats_json";
  return guarded(call, [&] {
    if (!pool) return invalid(call, "pool is NULL");
    const std::string json = pool->pool.stats().to_json();
    if (needed) *needed = json.size() + 1;
    if (!buffer || capacity < json.size() + 1) return invalid(call, "buffer too small for the statistics");
    std::memcpy(buffer, json.c_str(), json.size() + 1);
    return LF_OK;
  });
}

// ---- channels

namespace {

std::optional<WaitMode> wait_of(int w) {
  switch (w) {
    case LF_WAIT_SPIN_THEN_BLOCK:
      return WaitMode::SpinThenBlock;
    case LF_WAIT_BUSY_POLL:
      return WaitMode::BusyPoll;
    case LF_WAIT_BLOCK:
      return WaitMode::Block;
  }
  return std::nullopt;
}

}  // namespace

lf_status lf_producer_create(const char* name, const lf_producer_options* options, lf_producer** out) {
  constexpr const char* call = "lf_producer_create";
  return guarded(call, [&] {
    if (!name || !out) return invalid(call, "name or out is NULL");
    if (!options_ok(options, offsetof(lf_producer_options, directory) + sizeof(const char*)))
      return invalid(call, "options->struct_size too small");
    const lf_producer_options defaults = LF_PRODUCER_OPTIONS_INIT;
    const lf_producer_options& in = options ? *options : defaults;
    ProducerOptions o;
    o.slots = in.slots;
    o.slot_size = in.slot_size;
    o.max_consumers = in.max_consumers;
    switch (raw(in.policy)) {
      case LF_FULL_BLOCK:
        o.policy = FullPolicy::Block;
        break;
      case LF_FULL_DROP_OLDEST:
        o.policy = FullPolicy::DropOldest;
        break;
      case LF_FULL_FAIL_FAST:
        o.policy = FullPolicy::FailFast;
        break;
      default:
        return invalid(call, "unknown full policy");
    }
    const auto w = wait_of(raw(in.wait));
    if (!w) return invalid(call, "unknown wait mode");
    o.wait = *w;
    switch (raw(in.transport)) {
      case LF_TRANSPORT_AUTO:
        break;
      case LF_TRANSPORT_SHM:
        o.transport = TransportKind::Shm;
        break;
      case LF_TRANSPORT_VULKAN:
        o.transport = TransportKind::Vulkan;
        break;
      default:
        return invalid(call, "unknown transport");
    }
    o.timestamps = in.timestamps != 0;
    if (in.context) o.vulkan = &in.context->ctx;
    if (in.directory) o.directory = in.directory;
    auto p = Producer::create(name, o);
    if (!p) return record(p.error());
    *out = new lf_producer{std::move(*p)};
    return LF_OK;
  });
}
void lf_producer_destroy(lf_producer* producer) { delete producer; }

lf_status lf_producer_wait_for_consumers(lf_producer* producer, uint32_t count, int64_t timeout_ns) {
  constexpr const char* call = "lf_producer_wait_for_consumers";
  return guarded(call, [&] {
    if (!producer) return invalid(call, "producer is NULL");
    auto s = producer->producer->wait_for_consumers(count, duration_of(timeout_ns));
    return s ? LF_OK : record(s.error());
  });
}
uint32_t lf_producer_consumer_count(const lf_producer* producer) {
  return producer ? producer->producer->consumer_count() : 0;
}
uint64_t lf_producer_slot_size(const lf_producer* producer) { return producer ? producer->producer->slot_size() : 0; }
const char* lf_producer_route(const lf_producer* producer, const char** reason) {
  if (!producer) return "";
  const auto& r = producer->producer->route();
  if (reason) *reason = r.reason.c_str();
  return to_string(r.transport).data();
}

lf_status lf_producer_flush(lf_producer* producer, int64_t timeout_ns) {
  constexpr const char* call = "lf_producer_flush";
  return guarded(call, [&] {
    if (!producer) return invalid(call, "producer is NULL");
    auto s = producer->producer->flush(duration_of(timeout_ns));
    return s ? LF_OK : record(s.error());
  });
}

lf_status lf_producer_loan(lf_producer* producer, int64_t timeout_ns, lf_loan** out) {
  constexpr const char* call = "lf_producer_loan";
  return guarded(call, [&] {
    if (!producer || !out) return invalid(call, "producer or out is NULL");
    auto l = timeout_ns == 0 ? producer->producer->try_loan() : producer->producer->loan(duration_of(timeout_ns));
    if (!l) return record(l.error());
    *out = new lf_loan{std::move(*l)};
    return LF_OK;
  });
}
void* lf_loan_data(const lf_loan* loan) { return loan ? loan->loan.bytes().data() : nullptr; }
uint64_t lf_loan_size(const lf_loan* loan) { return loan ? loan->loan.buffer().size() : 0; }
const lf_buffer* lf_loan_buffer(const lf_loan* loan) { return loan ? &loan->view : nullptr; }

lf_status lf_producer_publish(lf_producer* producer, lf_loan* loan, uint64_t size, uint64_t user_tag,
                              lf_message_info* info) {
  constexpr const char* call = "lf_producer_publish";
  std::unique_ptr<lf_loan> owned(loan);
  return guarded(call, [&] {
    if (!producer || !owned) return invalid(call, "producer or loan is NULL");
    auto m = producer->producer->publish(std::move(owned->loan), {.size = size, .user_tag = user_tag});
    if (!m) return record(m.error());
    if (info) *info = info_of(*m, 0);
    return LF_OK;
  });
}
void lf_loan_destroy(lf_loan* loan) { delete loan; }

lf_status lf_consumer_open(const char* name, const lf_consumer_options* options, lf_consumer** out) {
  constexpr const char* call = "lf_consumer_open";
  return guarded(call, [&] {
    if (!name || !out) return invalid(call, "name or out is NULL");
    if (!options_ok(options, offsetof(lf_consumer_options, directory) + sizeof(const char*)))
      return invalid(call, "options->struct_size too small");
    const lf_consumer_options defaults = LF_CONSUMER_OPTIONS_INIT;
    const lf_consumer_options& in = options ? *options : defaults;
    ConsumerOptions o;
    const auto w = wait_of(raw(in.wait));
    if (!w) return invalid(call, "unknown wait mode");
    o.wait = *w;
    if (in.connect_timeout_ns < 0) return invalid(call, "connect_timeout_ns is negative");
    o.connect_timeout = duration_of(in.connect_timeout_ns);
    o.host_wait_for_gpu = in.host_wait_for_gpu != 0;
    if (in.context) o.vulkan = &in.context->ctx;
    if (in.directory) o.directory = in.directory;
    auto c = Consumer::open(name, o);
    if (!c) return record(c.error());
    *out = new lf_consumer{std::move(*c)};
    return LF_OK;
  });
}
void lf_consumer_destroy(lf_consumer* consumer) { delete consumer; }

lf_status lf_consumer_receive(lf_consumer* consumer, int64_t timeout_ns, lf_message** out) {
  constexpr const char* call = "lf_consumer_receive";
  return guarded(call, [&] {
    if (!consumer || !out) return invalid(call, "consumer or out is NULL");
    auto r = timeout_ns == 0 ? consumer->consumer->try_receive() : consumer->consumer->receive(duration_of(timeout_ns));
    if (!r) return record(r.error());
    *out = new lf_message{std::move(*r)};
    return LF_OK;
  });
}
int32_t lf_consumer_producer_pid(const lf_consumer* consumer) {
  return consumer ? consumer->consumer->producer_pid() : 0;
}
const void* lf_message_data(const lf_message* message) { return message ? message->message.bytes().data() : nullptr; }
uint64_t lf_message_size(const lf_message* message) { return message ? message->message.info().size : 0; }
void lf_message_info_get(const lf_message* message, lf_message_info* info) {
  if (message && info) *info = info_of(message->message.info(), message->message.missed());
}
const lf_buffer* lf_message_buffer(const lf_message* message) { return message ? &message->view : nullptr; }
void lf_message_release(lf_message* message) { delete message; }

}  // extern "C"

// ---- collectives

struct lf_communicator {
  std::unique_ptr<mesh::Communicator> comm;
};

namespace {

std::optional<mesh::DType> dtype_of(int t) {
  if (t < LF_F32 || t > LF_U8) return std::nullopt;
  return static_cast<mesh::DType>(t);
}
std::optional<mesh::ReduceOp> op_of(int op) {
  if (op < LF_SUM || op > LF_AVERAGE) return std::nullopt;
  return static_cast<mesh::ReduceOp>(op);
}

/// Checks the handle, type and element count, then runs one collective and waits for it.
template <class F>
lf_status collective(const char* call, lf_communicator* c, int type, std::size_t count, bool has_buffers,
                     std::int64_t timeout_ns, F&& start) {
  return guarded(call, [&] {
    if (!c) return invalid(call, "communicator is NULL");
    if (!has_buffers && count != 0) return invalid(call, "a buffer is NULL");
    const auto t = dtype_of(type);
    if (!t) return invalid(call, "unknown element type");
    const std::size_t element = mesh::size_of(*t);
    if (count > SIZE_MAX / element / std::max<std::size_t>(1, c->comm->size()))
      return invalid(call, "count too large for this group");
    const mesh::CallOptions o{.timeout = duration_of(timeout_ns)};
    auto s = start(*t, count * element, o).wait();
    return s ? LF_OK : record(s.error());
  });
}

template <class T>
std::span<T> bytes(T* p, std::size_t n) {
  return {p, p ? n : 0};
}

}  // namespace

extern "C" {

lf_status lf_communicator_open_launched(lf_communicator** out) {
  constexpr const char* call = "lf_communicator_open_launched";
  return guarded(call, [&] {
    if (!out) return invalid(call, "out is NULL");
    auto job = mesh::launched_job();
    if (!job) return record(job.error());
    auto m = mesh::mesh_from_launch(*job);
    if (!m) return record(m.error());
    auto c = m->communicator("world", mesh::launched_communicators(*job));
    if (!c) return record(c.error());
    *out = new lf_communicator{std::move(*c)};
    return LF_OK;
  });
}
void lf_communicator_destroy(lf_communicator* communicator) { delete communicator; }
uint32_t lf_communicator_rank(const lf_communicator* c) { return c ? c->comm->rank() : 0; }
uint32_t lf_communicator_size(const lf_communicator* c) { return c ? c->comm->size() : 0; }

lf_status lf_all_reduce(lf_communicator* c, const void* send, void* recv, size_t count, lf_dtype type, lf_reduce_op op,
                        int64_t timeout_ns) {
  const auto o = op_of(raw(op));
  if (!o) return invalid("lf_all_reduce", "unknown reduction");
  return collective("lf_all_reduce", c, raw(type), count, send && recv, timeout_ns,
                    [&](mesh::DType t, std::size_t n, auto opt) {
                      return c->comm->all_reduce(bytes(static_cast<const std::byte*>(send), n),
                                                 bytes(static_cast<std::byte*>(recv), n), t, *o, opt);
                    });
}
lf_status lf_all_gather(lf_communicator* c, const void* send, void* recv, size_t count, lf_dtype type,
                        int64_t timeout_ns) {
  return collective("lf_all_gather", c, raw(type), count, send && recv, timeout_ns,
                    [&](mesh::DType t, std::size_t n, auto opt) {
                      return c->comm->all_gather(bytes(static_cast<const std::byte*>(send), n),
                                                 bytes(static_cast<std::byte*>(recv), n * c->comm->size()), t, opt);
                    });
}
lf_status lf_broadcast(lf_communicator* c, void* buffer, size_t count, uint32_t root, lf_dtype type,
                       int64_t timeout_ns) {
  return collective("lf_broadcast", c, raw(type), count, buffer != nullptr, timeout_ns,
                    [&](mesh::DType t, std::size_t n, auto opt) {
                      return c->comm->broadcast(bytes(static_cast<std::byte*>(buffer), n), root, t, opt);
                    });
}
lf_status lf_reduce_scatter(lf_communicator* c, const void* send, void* recv, size_t count, lf_dtype type,
                            lf_reduce_op op, int64_t timeout_ns) {
  const auto o = op_of(raw(op));
  if (!o) return invalid("lf_reduce_scatter", "unknown reduction");
  return collective("lf_reduce_scatter", c, raw(type), count, send && recv, timeout_ns,
                    [&](mesh::DType t, std::size_t n, auto opt) {
                      return c->comm->reduce_scatter(bytes(static_cast<const std::byte*>(send), n * c->comm->size()),
                                                     bytes(static_cast<std::byte*>(recv), n), t, *o, opt);
                    });
}
lf_status lf_barrier(lf_communicator* c, int64_t timeout_ns) {
  return collective("lf_barrier", c, LF_U8, 0, true, timeout_ns,
                    [&](mesh::DType, std::size_t, auto opt) { return c->comm->barrier(opt); });
}

// ---- CUDA

#if LAVAFLOW_C_CUDA
struct lf_cuda {
  cuda::Interop interop;
};
struct lf_cuda_buffer {
  cuda::ExternalBuffer mapped;
};

lf_status lf_cuda_create(const lf_context* context, lf_cuda** out) {
  constexpr const char* call = "lf_cuda_create";
  return guarded(call, [&] {
    if (!context || !out) return invalid(call, "context or out is NULL");
    auto i = cuda::Interop::create(context->ctx);
    if (!i) return record(i.error());
    *out = new lf_cuda{std::move(*i)};
    return LF_OK;
  });
}
void lf_cuda_destroy(lf_cuda* cuda) { delete cuda; }
int lf_cuda_device_ordinal(const lf_cuda* cuda) { return cuda ? cuda->interop.device().ordinal : -1; }
lf_status lf_cuda_import(lf_cuda* cuda, const lf_buffer* buffer, lf_cuda_buffer** out) {
  constexpr const char* call = "lf_cuda_import";
  return guarded(call, [&] {
    if (!cuda || !buffer || !out) return invalid(call, "cuda, buffer or out is NULL");
    auto m = cuda->interop.import_buffer(buffer->get());
    if (!m) return record(m.error());
    *out = new lf_cuda_buffer{std::move(*m)};
    return LF_OK;
  });
}
void lf_cuda_buffer_destroy(lf_cuda_buffer* buffer) { delete buffer; }
void* lf_cuda_buffer_pointer(const lf_cuda_buffer* buffer) { return buffer ? buffer->mapped.data() : nullptr; }
#else
lf_status lf_cuda_create(const lf_context*, lf_cuda**) {
  return record(Error(Errc::Unsupported, "lf_cuda_create", "this liblavaflow_c was built without CUDA"));
}
void lf_cuda_destroy(lf_cuda*) {}
int lf_cuda_device_ordinal(const lf_cuda*) { return -1; }
lf_status lf_cuda_import(lf_cuda*, const lf_buffer*, lf_cuda_buffer**) {
  return record(Error(Errc::Unsupported, "lf_cuda_import", "this liblavaflow_c was built without CUDA"));
}
void lf_cuda_buffer_destroy(lf_cuda_buffer*) {}
void* lf_cuda_buffer_pointer(const lf_cuda_buffer*) { return nullptr; }
#endif

}  // extern "C"
