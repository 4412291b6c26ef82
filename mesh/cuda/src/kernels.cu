// SPDX-License-Identifier: MIT
// The CUDA collectives: one kernel per call, kBlocks blocks. A call runs in steps of at most one
// staging buffer; step s of block i uses staging buffer (epoch & 1), where the block's epoch
// counts its steps over the communicator's life — kept in device memory, so that a call
// captured in a CUDA graph advances it on every replay. In each step block i of every rank
// copies its slices of the input into its own staging, publishes (epoch, signature) in its flag
// slot, waits for block i of every peer to do the same, then reads the peers' staging directly.
//
// A staging buffer is rewritten two steps later; by then every peer has published the step in
// between, which it does only after its reads of the earlier step (stream order), so no step
// needs a closing synchronisation. That holds per block because block i owns the same staging
// bytes in every step of a call (a shorter last step is cut like the first). Peers' staging is
// read with ld.global.cv: the same addresses come back every other step, and a cached line from
// two steps ago would be stale.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels.hpp"

namespace lavaflow::mesh::cuda_kernels {
namespace {

enum DType : std::uint32_t { kF32, kF16, kBF16, kI32, kI64, kU8 };
enum Op : std::uint32_t { kSum, kProduct, kMin, kMax, kAverage };

__device__ std::uint64_t now_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ std::uint64_t lesser(std::uint64_t a, std::uint64_t b) { return a < b ? a : b; }

struct Range {
  std::uint64_t at, len;
};

/// Vectors each thread moves per pass of a copy or reduction loop.
constexpr std::uint32_t kUnroll = 4;

/// Slice `i` of `len` bytes cut in kBlocks slices on 16-byte boundaries (whole elements, whole
/// vectors).
__device__ Range slice(std::uint64_t len, std::uint32_t i, std::uint32_t parts = kBlocks) {
  const std::uint64_t per = ((len + parts - 1) / parts + 15) & ~std::uint64_t{15};
  const std::uint64_t at = lesser(len, i * per);
  return {at, lesser(len, at + per) - at};
}

/// `r` cut to end at `limit`: a shorter step keeps the slices of the call's first step, so that
/// block i of every rank owns the same staging bytes in every step of a call.
__device__ Range clip(Range r, std::uint64_t limit) {
  const std::uint64_t at = lesser(r.at, limit);
  return {at, lesser(r.at + r.len, limit) - at};
}

__device__ unsigned char* staging(const Launch& l, std::uint32_t rank, std::uint32_t buffer) {
  return l.regions[rank] + kFlagBytes + buffer * l.chunk;
}

__device__ Flags* flags(const Launch& l, std::uint32_t rank) { return reinterpret_cast<Flags*>(l.regions[rank]); }

/// Records the first failure of this rank (one 64-bit word, so the host never reads half of it)
/// and tells the peers; returns false for convenience.
__device__ bool fail(const Launch& l, std::uint32_t code, std::uint32_t rank) {
  const unsigned long long record = (static_cast<unsigned long long>(l.call) << 32) | (rank << 8) | code;
  (void)atomicCAS_system(&l.error->packed, 0ull, record);
  *reinterpret_cast<volatile std::uint32_t*>(&flags(l, l.me)->failed) = 1;
  __threadfence_system();
  return false;
}

/// This block's data of `round` in step `epoch` is in place (every thread has written it).
__device__ void publish(const Launch& l, std::uint32_t round, std::uint32_t epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    const unsigned long long v = (static_cast<unsigned long long>(epoch) << 32) | l.signature;
    *reinterpret_cast<volatile unsigned long long*>(&flags(l, l.me)->slot[blockIdx.x][round]) = v;
  }
}

/// Waits until block i of every peer has published `round` of step `epoch` (of the same call);
/// false, with the failure recorded, when one does not in time, differs, or has failed.
__device__ bool await(const Launch& l, std::uint32_t round, std::uint32_t epoch) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    const std::uint64_t start = now_ns();
    for (std::uint32_t q = 0; q < l.ranks && ok; ++q) {
      if (q == l.me) continue;
      const volatile unsigned long long* slot = &flags(l, q)->slot[blockIdx.x][round];
      const volatile std::uint32_t* failed = &flags(l, q)->failed;
      for (std::uint32_t spins = 0;; ++spins) {
        const unsigned long long v = *slot;
        const auto e = static_cast<std::uint32_t>(v >> 32);
        if (e == epoch) {
          if (static_cast<std::uint32_t>(v) != l.signature) ok = fail(l, kMismatch, q);
          break;
        }
        // A peer is at most one step ahead (it waits for this rank's next step), and only in round
        // 0: it has passed this step, so it made this call too. Anything else is not a peer's slot.
        if (round == 0 && e == epoch + 1) break;
        if (static_cast<std::int32_t>(e - epoch) > 0) {
          ok = fail(l, kCorrupt, q);
          break;
        }
        if ((spins & 255) == 0) {
          if (*failed) {
            ok = fail(l, kPeerFailed, q);
            break;
          }
          if (*reinterpret_cast<volatile std::uint32_t*>(&flags(l, l.me)->failed) != 0) {  // another block failed
            ok = 0;
            break;
          }
          if (now_ns() - start > l.timeout_ns) {
            ok = fail(l, kTimeout, q);
            break;
          }
        }
      }
    }
    __threadfence_system();
  }
  __syncthreads();
  return ok != 0;
}

// ---- element types ----

template <class T>
struct Elem;
template <>
struct Elem<float> {
  using Acc = float;
  __device__ static Acc load(float v) { return v; }
  __device__ static float store(Acc a) { return a; }
};
template <>
struct Elem<__half> {
  using Acc = float;
  __device__ static Acc load(__half v) { return __half2float(v); }
  __device__ static __half store(Acc a) { return __float2half_rn(a); }
};
template <>
struct Elem<__nv_bfloat16> {
  using Acc = float;
  __device__ static Acc load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(Acc a) { return __float2bfloat16_rn(a); }
};
template <>
struct Elem<std::int32_t> {
  using Acc = std::int32_t;
  __device__ static Acc load(std::int32_t v) { return v; }
  __device__ static std::int32_t store(Acc a) { return a; }
};
template <>
struct Elem<std::int64_t> {
  using Acc = long long;
  __device__ static Acc load(std::int64_t v) { return v; }
  __device__ static std::int64_t store(Acc a) { return a; }
};
template <>
struct Elem<std::uint8_t> {
  using Acc = std::uint32_t;
  __device__ static Acc load(std::uint8_t v) { return v; }
  __device__ static std::uint8_t store(Acc a) { return static_cast<std::uint8_t>(a); }
};

/// Integer sums and products wrap in the element's width (done unsigned: signed overflow is
/// undefined); floating types combine in f32.
template <class A>
__device__ A combine(A a, A b, std::uint32_t op) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case kProduct:
        return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
      case kMin:
        return a < b ? a : b;
      case kMax:
        return a < b ? b : a;
      default:
        return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    }
  } else {
    switch (op) {
      case kProduct:
        return a * b;
      case kMin:  // NaN wins and ties keep the second operand, exactly as the host reduction
        return isnan(a) || a < b ? a : b;
      case kMax:
        return isnan(a) || a > b ? a : b;
      default:
        return a + b;
    }
  }
}

template <class T>
__device__ T finish(typename Elem<T>::Acc a, std::uint32_t op, std::uint32_t ranks) {
  using A = typename Elem<T>::Acc;
  if constexpr (std::is_same_v<T, std::uint8_t>) a &= 0xffu;  // the sum wraps in 8 bits first
  if (op == kAverage) a = a / static_cast<A>(ranks);          // integers truncate toward zero
  return Elem<T>::store(a);
}

/// Raw bits of a peer's element, bypassing L1.
template <class T>
__device__ T load_cv(const T* p) {
  if constexpr (sizeof(T) == 1) {
    const unsigned char b = __ldcv(reinterpret_cast<const unsigned char*>(p));
    return *reinterpret_cast<const T*>(&b);
  } else if constexpr (sizeof(T) == 2) {
    const unsigned short b = __ldcv(reinterpret_cast<const unsigned short*>(p));
    return *reinterpret_cast<const T*>(&b);
  } else if constexpr (sizeof(T) == 4) {
    const unsigned int b = __ldcv(reinterpret_cast<const unsigned int*>(p));
    return *reinterpret_cast<const T*>(&b);
  } else {
    const unsigned long long b = __ldcv(reinterpret_cast<const unsigned long long*>(p));
    return *reinterpret_cast<const T*>(&b);
  }
}

/// out[0, len) = op over the `ranks` inputs at in[r] + offset (every rank's staging; this
/// rank's own is written by this block only, the others are read past L1). 16-byte vectors
/// where out is aligned, elements otherwise.
template <class T>
__device__ void reduce(const Launch& l, unsigned char* out, unsigned char* const* in, std::uint64_t offset,
                       std::uint64_t len) {
  using A = typename Elem<T>::Acc;
  constexpr std::uint32_t kPer = 16 / sizeof(T);
  std::uint64_t done = 0;
  if ((reinterpret_cast<std::uintptr_t>(out) & 15) == 0) {
    const std::uint64_t vectors = len / 16;
    const std::uint64_t stride = blockDim.x;
    // kUnroll independent vectors per thread and pass: their loads from every rank are in flight
    // together, which a peer's memory across the link needs to reach its bandwidth.
    std::uint64_t v = threadIdx.x;
    for (; v + (kUnroll - 1) * stride < vectors; v += kUnroll * stride) {
      A acc[kUnroll][kPer];
      uint4 raw[kUnroll];
      for (std::uint32_t u = 0; u < kUnroll; ++u)
        raw[u] = __ldcv(reinterpret_cast<const uint4*>(in[0] + offset) + v + u * stride);
      for (std::uint32_t u = 0; u < kUnroll; ++u)
        for (std::uint32_t k = 0; k < kPer; ++k) acc[u][k] = Elem<T>::load(reinterpret_cast<const T*>(&raw[u])[k]);
      for (std::uint32_t r = 1; r < l.ranks; ++r) {
        for (std::uint32_t u = 0; u < kUnroll; ++u)
          raw[u] = __ldcv(reinterpret_cast<const uint4*>(in[r] + offset) + v + u * stride);
        for (std::uint32_t u = 0; u < kUnroll; ++u)
          for (std::uint32_t k = 0; k < kPer; ++k)
            acc[u][k] = combine(acc[u][k], Elem<T>::load(reinterpret_cast<const T*>(&raw[u])[k]), l.op);
      }
      for (std::uint32_t u = 0; u < kUnroll; ++u) {
        uint4 result;
        for (std::uint32_t k = 0; k < kPer; ++k) reinterpret_cast<T*>(&result)[k] = finish<T>(acc[u][k], l.op, l.ranks);
        reinterpret_cast<uint4*>(out)[v + u * stride] = result;
      }
    }
    for (; v < vectors; v += stride) {
      A acc[kPer];
      uint4 raw = __ldcv(reinterpret_cast<const uint4*>(in[0] + offset) + v);
      for (std::uint32_t k = 0; k < kPer; ++k) acc[k] = Elem<T>::load(reinterpret_cast<const T*>(&raw)[k]);
      for (std::uint32_t r = 1; r < l.ranks; ++r) {
        raw = __ldcv(reinterpret_cast<const uint4*>(in[r] + offset) + v);
        for (std::uint32_t k = 0; k < kPer; ++k)
          acc[k] = combine(acc[k], Elem<T>::load(reinterpret_cast<const T*>(&raw)[k]), l.op);
      }
      uint4 result;
      for (std::uint32_t k = 0; k < kPer; ++k) reinterpret_cast<T*>(&result)[k] = finish<T>(acc[k], l.op, l.ranks);
      reinterpret_cast<uint4*>(out)[v] = result;
    }
    done = vectors * 16;
  }
  const std::uint64_t count = (len - done) / sizeof(T);
  for (std::uint64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const std::uint64_t at = offset + done + e * sizeof(T);
    A acc = Elem<T>::load(load_cv(reinterpret_cast<const T*>(in[0] + at)));
    for (std::uint32_t r = 1; r < l.ranks; ++r)
      acc = combine(acc, Elem<T>::load(load_cv(reinterpret_cast<const T*>(in[r] + at))), l.op);
    reinterpret_cast<T*>(out + done)[e] = finish<T>(acc, l.op, l.ranks);
  }
}

__device__ void reduce_any(const Launch& l, unsigned char* out, unsigned char* const* in, std::uint64_t offset,
                           std::uint64_t len) {
  switch (l.dtype) {
    case kF32:
      return reduce<float>(l, out, in, offset, len);
    case kF16:
      return reduce<__half>(l, out, in, offset, len);
    case kBF16:
      return reduce<__nv_bfloat16>(l, out, in, offset, len);
    case kI32:
      return reduce<std::int32_t>(l, out, in, offset, len);
    case kI64:
      return reduce<std::int64_t>(l, out, in, offset, len);
    default:
      return reduce<std::uint8_t>(l, out, in, offset, len);
  }
}

/// dst[0, n) = src[0, n), by the block; `peer` reads src past L1.
__device__ void copy(unsigned char* dst, const unsigned char* src, std::uint64_t n, bool peer) {
  std::uint64_t done = 0;
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) & 15) == 0) {
    const std::uint64_t vectors = n / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    const std::uint64_t stride = blockDim.x;
    std::uint64_t v = threadIdx.x;
    for (; v + (kUnroll - 1) * stride < vectors; v += kUnroll * stride) {
      uint4 r[kUnroll];
      for (std::uint32_t u = 0; u < kUnroll; ++u) r[u] = peer ? __ldcv(s + v + u * stride) : s[v + u * stride];
      for (std::uint32_t u = 0; u < kUnroll; ++u) d[v + u * stride] = r[u];
    }
    for (; v < vectors; v += stride) d[v] = peer ? __ldcv(s + v) : s[v];
    done = vectors * 16;
  }
  for (std::uint64_t b = done + threadIdx.x; b < n; b += blockDim.x) dst[b] = peer ? __ldcv(src + b) : src[b];
}

__global__ void __launch_bounds__(kThreads) collective(Launch l) {
  const std::uint32_t i = blockIdx.x;
  __shared__ int broken;
  // This rank's own flag, not the host-mapped record: a read across the bus on every call would
  // cost more than a small collective.
  if (threadIdx.x == 0) broken = *reinterpret_cast<volatile std::uint32_t*>(&flags(l, l.me)->failed) != 0;
  __syncthreads();
  if (broken) return;
  const std::uint32_t n = l.ranks, me = l.me;
  auto* out = static_cast<unsigned char*>(l.recv);
  const auto* in = static_cast<const unsigned char*>(l.send);
  std::uint32_t epoch = flags(l, me)->epoch[i];
  // Bytes per step: of each rank's input (all_reduce, all_gather, broadcast) or of each block
  // of the output (reduce_scatter, whose step holds that piece of all n blocks).
  const std::uint64_t piece = l.kind == kReduceScatter ? ((l.chunk / n) & ~std::uint64_t{15}) : l.chunk;
  // Every step is cut like the first (the fullest) and the same way within an all_reduce: a
  // block's peers wait for that block only, so a block whose bytes moved to another in a shorter
  // step could still be reading them when a peer's other block writes them.
  const std::uint64_t first = lesser(piece, l.bytes);
  const bool one_shot = first <= kOneShotBytes;
  const std::uint64_t part = ((first + n - 1) / n + 15) & ~std::uint64_t{15};
  unsigned char* stages[kMaxRanks];
  for (std::uint64_t at = 0; at < l.bytes; at += piece) {
    const std::uint64_t len = lesser(piece, l.bytes - at);
    const std::uint32_t b = ++epoch & 1;
    for (std::uint32_t r = 0; r < n; ++r) stages[r] = staging(l, r, b);
    unsigned char* mine = stages[me];
    switch (l.kind) {
      case kAllReduce: {
        if (one_shot) {
          const Range s = clip(slice(first, i), len);
          copy(mine + s.at, in + at + s.at, s.len, false);
          publish(l, 0, epoch);
          if (!await(l, 0, epoch)) return;
          reduce_any(l, out + at + s.at, stages, s.at, s.len);
          break;
        }
        // Reduce-scatter then all-gather: rank q reduces part q; block i handles slice i of each.
        for (std::uint32_t q = 0; q < n; ++q) {
          const std::uint64_t p0 = lesser(len, q * part);
          const Range s = clip(slice(part, i), lesser(len, p0 + part) - p0);
          copy(mine + p0 + s.at, in + at + p0 + s.at, s.len, false);
        }
        publish(l, 0, epoch);
        if (!await(l, 0, epoch)) return;
        {
          const std::uint64_t p0 = lesser(len, me * part);
          const Range s = clip(slice(part, i), lesser(len, p0 + part) - p0);
          reduce_any(l, mine + p0 + s.at, stages, p0 + s.at, s.len);
          __syncthreads();
          copy(out + at + p0 + s.at, mine + p0 + s.at, s.len, false);
        }
        publish(l, 1, epoch);
        if (!await(l, 1, epoch)) return;
        for (std::uint32_t q = 0; q < n; ++q) {
          if (q == me) continue;
          const std::uint64_t p0 = lesser(len, q * part);
          const Range s = clip(slice(part, i), lesser(len, p0 + part) - p0);
          copy(out + at + p0 + s.at, stages[q] + p0 + s.at, s.len, true);
        }
        break;
      }
      case kAllGather: {
        const Range s = clip(slice(first, i), len);
        copy(mine + s.at, in + at + s.at, s.len, false);
        publish(l, 0, epoch);
        if (!await(l, 0, epoch)) return;
        for (std::uint32_t q = 0; q < n; ++q) copy(out + q * l.bytes + at + s.at, stages[q] + s.at, s.len, q != me);
        break;
      }
      case kReduceScatter: {
        const Range s = clip(slice(first, i), len);
        for (std::uint32_t q = 0; q < n; ++q) copy(mine + q * piece + s.at, in + q * l.bytes + at + s.at, s.len, false);
        publish(l, 0, epoch);
        if (!await(l, 0, epoch)) return;
        reduce_any(l, out + at + s.at, stages, me * piece + s.at, s.len);
        break;
      }
      default: {  // broadcast: from the root's staging, in place on every rank
        const Range s = clip(slice(first, i), len);
        auto* buffer = static_cast<unsigned char*>(l.recv);
        if (me == l.root) copy(mine + s.at, buffer + at + s.at, s.len, false);
        publish(l, 0, epoch);
        if (!await(l, 0, epoch)) return;
        if (me != l.root) copy(buffer + at + s.at, stages[l.root] + s.at, s.len, true);
        break;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) flags(l, me)->epoch[i] = epoch;
}

}  // namespace

cudaError_t launch(const Launch& l, cudaStream_t stream) {
  collective<<<kBlocks, kThreads, 0, stream>>>(l);
  return cudaGetLastError();
}

cudaError_t preload() {
  cudaFuncAttributes a{};
  return cudaFuncGetAttributes(&a, collective);
}

}  // namespace lavaflow::mesh::cuda_kernels
