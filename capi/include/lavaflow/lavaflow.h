/* SPDX-License-Identifier: MIT */
#ifndef LAVAFLOW_LAVAFLOW_H
#define LAVAFLOW_LAVAFLOW_H
/**
 * @file
 * The C API of lava-flow (target lavaflow::c, library liblavaflow_c.so): an ABI-stable surface over
 * core memory, the pool, channels and the CUDA adapter, for C, Rust, Julia and other FFI users.
 *
 * Rules that hold for every function:
 * - Objects are opaque handles made by a `*_create`/`*_open`/`*_allocate` call and ended by the
 *   matching `*_destroy`; destroying NULL does nothing.
 * - Fallible calls return an lf_status; on failure the `out` parameters are untouched and
 *   lf_last_error() gives the message (call and cause) of the last failure on the calling thread.
 *   No C++ exception crosses this API.
 * - Options structs start with `struct_size`: set it to sizeof the struct you compiled against
 *   (the LF_*_OPTIONS_INIT macros do) so that later versions can add fields at the end.
 * - File descriptors: a function that takes an fd says whether it consumes it; one that returns an
 *   fd hands its ownership to the caller, who close()s it.
 * - Timeouts are nanoseconds; LF_FOREVER (negative) waits without bound.
 * - Functions of a backend not built into this library (CUDA) are present and report
 *   LF_UNSUPPORTED, so the ABI does not depend on build options.
 */
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(LAVAFLOW_C_BUILDING)
#define LF_API __attribute__((visibility("default")))
#else
#define LF_API
#endif

#define LAVAFLOW_VERSION_MAJOR 0
#define LAVAFLOW_VERSION_MINOR 1
#define LAVAFLOW_VERSION_PATCH 0
/** The ABI version: it changes only when a compiled caller would break. */
#define LAVAFLOW_C_ABI_VERSION 1

/** The library's version at run time (compare with the LAVAFLOW_VERSION_* of the header). */
LF_API void lf_version(int* major, int* minor, int* patch);
LF_API int lf_abi_version(void);

typedef enum lf_status {
  LF_OK = 0,
  LF_INVALID_ARGUMENT = 1, /**< caller passed a bad value */
  LF_MALFORMED = 2,        /**< bytes from outside failed validation */
  LF_VERSION_MISMATCH = 3,
  LF_DEVICE_MISMATCH = 4,
  LF_UNSUPPORTED = 5,
  LF_OUT_OF_MEMORY = 6,
  LF_NOT_FOUND = 7,
  LF_TIMEOUT = 8,
  LF_WOULD_BLOCK = 9,
  LF_PEER_LOST = 10,
  LF_PERMISSION_DENIED = 11,
  LF_UNREACHABLE = 12,
  LF_SYSTEM = 13,
  LF_DRIVER = 14,
  LF_INTERNAL = 15
} lf_status;

/** The status's name ("LF_PEER_LOST"); "unknown" for values outside the enum. Static storage. */
LF_API const char* lf_status_name(lf_status status);
/** The message of the last failure on this thread ("" when none); valid until this thread's next
 * failing call. */
LF_API const char* lf_last_error(void);

#define LF_FOREVER ((int64_t)-1)

/* ------------------------------------------------------------------------------------------ */
/* Vulkan context */

typedef struct lf_context lf_context;

/** A Vulkan instance + device of this machine, the best one (discrete first) or `device_index`. */
typedef struct lf_context_options {
  size_t struct_size;
  int32_t device_index; /**< -1: pick the best device */
} lf_context_options;
#define LF_CONTEXT_OPTIONS_INIT \
  { sizeof(lf_context_options), -1 }

LF_API lf_status lf_context_create(const lf_context_options* options, lf_context** out);
LF_API void lf_context_destroy(lf_context* context);
/** The device's name, e.g. "NVIDIA H100" or "llvmpipe (…)"; valid while the context lives. */
LF_API const char* lf_context_device_name(const lf_context* context);

/* ------------------------------------------------------------------------------------------ */
/* Buffers */

typedef enum lf_buffer_kind {
  LF_GPU_DEVICE_LOCAL = 1,
  LF_GPU_HOST_VISIBLE = 2,
  LF_CPU_SHARED = 3,
  LF_CPU_NUMA = 4,
  LF_CPU_HUGE_PAGES = 5,
  LF_CPU_GPU_PINNED = 6
} lf_buffer_kind;

typedef struct lf_buffer lf_buffer;

/** The serialized export descriptor that travels with a buffer's fd (fixed size, versioned). */
#define LF_DESCRIPTOR_BYTES 96
typedef struct lf_descriptor {
  uint8_t bytes[LF_DESCRIPTOR_BYTES];
} lf_descriptor;

/** A new exportable buffer. GPU kinds and CPU_GPU_PINNED need `context`; CPU kinds take NULL. */
LF_API lf_status lf_buffer_allocate(lf_context* context, lf_buffer_kind kind, uint64_t size, lf_buffer** out);
/** Imports a buffer another process or API exported. Consumes `fd` on success only (on failure
 * the caller still owns it). `context` is needed for GPU kinds. The descriptor is validated and
 * checked against the fd's real object. */
LF_API lf_status lf_buffer_import(lf_context* context, const lf_descriptor* descriptor, int fd, lf_buffer** out);
LF_API void lf_buffer_destroy(lf_buffer* buffer);
LF_API uint64_t lf_buffer_size(const lf_buffer* buffer);
LF_API lf_buffer_kind lf_buffer_get_kind(const lf_buffer* buffer);
/** The mapped bytes, or NULL when the memory is not host-visible. */
LF_API void* lf_buffer_data(const lf_buffer* buffer);
/** A new fd for the buffer's memory (the caller owns and closes it) and its descriptor. */
LF_API lf_status lf_buffer_export(const lf_buffer* buffer, lf_descriptor* descriptor, int* fd);

/* ------------------------------------------------------------------------------------------ */
/* Memory pool: buffers rented from cached segments; lf_buffer_destroy returns them. */

typedef struct lf_pool lf_pool;
typedef struct lf_pool_options {
  size_t struct_size;
  uint64_t segment_bytes;    /**< 0: the library's default */
  uint64_t max_cached_bytes; /**< 0: no cap */
} lf_pool_options;
#define LF_POOL_OPTIONS_INIT \
  { sizeof(lf_pool_options), 0, 0 }

/** A pool; `context` (may be NULL) enables the GPU kinds; the pool keeps its own reference to
 * the device, so the context may be destroyed first. */
LF_API lf_status lf_pool_create(lf_context* context, const lf_pool_options* options, lf_pool** out);
/** Destroys the pool; buffers still rented stay valid until destroyed. */
LF_API void lf_pool_destroy(lf_pool* pool);
LF_API lf_status lf_pool_rent(lf_pool* pool, lf_buffer_kind kind, uint64_t size, lf_buffer** out);
/** Frees the cached memory no buffer uses. */
LF_API void lf_pool_trim(lf_pool* pool);
/** The pool's statistics as JSON (PyTorch-style keys) into `buffer` of `capacity` bytes,
 * NUL-terminated; `*needed` (may be NULL) receives the length + 1. LF_INVALID_ARGUMENT when it
 * does not fit (call again with `*needed` bytes). */
LF_API lf_status lf_pool_stats_json(const lf_pool* pool, char* buffer, size_t capacity, size_t* needed);

/* ------------------------------------------------------------------------------------------ */
/* Channels: one producer, any number of consumers, rendezvous by name on one host. */

typedef struct lf_producer lf_producer;
typedef struct lf_consumer lf_consumer;
typedef struct lf_loan lf_loan;
typedef struct lf_message lf_message;

typedef enum lf_transport { LF_TRANSPORT_AUTO = 0, LF_TRANSPORT_SHM = 1, LF_TRANSPORT_VULKAN = 2 } lf_transport;
typedef enum lf_full_policy { LF_FULL_BLOCK = 0, LF_FULL_DROP_OLDEST = 1, LF_FULL_FAIL_FAST = 2 } lf_full_policy;
typedef enum lf_wait_mode { LF_WAIT_SPIN_THEN_BLOCK = 0, LF_WAIT_BUSY_POLL = 1, LF_WAIT_BLOCK = 2 } lf_wait_mode;

typedef struct lf_producer_options {
  size_t struct_size;
  uint32_t slots;         /**< ring length; 0: the library chooses */
  uint64_t slot_size;     /**< bytes per ring buffer */
  uint32_t max_consumers; /**< 1..16 */
  lf_full_policy policy;
  lf_wait_mode wait;
  lf_transport transport; /**< AUTO: route automatically */
  int timestamps;         /**< non-zero: stamp each message with CLOCK_MONOTONIC */
  lf_context* context;    /**< for the Vulkan transport (used, not owned); NULL: made when needed */
  const char* directory;  /**< rendezvous directory; NULL: the user's default */
} lf_producer_options;
#define LF_PRODUCER_OPTIONS_INIT                                                                                      \
  {                                                                                                                   \
    sizeof(lf_producer_options), 0, 1u << 20, 16, LF_FULL_BLOCK, LF_WAIT_SPIN_THEN_BLOCK, LF_TRANSPORT_AUTO, 0, NULL, \
        NULL                                                                                                          \
  }

typedef struct lf_consumer_options {
  size_t struct_size;
  lf_wait_mode wait;
  int64_t connect_timeout_ns; /**< wait this long for the producer to appear */
  int host_wait_for_gpu;      /**< non-zero: receive waits until the producer's GPU work is done */
  lf_context* context;        /**< for importing Vulkan rings (used, not owned); NULL: made when needed */
  const char* directory;
} lf_consumer_options;
#define LF_CONSUMER_OPTIONS_INIT \
  { sizeof(lf_consumer_options), LF_WAIT_SPIN_THEN_BLOCK, 10000000000LL, 1, NULL, NULL }

typedef struct lf_message_info {
  uint64_t size; /**< bytes used */
  uint64_t user_tag;
  uint64_t timestamp_ns;
  uint64_t sequence; /**< 0, 1, 2, … per channel */
  uint64_t missed;   /**< messages dropped for this consumer just before this one */
} lf_message_info;

/** Creates channel `name` (letters, digits, '-', '_', '.'; at most 64). */
LF_API lf_status lf_producer_create(const char* name, const lf_producer_options* options, lf_producer** out);
/** Closes the channel; loans still held stay valid (and unpublishable) until destroyed. */
LF_API void lf_producer_destroy(lf_producer* producer);
LF_API lf_status lf_producer_wait_for_consumers(lf_producer* producer, uint32_t count, int64_t timeout_ns);
LF_API uint32_t lf_producer_consumer_count(const lf_producer* producer);
LF_API uint64_t lf_producer_slot_size(const lf_producer* producer);
/** The transport chosen ("shm", "vulkan") and why; valid while the producer lives. */
LF_API const char* lf_producer_route(const lf_producer* producer, const char** reason);
/** Waits until every consumer released every published message. */
LF_API lf_status lf_producer_flush(lf_producer* producer, int64_t timeout_ns);
/** A free ring buffer to write; LF_WOULD_BLOCK at once under LF_FULL_FAIL_FAST when full. */
LF_API lf_status lf_producer_loan(lf_producer* producer, int64_t timeout_ns, lf_loan** out);
LF_API void* lf_loan_data(const lf_loan* loan);
LF_API uint64_t lf_loan_size(const lf_loan* loan);
/** The loan's ring buffer, borrowed: valid while the loan lives; lf_buffer_destroy ignores it. */
LF_API const lf_buffer* lf_loan_buffer(const lf_loan* loan);
/** Publishes `size` bytes (0: the whole slot) with `user_tag`. Consumes `loan` whatever the
 * outcome; `info` (may be NULL) receives the message's header. */
LF_API lf_status lf_producer_publish(lf_producer* producer, lf_loan* loan, uint64_t size, uint64_t user_tag,
                                     lf_message_info* info);
/** Gives an unpublished loan back. */
LF_API void lf_loan_destroy(lf_loan* loan);

/** Connects to channel `name`. */
LF_API lf_status lf_consumer_open(const char* name, const lf_consumer_options* options, lf_consumer** out);
/** Disconnects; messages still held stay valid until released. */
LF_API void lf_consumer_destroy(lf_consumer* consumer);
/** The next message; LF_PEER_LOST once the producer is gone and everything it published was
 * received; LF_TIMEOUT when `timeout_ns` ran out (0: do not wait). */
LF_API lf_status lf_consumer_receive(lf_consumer* consumer, int64_t timeout_ns, lf_message** out);
LF_API int32_t lf_consumer_producer_pid(const lf_consumer* consumer);
LF_API const void* lf_message_data(const lf_message* message);
LF_API uint64_t lf_message_size(const lf_message* message);
LF_API void lf_message_info_get(const lf_message* message, lf_message_info* info);
/** The message's ring buffer, borrowed like lf_loan_buffer's. */
LF_API const lf_buffer* lf_message_buffer(const lf_message* message);
/** Releases the message (its slot returns to the producer). */
LF_API void lf_message_release(lf_message* message);

/* ------------------------------------------------------------------------------------------ */
/* CUDA adapter: device pointers over Vulkan memory (LF_UNSUPPORTED when not built). */

typedef struct lf_cuda lf_cuda;
typedef struct lf_cuda_buffer lf_cuda_buffer;

/** The CUDA device under `context`'s Vulkan device (matched by UUID). */
LF_API lf_status lf_cuda_create(const lf_context* context, lf_cuda** out);
LF_API void lf_cuda_destroy(lf_cuda* cuda);
LF_API int lf_cuda_device_ordinal(const lf_cuda* cuda);
/** Maps a buffer (GPU kinds) into CUDA; the buffer must outlive the mapping. */
LF_API lf_status lf_cuda_import(lf_cuda* cuda, const lf_buffer* buffer, lf_cuda_buffer** out);
LF_API void lf_cuda_buffer_destroy(lf_cuda_buffer* buffer);
/** The CUDA device pointer (a CUdeviceptr / void* in device memory). */
LF_API void* lf_cuda_buffer_pointer(const lf_cuda_buffer* buffer);

/* ------------------------------------------------------------------------------------------ */
/* Collectives over a job's ranks (the mesh's native backend; jobs started by lavaflow-launch). */

typedef struct lf_communicator lf_communicator;
typedef enum lf_dtype { LF_F32 = 0, LF_F16 = 1, LF_BF16 = 2, LF_I32 = 3, LF_I64 = 4, LF_U8 = 5 } lf_dtype;
typedef enum lf_reduce_op { LF_SUM = 0, LF_PRODUCT = 1, LF_MIN = 2, LF_MAX = 3, LF_AVERAGE = 4 } lf_reduce_op;

/** The "world" group of this process's job, started by `lavaflow-launch -n N`: LF_NOT_FOUND when
 * it was not. Collective over the job: every rank calls it. */
LF_API lf_status lf_communicator_open_launched(lf_communicator** out);
LF_API void lf_communicator_destroy(lf_communicator* communicator);
LF_API uint32_t lf_communicator_rank(const lf_communicator* communicator);
LF_API uint32_t lf_communicator_size(const lf_communicator* communicator);
/** Every rank makes the same calls in the same order. `count` is in elements of `type`; `send`
 * may equal `recv`. A rank missing for `timeout_ns` makes the others' calls LF_TIMEOUT naming it. */
LF_API lf_status lf_all_reduce(lf_communicator* communicator, const void* send, void* recv, size_t count, lf_dtype type,
                               lf_reduce_op op, int64_t timeout_ns);
/** recv holds size × count elements: every rank's send, in rank order. */
LF_API lf_status lf_all_gather(lf_communicator* communicator, const void* send, void* recv, size_t count, lf_dtype type,
                               int64_t timeout_ns);
LF_API lf_status lf_broadcast(lf_communicator* communicator, void* buffer, size_t count, uint32_t root, lf_dtype type,
                              int64_t timeout_ns);
/** send holds size × count elements; recv (count) gets this rank's block of the reduction. */
LF_API lf_status lf_reduce_scatter(lf_communicator* communicator, const void* send, void* recv, size_t count,
                                   lf_dtype type, lf_reduce_op op, int64_t timeout_ns);
LF_API lf_status lf_barrier(lf_communicator* communicator, int64_t timeout_ns);

#ifdef __cplusplus
}
#endif
#endif /* LAVAFLOW_LAVAFLOW_H */
