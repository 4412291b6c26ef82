// SPDX-License-Identifier: MIT
// The CUDA collectives: one kernel per call, Launch::blocks blocks. Calls of at most kLLBytes per
// rank pair go in LL lines (below), in a kernel of their own: it needs far fewer registers than the
// staging's, and a small call feels every one. Larger ones run the staging's kernel for their
// element type, in steps of at most one staging buffer; step s of block i uses staging buffer
// (epoch & 1), where the block's epoch counts its steps over the communicator's life — kept in
// device memory, so that a call captured in a CUDA graph advances it on every replay. Staging is
// pushed: in each step block i of every rank writes its slices of what each peer needs into that
// peer's staging, publishes (epoch, signature) in the peers' flag slots, waits for block i of every
// peer to do the same, then reads its own staging.
//
// A staging buffer is written again two steps later; by then its owner has published the step in
// between, which it does only after its reads of the earlier step (stream order), so no step
// needs a closing synchronisation. That holds per block because block i owns the same staging
// bytes in every step of a call (a shorter last step is cut like the first), and across calls
// because every step waits for every peer and a rank's staging is read by that rank only.
// Staging is read with ld.global.cv: peers write it, the same addresses come back every other
// step, and a cached line from two steps ago would be stale.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <iterator>
#include <type_traits>

#include "kernels.hpp"

namespace lavaflow::mesh::cuda_kernels {
namespace {

/// The group's regions, in each block's shared memory: threads 0 … ranks − 1 read them from the
/// Group while the kernel ahead may still run (see begin_call()), so that reading them from device
/// memory costs the call nothing it would not wait for anyway.
__shared__ unsigned char* regions[kMaxRanks];
static_assert(kMaxRanks <= 32);

enum DType : std::uint32_t { kF32, kF16, kBF16, kI32, kI64, kU8 };
enum Op : std::uint32_t { kSum, kProduct, kMin, kMax, kAverage };

__device__ std::uint64_t now_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__host__ __device__ std::uint64_t lesser(std::uint64_t a, std::uint64_t b) { return a < b ? a : b; }

struct Range {
  std::uint64_t at, len;
};

/// Vectors each thread moves per pass of a copy or reduction loop.
constexpr std::uint32_t kUnroll = 4;

/// Slice `i` of `len` bytes cut in `parts` slices (one per block) on 16-byte boundaries (whole
/// elements, whole vectors).
__device__ Range slice(std::uint64_t len, std::uint32_t i, std::uint32_t parts) {
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
  return regions[rank] + kFlagBytes + ll_area_bytes(l.ranks) + buffer * l.chunk;
}

/// Sender `from`'s LL area of parity `parity` in rank `to`'s region.
__device__ unsigned char* ll_area(const Launch& l, std::uint32_t to, std::uint32_t parity, std::uint32_t from) {
  return regions[to] + kFlagBytes + (std::uint64_t{parity} * l.ranks + from) * kLLSenderBytes;
}

__device__ Flags* flags(const Launch&, std::uint32_t rank) { return reinterpret_cast<Flags*>(regions[rank]); }

/// Records the first failure of this rank (one 64-bit word, so the host never reads half of it)
/// and tells the peers what it was; returns false for convenience. `third`: kPeerMismatch's other
/// rank. The block that sets the failed word writes the record, so that the peers and the host
/// hear of the same failure when two blocks fail at once.
__device__ bool fail(const Launch& l, std::uint32_t code, std::uint32_t rank, std::uint32_t third = 0) {
  const std::uint32_t what = pack({code, rank, third});
  if (atomicCAS(&flags(l, l.me)->failed, 0u, what) == 0u)
    (void)atomicCAS_system(&l.error->packed, 0ull, (static_cast<unsigned long long>(l.call) << 32) | what);
  __threadfence_system();
  return false;
}

/// Peer `q` has failed with `failed` (its Flags::failed). A mismatch it knows of is this call's
/// mismatch too: when the rank found to differ is this one, from this side the finder made
/// another call.
__device__ bool peer_failed(const Launch& l, std::uint32_t q, std::uint32_t failed) {
  const FailureWord f = unpack(failed);
  if (f.code != kMismatch && f.code != kPeerMismatch) return fail(l, kPeerFailed, q);
  const std::uint32_t finder = f.code == kMismatch ? q : f.rank, differs = f.code == kMismatch ? f.rank : f.third;
  return differs == l.me ? fail(l, kMismatch, finder) : fail(l, kPeerMismatch, finder, differs);
}

/// The step after `epoch`. 0 is skipped, keeping the parity alternating: memory zeroed at open must
/// never look written by a step (after 2^32 steps a slot or line untouched since exactly then
/// could; nothing is that old in practice).
__device__ std::uint32_t next_epoch(std::uint32_t epoch) { return epoch == 0xffffffffu ? 2 : epoch + 1; }

/// Tells every peer that this block's data of `round` in step `epoch` is in place (`fence`:
/// after every thread's writes, which the fence makes visible to the peers first).
__device__ void announce(const Launch& l, std::uint32_t round, std::uint32_t epoch, bool fence) {
  if (threadIdx.x != 0) return;
  if (fence) __threadfence_system();
  const unsigned long long v = (static_cast<unsigned long long>(epoch) << 32) | l.signature;
  for (std::uint32_t q = 0; q < l.ranks; ++q)
    if (q != l.me) *reinterpret_cast<volatile unsigned long long*>(&flags(l, q)->slot[l.me][blockIdx.x][round]) = v;
}

/// This block's data of `round` in step `epoch` is in place (every thread has written it).
__device__ void publish(const Launch& l, std::uint32_t round, std::uint32_t epoch) {
  __syncthreads();
  announce(l, round, epoch, true);
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
      const volatile unsigned long long* slot = &flags(l, l.me)->slot[q][blockIdx.x][round];
      const volatile std::uint32_t* failed = &flags(l, q)->failed;
      for (std::uint32_t spins = 0;; ++spins) {
        const unsigned long long v = *slot;
        const auto e = static_cast<std::uint32_t>(v >> 32);
        if (e == epoch) {
          if (static_cast<std::uint32_t>(v) != l.signature) ok = fail(l, kMismatch, q);
          break;
        }
        // A peer is at most one step ahead (it waits for this rank's next step), and only in round
        // 0: it has passed this step, so it made this call too. Round 0 is written every step the
        // block runs (a small call may run fewer blocks: their slots only fall behind), so anything
        // further is not a peer's slot; rounds 1 and 2 only in two-shot steps and window calls,
        // however long ago.
        if (round == 0 && e == next_epoch(epoch)) break;
        if (round == 0 && static_cast<std::int32_t>(e - epoch) > 0) {
          ok = fail(l, kCorrupt, q);
          break;
        }
        if ((spins & 255) == 0) {
          if (const std::uint32_t f = *failed) {
            ok = peer_failed(l, q, f);
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

/// combine() with the op known at compile time (kOp >= 0) or read at run time (kAnyOp).
constexpr int kAnyOp = -1;
template <int kOp, class A>
__device__ A combine_as(A a, A b, std::uint32_t op) {
  if constexpr (kOp == kAnyOp)
    return combine(a, b, op);
  else
    return combine(a, b, static_cast<std::uint32_t>(kOp));
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

/// Vectors v, v + stride, ... of outs[j] = op over in[r] (stride = blockDim.x), U per thread and
/// pass from `v` while all U fit; returns where this thread stopped, for a pass with smaller U.
/// The U vectors are independent: their loads from every rank are in flight together, which the
/// link needs to reach its bandwidth.
template <class T, int kOp, std::uint32_t U>
__device__ std::uint64_t reduce_vectors(const Launch& l, unsigned char* const* outs, std::uint32_t nouts,
                                        const unsigned char* const* in, std::uint64_t v, std::uint64_t vectors) {
  using A = typename Elem<T>::Acc;
  constexpr std::uint32_t kPer = 16 / sizeof(T);
  const std::uint64_t stride = blockDim.x;
  for (; v + (U - 1) * stride < vectors; v += U * stride) {
    A acc[U][kPer];
    uint4 raw[U];
    for (std::uint32_t u = 0; u < U; ++u) raw[u] = __ldcv(reinterpret_cast<const uint4*>(in[0]) + v + u * stride);
    for (std::uint32_t u = 0; u < U; ++u)
      for (std::uint32_t k = 0; k < kPer; ++k) acc[u][k] = Elem<T>::load(reinterpret_cast<const T*>(&raw[u])[k]);
    for (std::uint32_t r = 1; r < l.ranks; ++r) {
      for (std::uint32_t u = 0; u < U; ++u) raw[u] = __ldcv(reinterpret_cast<const uint4*>(in[r]) + v + u * stride);
      for (std::uint32_t u = 0; u < U; ++u)
        for (std::uint32_t k = 0; k < kPer; ++k)
          acc[u][k] = combine_as<kOp>(acc[u][k], Elem<T>::load(reinterpret_cast<const T*>(&raw[u])[k]), l.op);
    }
    for (std::uint32_t u = 0; u < U; ++u) {
      uint4 result;
      for (std::uint32_t k = 0; k < kPer; ++k) reinterpret_cast<T*>(&result)[k] = finish<T>(acc[u][k], l.op, l.ranks);
      for (std::uint32_t j = 0; j < nouts; ++j) reinterpret_cast<uint4*>(outs[j])[v + u * stride] = result;
    }
  }
  return v;
}

/// outs[j][0, len) = op over in[r][0, len) for every rank r (in rank order, as the host
/// reduction), for each of the `nouts` outputs (this rank's result and the peers' staging).
/// Inputs are read past L1: peers write this rank's staging. 16-byte vectors where every pointer
/// allows, elements otherwise. `kOp`: the op when known at compile time (kAnyOp: l.op).
template <class T, int kOp>
__device__ void reduce(const Launch& l, unsigned char* const* outs, std::uint32_t nouts, const unsigned char* const* in,
                       std::uint64_t len) {
  using A = typename Elem<T>::Acc;
  std::uintptr_t bits = 0;
  for (std::uint32_t r = 0; r < l.ranks; ++r) bits |= reinterpret_cast<std::uintptr_t>(in[r]);
  for (std::uint32_t j = 0; j < nouts; ++j) bits |= reinterpret_cast<std::uintptr_t>(outs[j]);
  std::uint64_t done = 0;
  if ((bits & 15) == 0) {
    const std::uint64_t vectors = len / 16;
    const std::uint64_t v = reduce_vectors<T, kOp, kUnroll>(l, outs, nouts, in, threadIdx.x, vectors);
    reduce_vectors<T, kOp, 1>(l, outs, nouts, in, v, vectors);
    done = vectors * 16;
  }
  const std::uint64_t count = (len - done) / sizeof(T);
  for (std::uint64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const std::uint64_t at = done + e * sizeof(T);
    A acc = Elem<T>::load(load_cv(reinterpret_cast<const T*>(in[0] + at)));
    for (std::uint32_t r = 1; r < l.ranks; ++r)
      acc = combine_as<kOp>(acc, Elem<T>::load(load_cv(reinterpret_cast<const T*>(in[r] + at))), l.op);
    const T result = finish<T>(acc, l.op, l.ranks);
    for (std::uint32_t j = 0; j < nouts; ++j) *reinterpret_cast<T*>(outs[j] + at) = result;
  }
}

/// Sums (and averages, which sum first) take a loop with the op compiled in: a run-time choice
/// per element costs the reduction more than its arithmetic, most of all for 16-bit types.
template <class T>
__device__ void reduce_op(const Launch& l, unsigned char* const* outs, std::uint32_t nouts,
                          const unsigned char* const* in, std::uint64_t len) {
  if (l.op == kSum || l.op == kAverage)
    reduce<T, kSum>(l, outs, nouts, in, len);
  else
    reduce<T, kAnyOp>(l, outs, nouts, in, len);
}

/// The words W of dsts[0 … k)[0, n) = src[0, n), by the block; returns the bytes done (whole words).
/// `peer` reads src past L1 (a peer's writes).
template <class W>
__device__ std::uint64_t copy_words(unsigned char* const* dsts, std::uint32_t k, const unsigned char* src,
                                    std::uint64_t n, bool peer) {
  const std::uint64_t words = n / sizeof(W), stride = blockDim.x;
  const W* s = reinterpret_cast<const W*>(src);
  auto load = [&](std::uint64_t v) { return peer ? __ldcv(s + v) : s[v]; };
  std::uint64_t v = threadIdx.x;
  // kUnroll independent loads in flight per thread while they all fit, then one at a time.
  for (; v + (kUnroll - 1) * stride < words; v += kUnroll * stride) {
    W r[kUnroll];
    for (std::uint32_t u = 0; u < kUnroll; ++u) r[u] = load(v + u * stride);
    for (std::uint32_t j = 0; j < k; ++j)
      for (std::uint32_t u = 0; u < kUnroll; ++u) reinterpret_cast<W*>(dsts[j])[v + u * stride] = r[u];
  }
  for (; v < words; v += stride) {
    const W r = load(v);
    for (std::uint32_t j = 0; j < k; ++j) reinterpret_cast<W*>(dsts[j])[v] = r;
  }
  return words * sizeof(W);
}

/// dsts[0 … k)[done, n) = src[done, n) byte by byte.
__device__ void copy_bytes(unsigned char* const* dsts, std::uint32_t k, const unsigned char* src, std::uint64_t done,
                           std::uint64_t n, bool peer) {
  for (std::uint64_t b = done + threadIdx.x; b < n; b += blockDim.x) {
    const unsigned char c = peer ? __ldcv(src + b) : src[b];
    for (std::uint32_t j = 0; j < k; ++j) dsts[j][b] = c;
  }
}

/// copy() where some pointer is off 16 bytes: in the widest words they all allow (a user's buffer
/// at an element offset still moves in 4- or 8-byte words, not bytes), then bytes. Not inlined:
/// the staging kernels call copy() at several places, and these loops inlined at each would cost
/// their common path registers.
__device__ __noinline__ void copy_narrow(unsigned char* const* dsts, std::uint32_t k, const unsigned char* src,
                                         std::uint64_t n, bool peer, std::uintptr_t any) {
  std::uint64_t done = 0;
  if ((any & 7) == 0)
    done = copy_words<uint2>(dsts, k, src, n, peer);
  else if ((any & 3) == 0)
    done = copy_words<unsigned int>(dsts, k, src, n, peer);
  copy_bytes(dsts, k, src, done, n, peer);
}

/// dsts[0 … k)[0, n) = src[0, n), by the block, each byte of src read once: a rank's input goes
/// to every peer (and its own output) in one pass. `peer` reads src past L1 (a peer's writes).
__device__ void copy(unsigned char* const* dsts, std::uint32_t k, const unsigned char* src, std::uint64_t n,
                     bool peer) {
  std::uintptr_t any = reinterpret_cast<std::uintptr_t>(src);
  for (std::uint32_t j = 0; j < k; ++j) any |= reinterpret_cast<std::uintptr_t>(dsts[j]);
  if ((any & 15) != 0) return copy_narrow(dsts, k, src, n, peer, any);
  copy_bytes(dsts, k, src, copy_words<uint4>(dsts, k, src, n, peer), n, peer);
}

__device__ void copy(unsigned char* dst, const unsigned char* src, std::uint64_t n, bool peer) {
  copy(&dst, 1, src, n, peer);
}

// ---- LL: small calls (see kLLBytes) ----
//
// A line is two 8-byte words, each four data bytes under the call's epoch: an aligned 8-byte
// access is single-copy atomic, so a word whose epoch is this call's holds this call's bytes, and
// a reader needs no fence. The epoch also tells this call's lines from a stale one of an earlier
// call (same parity, two or more calls ago). The sender's header word (epoch, signature) per
// block tells a mismatched call from this one. LL areas alternate by parity: a rank writes a
// peer's area of parity p again two calls later, after a call in between in which it waited for
// that peer (every call waits for every peer) — whose kernel of that call began after its kernel
// reading this area had ended.

__device__ void ll_put(unsigned char* line, std::uint64_t data, std::uint32_t epoch) {
  const unsigned long long e = static_cast<unsigned long long>(epoch) << 32;
  const unsigned long long w0 = e | (data & 0xffffffffull), w1 = e | (data >> 32);
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(line), "l"(w0), "l"(w1) : "memory");
}

/// True when both words of the line carry `epoch`; `data` is then its eight bytes.
__device__ bool ll_get(const unsigned char* line, std::uint32_t epoch, std::uint64_t& data) {
  unsigned long long w0, w1;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(line) : "memory");
  data = (w0 & 0xffffffffull) | (w1 << 32);
  return static_cast<std::uint32_t>(w0 >> 32) == epoch && static_cast<std::uint32_t>(w1 >> 32) == epoch;
}

/// `n` ≤ 8 bytes of a user buffer at `p` (aligned to its elements only), zero-extended.
__device__ std::uint64_t load8(const unsigned char* p, std::uint32_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (n == 8 && (a & 7) == 0) return *reinterpret_cast<const std::uint64_t*>(p);
  if (n == 8 && (a & 3) == 0)
    return reinterpret_cast<const std::uint32_t*>(p)[0] | std::uint64_t{reinterpret_cast<const std::uint32_t*>(p)[1]}
                                                              << 32;
  std::uint64_t v = 0;
  for (std::uint32_t b = 0; b < n; ++b) v |= std::uint64_t{p[b]} << (8 * b);
  return v;
}

__device__ void store8(unsigned char* p, std::uint64_t v, std::uint32_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (n == 8 && (a & 7) == 0) {
    *reinterpret_cast<std::uint64_t*>(p) = v;
  } else if (n == 8 && (a & 3) == 0) {
    reinterpret_cast<std::uint32_t*>(p)[0] = static_cast<std::uint32_t>(v);
    reinterpret_cast<std::uint32_t*>(p)[1] = static_cast<std::uint32_t>(v >> 32);
  } else {
    for (std::uint32_t b = 0; b < n; ++b) p[b] = static_cast<unsigned char>(v >> (8 * b));
  }
}

/// The checks a waiting thread makes now and then: false (the failure recorded) when peer `q` or
/// this rank failed, `q` made another call in the staging protocol, or the call's time is up.
__device__ bool ll_still_waiting(const Launch& l, std::uint32_t q, std::uint32_t epoch, std::uint64_t start) {
  if (const std::uint32_t f = *reinterpret_cast<volatile std::uint32_t*>(&flags(l, q)->failed))
    return peer_failed(l, q, f);
  if (*reinterpret_cast<volatile std::uint32_t*>(&flags(l, l.me)->failed)) return false;
  const unsigned long long v = *reinterpret_cast<volatile unsigned long long*>(&flags(l, l.me)->slot[q][blockIdx.x][0]);
  if (static_cast<std::uint32_t>(v >> 32) == epoch && static_cast<std::uint32_t>(v) != l.signature)
    return fail(l, kMismatch, q);
  if (now_ns() - start > l.timeout_ns) return fail(l, kTimeout, q);
  return true;
}

/// Waits for line `line` (of this block's slice) from rank q.
__device__ bool ll_wait(const Launch& l, std::uint32_t q, std::uint32_t epoch, std::uint64_t line, std::uint64_t start,
                        std::uint64_t& data) {
  const unsigned char* at = ll_area(l, l.me, epoch & 1, q) + kLLHeaderBytes + 16 * line;
  for (std::uint32_t spins = 1; !ll_get(at, epoch, data); ++spins)
    if ((spins & 1023) == 0 && !ll_still_waiting(l, q, epoch, start)) return false;
  return true;
}

/// Line `line` (of this block's slice) of rank r: this rank's own from its input (`n` bytes at
/// `own`), a peer's once it has arrived. False when the call failed.
__device__ bool ll_line(const Launch& l, std::uint32_t r, std::uint32_t epoch, std::uint64_t line, std::uint64_t start,
                        const unsigned char* own, std::uint32_t n, std::uint64_t& data) {
  if (r != l.me) return ll_wait(l, r, epoch, line, start, data);
  data = load8(own, n);
  return true;
}

/// all_reduce / reduce_scatter: every rank's line, combined in rank order (as the host reduction).
template <class T, int kOp>
__device__ bool ll_reduce(const Launch& l, std::uint32_t epoch, std::uint64_t first_line, std::uint64_t lines,
                          std::uint64_t at0, std::uint64_t len, std::uint64_t start) {
  using A = typename Elem<T>::Acc;
  constexpr std::uint32_t kPer = 8 / sizeof(T);
  const auto* in = static_cast<const unsigned char*>(l.send) + (l.kind == kReduceScatter ? l.me * l.bytes : 0);
  auto* out = static_cast<unsigned char*>(l.recv);
  for (std::uint64_t k = threadIdx.x; k < lines; k += blockDim.x) {
    const std::uint64_t at = at0 + 8 * k;
    const auto n = static_cast<std::uint32_t>(lesser(8, len - 8 * k));
    A acc[kPer];
    for (std::uint32_t r = 0; r < l.ranks; ++r) {
      std::uint64_t d;
      if (!ll_line(l, r, epoch, first_line + k, start, in + at, n, d)) return false;
      for (std::uint32_t e = 0; e < kPer; ++e) {
        const A v = Elem<T>::load(reinterpret_cast<const T*>(&d)[e]);
        acc[e] = r == 0 ? v : combine_as<kOp>(acc[e], v, l.op);
      }
    }
    std::uint64_t result = 0;
    for (std::uint32_t e = 0; e < kPer; ++e) reinterpret_cast<T*>(&result)[e] = finish<T>(acc[e], l.op, l.ranks);
    store8(out + at, result, n);
  }
  return true;
}

template <class T>
__device__ bool ll_reduce_op(const Launch& l, std::uint32_t epoch, std::uint64_t first_line, std::uint64_t lines,
                             std::uint64_t at0, std::uint64_t len, std::uint64_t start) {
  if (l.op == kSum || l.op == kAverage) return ll_reduce<T, kSum>(l, epoch, first_line, lines, at0, len, start);
  return ll_reduce<T, kAnyOp>(l, epoch, first_line, lines, at0, len, start);
}

__device__ bool ll_reduce_any(const Launch& l, std::uint32_t epoch, std::uint64_t first_line, std::uint64_t lines,
                              std::uint64_t at0, std::uint64_t len, std::uint64_t start) {
  switch (l.dtype) {
    case kF32:
      return ll_reduce_op<float>(l, epoch, first_line, lines, at0, len, start);
    case kF16:
      return ll_reduce_op<__half>(l, epoch, first_line, lines, at0, len, start);
    case kBF16:
      return ll_reduce_op<__nv_bfloat16>(l, epoch, first_line, lines, at0, len, start);
    case kI32:
      return ll_reduce_op<std::int32_t>(l, epoch, first_line, lines, at0, len, start);
    case kI64:
      return ll_reduce_op<std::int64_t>(l, epoch, first_line, lines, at0, len, start);
    default:
      return ll_reduce_op<std::uint8_t>(l, epoch, first_line, lines, at0, len, start);
  }
}

/// A call of at most kLLBytes per rank pair, as step `epoch` of this block. Block i of this kernel
/// moves slice i; a block with an empty slice only publishes its slot. False when the call failed.
__device__ bool ll_call(const Launch& l, std::uint32_t epoch) {
  const std::uint32_t n = l.ranks, me = l.me, i = blockIdx.x, parity = epoch & 1;
  const unsigned long long header = (static_cast<unsigned long long>(epoch) << 32) | l.signature;
  // A peer that chose the staging protocol (another call) compares this with its own.
  announce(l, 0, epoch, false);
  const Range s = slice(l.bytes, i, gridDim.x);
  if (s.len == 0) return true;
  const bool broadcast = l.kind == kBroadcast, root = me == l.root;
  // Every rank sends its header to every peer and waits for theirs, in a broadcast too (where
  // only the root sends data): every call then waits for every peer, which the reuse of LL areas
  // and staging two calls later relies on.
  const std::uint64_t start = now_ns(), first_line = s.at / 8, lines = (s.len + 7) / 8;
  if (threadIdx.x == 0)
    for (std::uint32_t q = 0; q < n; ++q)
      if (q != me) *reinterpret_cast<volatile unsigned long long*>(ll_area(l, q, parity, me) + 8 * i) = header;
  if (!broadcast || root) {
    const auto* in = static_cast<const unsigned char*>(broadcast ? l.recv : l.send);
    for (std::uint64_t k = threadIdx.x; k < lines; k += blockDim.x) {
      const std::uint64_t at = s.at + 8 * k;
      const auto len = static_cast<std::uint32_t>(lesser(8, s.len - 8 * k));
      const std::uint64_t d = l.kind == kReduceScatter ? 0 : load8(in + at, len);
      for (std::uint32_t q = 0; q < n; ++q)
        if (q != me)
          ll_put(ll_area(l, q, parity, me) + kLLHeaderBytes + 16 * (first_line + k),
                 l.kind == kReduceScatter ? load8(in + q * l.bytes + at, len) : d, epoch);
    }
  }
  __shared__ int ok;
  if (threadIdx.x == 0) {
    ok = 1;
    for (std::uint32_t q = 0; q < n && ok; ++q) {
      if (q == me) continue;
      const auto* h = reinterpret_cast<const volatile unsigned long long*>(ll_area(l, me, parity, q) + 8 * i);
      for (std::uint32_t spins = 1;; ++spins) {
        const unsigned long long v = *h;
        if (static_cast<std::uint32_t>(v >> 32) == epoch) {
          if (static_cast<std::uint32_t>(v) != l.signature) ok = fail(l, kMismatch, q);
          break;
        }
        if ((spins & 1023) == 0 && !ll_still_waiting(l, q, epoch, start)) {
          ok = 0;
          break;
        }
      }
    }
  }
  __syncthreads();
  if (!ok) return false;
  if (broadcast && root) return true;
  if (l.kind == kAllReduce || l.kind == kReduceScatter)
    return ll_reduce_any(l, epoch, first_line, lines, s.at, s.len, start);
  const auto* in = static_cast<const unsigned char*>(l.send);
  auto* out = static_cast<unsigned char*>(l.recv);
  for (std::uint64_t k = threadIdx.x; k < lines; k += blockDim.x) {
    const std::uint64_t at = s.at + 8 * k;
    const auto len = static_cast<std::uint32_t>(lesser(8, s.len - 8 * k));
    std::uint64_t d;
    if (broadcast) {
      if (!ll_wait(l, l.root, epoch, first_line + k, start, d)) return false;
      store8(out + at, d, len);
      continue;
    }
    for (std::uint32_t q = 0; q < n; ++q) {  // all_gather
      if (!ll_line(l, q, epoch, first_line + k, start, in + at, len, d)) return false;
      store8(out + q * l.bytes + at, d, len);
    }
  }
  return true;
}

/// What every call's kernel does first: reads the group's regions, waits for the stream's work
/// before it (a kernel launched early, see launch()), lets the stream's next kernel launch, and
/// stops when this rank has failed. False: the call is not made.
__device__ bool begin_call(const Launch& l) {
  // Written once when the communicator opened: no kernel ahead changes it. Every block has at
  // least a warp's threads, and kMaxRanks fit in one.
  unsigned char* region = nullptr;
  if (threadIdx.x < l.ranks) regions[threadIdx.x] = region = l.group->regions[threadIdx.x];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  __shared__ int broken;
  // This rank's own flag, not the host-mapped record: a read across the bus on every call would
  // cost more than a small collective.
  if (threadIdx.x == l.me)
    broken = *reinterpret_cast<volatile std::uint32_t*>(&reinterpret_cast<Flags*>(region)->failed) != 0;
  __syncthreads();
  return !broken;
}

/// A call of at most kLLBytes per rank pair, in small_blocks() blocks. Every block's epoch is the
/// same at its start, and block 0 gives the blocks the call does not run the call's epoch too.
/// Equal epochs are what keeps a line from an earlier call apart from this one's: the slices move
/// with the number of blocks, and a block that fell behind could wait for an epoch that another
/// block wrote into the same line calls ago.
__global__ void __launch_bounds__(kThreads) small_collective(Launch l) {
  if (!begin_call(l)) return;
  Flags* mine = flags(l, l.me);
  const std::uint32_t epoch = next_epoch(mine->epoch[blockIdx.x]);
  if (!ll_call(l, epoch)) return;
  if (threadIdx.x == 0) mine->epoch[blockIdx.x] = epoch;
  if (blockIdx.x == 0)
    for (std::uint32_t j = gridDim.x + threadIdx.x; j < l.blocks; j += blockDim.x) mine->epoch[j] = epoch;
}

/// Blocks of a small call of `bytes` per rank pair on a communicator of `blocks`.
std::uint32_t small_blocks(std::uint64_t bytes, std::uint32_t blocks) {
  return static_cast<std::uint32_t>(lesser(blocks, lesser(kBlocks, (bytes + kLLBytesPerBlock - 1) / kLLBytesPerBlock)));
}

/// Where each rank's window `w` (1 + its index) holds what `mine` points at in this rank's: the
/// window's row, offset as `mine` is in this rank's window. Into shared `at`, by the first threads
/// (visible after the block's next __syncthreads).
__device__ void window_pointers(const Launch& l, std::uint32_t w, const void* mine, unsigned char** at) {
  if (threadIdx.x < l.ranks) {
    unsigned char* const* mapped = flags(l, l.me)->windows[w - 1];
    at[threadIdx.x] = mapped[threadIdx.x] + (static_cast<const unsigned char*>(mine) - mapped[l.me]);
  }
}

/// A larger all_gather or broadcast whose output lies in a registered window at the same offset
/// on every rank: each rank writes its share straight into its peers' outputs, with no staging and
/// no steps. Round 0 says a rank has entered the call (its stream's work before it, which may
/// still use the output, has ended); round 1 that it has seen every peer enter; round 2 that its
/// writes into the peers have landed. A rank writes into a peer only after that peer's round 1: a
/// rank that gave up waiting for a late peer in round 0 has returned an error and may use its
/// output again, and the late peer, finding this rank's round 0 in place, must not write into it.
/// A rank that fails later (in round 1 or 2, or because another of its blocks failed) may still
/// be written by peers that got past round 1 until their kernels end: the API says so. The
/// signature covers the window and offset, so ranks that disagree stop at round 0. One step: a
/// block's epoch advances once. Bytes are bytes here: one kernel for every type.
__global__ void __launch_bounds__(kThreads) window_collective(Launch l) {
  if (!begin_call(l)) return;
  __shared__ unsigned char* outs[kMaxRanks];
  const std::uint32_t n = l.ranks, me = l.me;
  window_pointers(l, l.window, l.recv, outs);
  Flags* mine = flags(l, me);
  const std::uint32_t epoch = next_epoch(mine->epoch[blockIdx.x]);
  publish(l, 0, epoch);
  if (!await(l, 0, epoch)) return;
  publish(l, 1, epoch);
  if (!await(l, 1, epoch)) return;
  const Range s = slice(l.bytes, blockIdx.x, l.blocks);
  // This rank's input, to every peer's output (and its own, unless in place) in one pass; the
  // peers in turn from the next rank, so that the ranks' writes spread over the links.
  const bool gather = l.kind == kAllGather;
  const std::uint64_t at = (gather ? me * l.bytes : 0) + s.at;
  const auto* in = gather ? static_cast<const unsigned char*>(l.send) + s.at : outs[me] + s.at;
  unsigned char* dsts[kMaxRanks];
  std::uint32_t k = 0;
  if (gather || me == l.root)
    for (std::uint32_t d = 1; d < n; ++d) dsts[k++] = outs[(me + d) % n] + at;
  if (gather && outs[me] + at != in) dsts[k++] = outs[me] + at;
  copy(dsts, k, in, s.len, false);
  publish(l, 2, epoch);
  if (!await(l, 2, epoch)) return;
  if (threadIdx.x == 0) mine->epoch[blockIdx.x] = epoch;
}

/// A larger reduce_scatter whose input lies in a registered window at the same offset on every
/// rank: each rank reduces its own block reading every peer's input where it is, with no staging
/// and no steps, into its own output. Round 0 says a rank has entered the call (its input is
/// written); round 1 that its reads of the peers' inputs are done, so each may use its input again.
/// Nothing is written into a peer. Launch bounds (…, 1): one block per SM is all a call needs, and
/// without it ptxas holds some of the types to half the registers and spills.
template <class T>
__global__ void __launch_bounds__(kThreads, 1) window_reduce(Launch l) {
  if (!begin_call(l)) return;
  __shared__ unsigned char* ins[kMaxRanks];
  window_pointers(l, l.window_in, l.send, ins);
  Flags* mine = flags(l, l.me);
  const std::uint32_t epoch = next_epoch(mine->epoch[blockIdx.x]);
  publish(l, 0, epoch);
  if (!await(l, 0, epoch)) return;
  const Range s = slice(l.bytes, blockIdx.x, l.blocks);
  const unsigned char* sources[kMaxRanks];
  for (std::uint32_t r = 0; r < l.ranks; ++r) sources[r] = ins[r] + l.me * l.bytes + s.at;
  unsigned char* out = static_cast<unsigned char*>(l.recv) + s.at;
  reduce_op<T>(l, &out, 1, sources, s.len);
  publish(l, 1, epoch);
  if (!await(l, 1, epoch)) return;
  if (threadIdx.x == 0) mine->epoch[blockIdx.x] = epoch;
}

/// A larger call, through the staging, of elements T (Launch::dtype): a kernel per type keeps
/// each one's registers to what its own reduction needs.
template <class T>
__global__ void __launch_bounds__(kThreads) collective(Launch l) {
  if (!begin_call(l)) return;
  const std::uint32_t i = blockIdx.x;
  const std::uint32_t n = l.ranks, me = l.me;
  auto* out = static_cast<unsigned char*>(l.recv);
  const auto* in = static_cast<const unsigned char*>(l.send);
  std::uint32_t epoch = flags(l, me)->epoch[i];
  // Staging is pushed: a rank writes what a peer needs into that peer's staging (slot `to_slot`
  // of it for this sender), and reads only its own, which its peers wrote. Bytes per step: of
  // each rank's input (all_reduce, all_gather, broadcast) or of each block of the output
  // (reduce_scatter), such that every slot a step uses fits one staging buffer.
  const std::uint32_t peers = n > 1 ? n - 1 : 1;
  const std::uint64_t per_peer = (l.chunk / peers) & ~std::uint64_t{15};
  const bool all_reduce = l.kind == kAllReduce;
  const bool one_shot = all_reduce && lesser(per_peer, l.bytes) * (n - 1) <= kOneShotBytes;
  // Two-shot all_reduce: a part per rank, sent in round 0 (to the slots at 0) and, reduced, in
  // round 1 (to the slots at `round1`).
  const std::uint64_t two_shot_part = (l.chunk / (2 * peers)) & ~std::uint64_t{15};
  const std::uint64_t piece = l.kind == kBroadcast ? l.chunk : all_reduce && !one_shot ? two_shot_part * n : per_peer;
  // Every step is cut like the first (the fullest) and the same way within a call: a block's
  // peers wait for that block only, so a block whose bytes moved to another in a shorter step
  // could still be reading them when a peer's other block writes them.
  const std::uint64_t first = lesser(piece, l.bytes);
  const std::uint64_t part = ((first + n - 1) / n + 15) & ~std::uint64_t{15};
  const std::uint64_t round1 = peers * two_shot_part;
  auto to_slot = [&](std::uint32_t from, std::uint32_t to) { return from < to ? from : from - 1; };
  auto part_range = [&](std::uint32_t q, std::uint64_t len) {
    const std::uint64_t p0 = lesser(len, q * part);
    return Range{p0, lesser(len, p0 + part) - p0};
  };
  // Two-shot all_reduce: a step's last phase (copying the peers' reduced parts out of this rank's
  // staging) runs in the next step beside the pushes of round 0, which keep the link busy.
  auto gather = [&](std::uint64_t at, std::uint64_t len, const unsigned char* from) {
    for (std::uint32_t q = 0; q < n; ++q) {
      if (q == me) continue;
      const Range p = part_range(q, len);
      const Range s = clip(slice(part, i, l.blocks), p.len);
      copy(out + at + p.at + s.at, from + round1 + to_slot(q, me) * two_shot_part + s.at, s.len, true);
    }
  };
  std::uint64_t gather_at = 0, gather_len = 0;
  const unsigned char* gather_from = nullptr;
  unsigned char* stages[kMaxRanks];
  const unsigned char* sources[kMaxRanks];
  unsigned char* targets[kMaxRanks];
  for (std::uint64_t at = 0; at < l.bytes; at += piece) {
    const std::uint64_t len = lesser(piece, l.bytes - at);
    epoch = next_epoch(epoch);
    const std::uint32_t b = epoch & 1;
    for (std::uint32_t r = 0; r < n; ++r) stages[r] = staging(l, r, b);
    unsigned char* mine = stages[me];
    switch (l.kind) {
      case kReduceScatter:
      case kAllReduce: {
        if (one_shot || l.kind == kReduceScatter) {
          // Each peer gets the step of the input it reduces: all of it in an all_reduce, its own
          // block (rank q's at q * bytes) in a reduce_scatter. Each rank reduces what it got.
          const std::uint64_t block = l.kind == kReduceScatter ? l.bytes : 0;
          const Range s = clip(slice(first, i, l.blocks), len);
          for (std::uint32_t q = 0; q < n; ++q)
            if (q != me) copy(stages[q] + to_slot(me, q) * per_peer + s.at, in + q * block + at + s.at, s.len, false);
          publish(l, 0, epoch);
          if (!await(l, 0, epoch)) return;
          for (std::uint32_t r = 0; r < n; ++r)
            sources[r] = r == me ? in + me * block + at + s.at : mine + to_slot(r, me) * per_peer + s.at;
          targets[0] = out + at + s.at;
          reduce_op<T>(l, targets, 1, sources, s.len);
          break;
        }
        // Two-shot all_reduce, a reduce-scatter then an all-gather: rank q reduces part q; block i
        // handles slice i of each.
        for (std::uint32_t q = 0; q < n; ++q) {
          if (q == me) continue;
          const Range p = part_range(q, len);
          const Range s = clip(slice(part, i, l.blocks), p.len);
          copy(stages[q] + to_slot(me, q) * two_shot_part + s.at, in + at + p.at + s.at, s.len, false);
        }
        if (gather_from) gather(gather_at, gather_len, gather_from);
        publish(l, 0, epoch);
        if (!await(l, 0, epoch)) return;
        {
          const Range p = part_range(me, len);
          const Range s = clip(slice(part, i, l.blocks), p.len);
          for (std::uint32_t r = 0; r < n; ++r)
            sources[r] = r == me ? in + at + p.at + s.at : mine + to_slot(r, me) * two_shot_part + s.at;
          std::uint32_t outs = 0;
          targets[outs++] = out + at + p.at + s.at;
          for (std::uint32_t q = 0; q < n; ++q)
            if (q != me) targets[outs++] = stages[q] + round1 + to_slot(me, q) * two_shot_part + s.at;
          reduce_op<T>(l, targets, outs, sources, s.len);
        }
        publish(l, 1, epoch);
        if (!await(l, 1, epoch)) return;
        // Copied out in the next step: the peers write this staging again two steps later, after
        // round 0 of the step between, which this rank publishes after the copy.
        gather_at = at;
        gather_len = len;
        gather_from = mine;
        break;
      }
      case kAllGather: {
        const Range s = clip(slice(first, i, l.blocks), len);
        std::uint32_t k = 0;
        for (std::uint32_t q = 0; q < n; ++q)
          if (q != me) targets[k++] = stages[q] + to_slot(me, q) * per_peer + s.at;
        targets[k++] = out + me * l.bytes + at + s.at;
        copy(targets, k, in + at + s.at, s.len, false);
        publish(l, 0, epoch);
        if (!await(l, 0, epoch)) return;
        for (std::uint32_t q = 0; q < n; ++q)
          if (q != me) copy(out + q * l.bytes + at + s.at, mine + to_slot(q, me) * per_peer + s.at, s.len, true);
        break;
      }
      default: {  // broadcast: from the root into every peer's staging, in place on every rank
        const Range s = clip(slice(first, i, l.blocks), len);
        auto* buffer = static_cast<unsigned char*>(l.recv);
        if (me == l.root) {
          std::uint32_t k = 0;
          for (std::uint32_t q = 0; q < n; ++q)
            if (q != me) targets[k++] = stages[q] + s.at;
          copy(targets, k, buffer + at + s.at, s.len, false);
        }
        publish(l, 0, epoch);
        if (!await(l, 0, epoch)) return;
        if (me != l.root) copy(buffer + at + s.at, mine + s.at, s.len, true);
        break;
      }
    }
    __syncthreads();
  }
  if (gather_from) gather(gather_at, gather_len, gather_from);
  if (threadIdx.x == 0) flags(l, me)->epoch[i] = epoch;
}

/// The staging's kernel of each DType, in its order.
using Kernel = void (*)(Launch);
constexpr Kernel kStaged[] = {collective<float>,        collective<__half>,       collective<__nv_bfloat16>,
                              collective<std::int32_t>, collective<std::int64_t>, collective<std::uint8_t>};
/// The window reduce_scatter's kernel of each DType, in its order.
constexpr Kernel kWindowReduce[] = {window_reduce<float>,         window_reduce<__half>,
                                    window_reduce<__nv_bfloat16>, window_reduce<std::int32_t>,
                                    window_reduce<std::int64_t>,  window_reduce<std::uint8_t>};

/// Each of `count` integers divided by `by`, truncating toward zero (a hierarchical Average's last
/// step after its Sums, which wrap in the element's width as the one-level kernels' do).
template <class T>
__global__ void __launch_bounds__(kThreads) divide_all(T* data, std::uint64_t count, std::uint32_t by) {
  using Wide = std::conditional_t<std::is_signed_v<T>, std::int64_t, std::uint64_t>;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride)
    data[i] = static_cast<T>(static_cast<Wide>(data[i]) / static_cast<Wide>(by));
}

/// Floating-point elements as f32, and back (divided, rounded once): the hierarchical path carries
/// f16 and bf16 sums between its levels in f32, so that a call rounds once, as on one level.
template <class T>
__global__ void __launch_bounds__(kThreads) widen_all(const T* from, float* to, std::uint64_t count) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride)
    to[i] = Elem<T>::load(from[i]);
}
template <class T>
__global__ void __launch_bounds__(kThreads)
    narrow_all(const float* from, T* to, std::uint64_t count, std::uint32_t by) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride)
    to[i] = Elem<T>::store(by == 1 ? from[i] : from[i] / static_cast<float>(by));
}

/// Blocks for an element-wise kernel over `count` elements.
unsigned elementwise_blocks(std::uint64_t count) {
  return static_cast<unsigned>(lesser(std::uint64_t{kBlocks}, (count + kThreads - 1) / kThreads));
}

}  // namespace

cudaError_t launch(const Launch& l, cudaStream_t stream, bool early) {
  const bool small = l.bytes <= kLLBytes;
  std::uint32_t blocks = l.blocks, threads = kThreads;
  if (small) {  // a thread per line of the block's slice, in whole warps: idle threads cost a small call
    blocks = small_blocks(l.bytes, l.blocks);
    const std::uint64_t lines = (((l.bytes + blocks - 1) / blocks + 15) & ~std::uint64_t{15}) / 8;
    threads = static_cast<std::uint32_t>(lesser(kThreads, (lines + 31) & ~std::uint64_t{31}));
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = early ? 1 : 0;
  if (small) return cudaLaunchKernelEx(&config, small_collective, l);
  if (l.dtype >= std::size(kStaged)) return cudaErrorInvalidValue;
  if (l.window_in) return cudaLaunchKernelEx(&config, kWindowReduce[l.dtype], l);
  if (l.window) return cudaLaunchKernelEx(&config, window_collective, l);
  return cudaLaunchKernelEx(&config, kStaged[l.dtype], l);
}

cudaError_t preload() {
  cudaFuncAttributes a{};
  if (auto e = cudaFuncGetAttributes(&a, small_collective); e != cudaSuccess) return e;
  if (auto e = cudaFuncGetAttributes(&a, window_collective); e != cudaSuccess) return e;
  for (Kernel k : kStaged)
    if (auto e = cudaFuncGetAttributes(&a, k); e != cudaSuccess) return e;
  for (Kernel k : kWindowReduce)
    if (auto e = cudaFuncGetAttributes(&a, k); e != cudaSuccess) return e;
  if (auto e = cudaFuncGetAttributes(&a, divide_all<std::int32_t>); e != cudaSuccess) return e;
  if (auto e = cudaFuncGetAttributes(&a, divide_all<std::int64_t>); e != cudaSuccess) return e;
  if (auto e = cudaFuncGetAttributes(&a, divide_all<std::uint8_t>); e != cudaSuccess) return e;
  if (auto e = cudaFuncGetAttributes(&a, widen_all<float>); e != cudaSuccess) return e;
  if (auto e = cudaFuncGetAttributes(&a, widen_all<__half>); e != cudaSuccess) return e;
  if (auto e = cudaFuncGetAttributes(&a, widen_all<__nv_bfloat16>); e != cudaSuccess) return e;
  if (auto e = cudaFuncGetAttributes(&a, narrow_all<float>); e != cudaSuccess) return e;
  if (auto e = cudaFuncGetAttributes(&a, narrow_all<__half>); e != cudaSuccess) return e;
  return cudaFuncGetAttributes(&a, narrow_all<__nv_bfloat16>);
}

cudaError_t divide(void* data, std::uint64_t count, std::uint32_t dtype, std::uint32_t by, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = elementwise_blocks(count);
  switch (dtype) {
    case kI32:
      divide_all<<<blocks, kThreads, 0, stream>>>(static_cast<std::int32_t*>(data), count, by);
      break;
    case kI64:
      divide_all<<<blocks, kThreads, 0, stream>>>(static_cast<std::int64_t*>(data), count, by);
      break;
    case kU8:
      divide_all<<<blocks, kThreads, 0, stream>>>(static_cast<std::uint8_t*>(data), count, by);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t widen(const void* from, float* to, std::uint64_t count, std::uint32_t dtype, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned blocks = elementwise_blocks(count);
  switch (dtype) {
    case kF32:
      widen_all<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(from), to, count);
      break;
    case kF16:
      widen_all<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(from), to, count);
      break;
    case kBF16:
      widen_all<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(from), to, count);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t narrow(const float* from, void* to, std::uint64_t count, std::uint32_t dtype, std::uint32_t by,
                   cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (by == 0) return cudaErrorInvalidValue;
  const unsigned blocks = elementwise_blocks(count);
  switch (dtype) {
    case kF32:
      narrow_all<<<blocks, kThreads, 0, stream>>>(from, static_cast<float*>(to), count, by);
      break;
    case kF16:
      narrow_all<<<blocks, kThreads, 0, stream>>>(from, static_cast<__half*>(to), count, by);
      break;
    case kBF16:
      narrow_all<<<blocks, kThreads, 0, stream>>>(from, static_cast<__nv_bfloat16*>(to), count, by);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t resident_blocks(int device, std::int32_t* blocks) {
  int per_sm = 0, sms = 0;
  if (auto e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, small_collective, kThreads, 0); e != cudaSuccess)
    return e;
  auto fewest = [&](Kernel k) {
    int n = 0;
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreads, 0);
    per_sm = n < per_sm ? n : per_sm;
    return e;
  };
  for (Kernel k : kStaged)
    if (auto e = fewest(k); e != cudaSuccess) return e;
  for (Kernel k : kWindowReduce)
    if (auto e = fewest(k); e != cudaSuccess) return e;
  if (auto e = fewest(window_collective); e != cudaSuccess) return e;
  if (auto e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) return e;
  *blocks = per_sm * sms;
  return cudaSuccess;
}

}  // namespace lavaflow::mesh::cuda_kernels
