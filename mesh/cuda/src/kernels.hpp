// SPDX-License-Identifier: MIT
#pragma once
// The CUDA collectives' kernels behind a plain launcher (nvcc never sees lava-flow's C++23
// headers). Each rank's region of CUDA memory, mapped by every peer, starts with its flags and
// holds its LL areas and two staging buffers after them.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace lavaflow::mesh::cuda_kernels {

inline constexpr std::uint32_t kMaxRanks = 16;
/// Blocks per call at most. A communicator runs the same number on every rank (fewer where ranks
/// share a GPU: every rank's blocks must be resident at once): block i of every rank handles the
/// same slices and synchronises only with block i of the others.
inline constexpr std::uint32_t kBlocks = 64;
inline constexpr std::uint32_t kThreads = 512;
inline constexpr std::uint64_t kFlagBytes = 32 << 10;
/// Calls that move at most this many bytes between two ranks (all_reduce, all_gather, broadcast:
/// the input; reduce_scatter: one block of it) travel in LL lines instead of the staging: the
/// sender writes 16-byte lines of two 8-byte words, each four data bytes beside the call's epoch,
/// straight into the receiver's region, and the receiver polls its own memory until every word
/// carries the epoch — no fence, no flag and no read across the link. Lines double the bytes on
/// the link; up to this size the staging's fences and flags cost more (measured on NVLink: about
/// a quarter less time at half this size, about even at twice it).
inline constexpr std::uint64_t kLLBytes = 512 << 10;
/// A small call runs a block per this many bytes per rank pair, up to the communicator's blocks:
/// blocks with nothing to move would still cost the launch and the kernel's end.
inline constexpr std::uint64_t kLLBytesPerBlock = 1 << 10;
/// One sender's LL area in a receiver's region, per parity: a header word per block, then lines.
inline constexpr std::uint64_t kLLHeaderBytes = kBlocks * 8;
inline constexpr std::uint64_t kLLSenderBytes = kLLHeaderBytes + 2 * kLLBytes;
/// The LL areas of a region of `ranks` ranks (two parities, a sender each), after the flags.
__host__ __device__ constexpr std::uint64_t ll_area_bytes(std::uint32_t ranks) {
  return 2 * std::uint64_t{ranks} * kLLSenderBytes;
}
/// An all_reduce whose step makes each rank receive at most this many bytes, (n − 1) × step, is
/// one-shot: every rank pushes its whole step to every peer and reduces all of it (one
/// synchronisation); above it each rank reduces one part and pushes the result (two). Between two
/// ranks both move the same bytes, and the second synchronisation is what two-shot adds.
inline constexpr std::uint64_t kOneShotBytes = 4 << 20;
/// Windows a communicator registers at most (CudaCollectives::register_window).
inline constexpr std::uint32_t kMaxWindows = 32;
/// An all_gather or broadcast of at least this many bytes per rank whose output lies in a window
/// is written by the peers in place, and a reduce_scatter whose input lies in one reads its peers'
/// inputs where they are. Smaller ones take the staging even so: writing in place needs a second
/// synchronisation (the peers' writes have landed), which costs a mid-sized all_gather more than
/// the staging's copy out (measured on NVLink; about even at half this size). The reduce_scatter
/// shares the threshold; it was measured faster than the staging from twice this size up.
inline constexpr std::uint64_t kWindowBytes = 16 << 20;

enum Kind : std::uint32_t { kAllReduce = 1, kAllGather, kReduceScatter, kBroadcast };
/// kPeerMismatch: a peer found that a third rank made another call (this rank cannot tell which of
/// the two made the same call as itself).
enum Failure : std::uint32_t { kNone = 0, kTimeout, kMismatch, kPeerFailed, kCorrupt, kPeerMismatch };

/// A failure as a rank records it: what (Failure), the peer it names, and kPeerMismatch's third
/// rank. Packed in one word, (third << 16) | (rank << 8) | code: Flags::failed, and the low word
/// of the ErrorRecord.
struct FailureWord {
  std::uint32_t code, rank, third;
};
__host__ __device__ constexpr std::uint32_t pack(FailureWord f) { return (f.third << 16) | (f.rank << 8) | f.code; }
__host__ __device__ constexpr FailureWord unpack(std::uint32_t word) {
  return {word & 0xff, (word >> 8) & 0xff, (word >> 16) & 0xff};
}
static_assert(kMaxRanks <= 0x100, "a rank takes 8 bits of a FailureWord");
static_assert(unpack(pack({kPeerMismatch, kMaxRanks - 1, kMaxRanks - 2})).third == kMaxRanks - 2);

/// Where a rank's kernels report the first failure (host memory mapped into the device): one
/// word, (call << 32) | pack(FailureWord), written once.
struct ErrorRecord {
  unsigned long long packed;
};

/// Where every rank's region is mapped in this process, written once when the communicator opens:
/// the kernels read it from device memory rather than take it with every call.
struct Group {
  unsigned char* regions[kMaxRanks];
};

/// The start of each rank's region (then its LL areas, then its two staging buffers).
struct Flags {
  /// Per sender, block and round: (epoch << 32) | call signature, written by that sender's block
  /// into this rank's region when its data of that round is in place here (this rank polls its
  /// own memory; the sender's store crosses the link once).
  /// Rounds 0 and 1 serve the staging's steps, and a window call's three rounds all three.
  unsigned long long slot[kMaxRanks][kBlocks][3];
  /// Steps this rank's block has run: the same for every block between calls (a small call that
  /// runs fewer blocks sets the others' too). Read by that block only.
  std::uint32_t epoch[kBlocks];
  /// Set once when this rank has failed, to its ErrorRecord's low word: its peers stop waiting for
  /// it, and one that finds a mismatch here reports the mismatch rather than a failed rank (its own
  /// blocks may see this before the mismatching call).
  std::uint32_t failed;
  /// This rank's Group, which its kernels read.
  Group group;
  /// Where each registered window of every rank is mapped in this process (this rank's own is its
  /// pointer): written when the window is registered, read by this rank's kernels only.
  unsigned char* windows[kMaxWindows][kMaxRanks];
};
static_assert(sizeof(Flags) <= kFlagBytes);

/// A call: its kernel's parameter. The regions stay in the Group, out of it: a launch copies the
/// parameter, and its bytes cost the host on every call.
struct Launch {
  std::uint32_t kind, dtype, op, ranks, me, root;
  std::uint32_t signature;  ///< the same on every rank for the same call
  std::uint32_t call;       ///< the call's number, for errors
  std::uint32_t blocks;     ///< the communicator's blocks, 1 … kBlocks, the same on every rank
  /// 1 + the registered window that holds `recv` at the same offset on every rank (all_gather and
  /// broadcast of at least kWindowBytes: the peers write into it directly), or 0.
  std::uint32_t window;
  /// 1 + the registered window that holds `send` at the same offset on every rank (reduce_scatter
  /// of at least kWindowBytes: the peers read it where it is), or 0.
  std::uint32_t window_in;
  const Group* group;
  const void* send;
  void* recv;
  std::uint64_t bytes;  ///< as the API's `bytes`
  std::uint64_t chunk;  ///< one staging buffer
  std::uint64_t timeout_ns;
  ErrorRecord* error;
};

/// Enqueues the call's kernel. `early`: it may start before the kernel ahead of it on the stream
/// has ended (programmatic dependent launch, compute capability 9.0 and later) — it waits for that
/// kernel's work first thing and lets the next kernel start the same way, so back-to-back calls
/// do not pay a kernel launch each. Not for ranks that share a GPU: all their blocks must be
/// resident together, and blocks launched early take room.
cudaError_t launch(const Launch& l, cudaStream_t stream, bool early);
/// Divides each of `count` integer elements (I32, I64 or U8: `dtype` as DType) at `data` by `by`
/// on `stream`, truncating toward zero. cudaErrorInvalidValue for another type.
cudaError_t divide(void* data, std::uint64_t count, std::uint32_t dtype, std::uint32_t by, cudaStream_t stream);
/// Each of `count` floating-point elements (F32, F16 or BF16: `dtype` as DType) at `from` as f32
/// at `to` on `stream`, exactly. cudaErrorInvalidValue for another type.
cudaError_t widen(const void* from, float* to, std::uint64_t count, std::uint32_t dtype, cudaStream_t stream);
/// Each of `count` f32 elements at `from` divided by `by` (1: not divided) and rounded once, to
/// nearest even, into `dtype` (F32, F16 or BF16) at `to` on `stream`; `to` may be `from` for F32.
cudaError_t narrow(const float* from, void* to, std::uint64_t count, std::uint32_t dtype, std::uint32_t by,
                   cudaStream_t stream);
/// Loads the kernels' module into the current context.
cudaError_t preload();
/// Blocks of the collectives' kernel that `device` holds at once.
cudaError_t resident_blocks(int device, std::int32_t* blocks);

}  // namespace lavaflow::mesh::cuda_kernels
