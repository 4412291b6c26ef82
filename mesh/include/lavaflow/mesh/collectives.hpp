// SPDX-License-Identifier: MIT
#pragma once
// Collectives over a process group, the same on every backend: element types, reduce operations,
// the host reduction they share, asynchronous handles, and the per-rank Communicator interface.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/duration.hpp"
#include "lavaflow/core/error.hpp"

namespace lavaflow::mesh {

enum class DType : std::uint8_t { F32, F16, BF16, I32, I64, U8 };
enum class ReduceOp : std::uint8_t { Sum, Product, Min, Max, Average };

[[nodiscard]] std::size_t size_of(DType t) noexcept;
[[nodiscard]] std::string_view to_string(DType t) noexcept;
[[nodiscard]] std::string_view to_string(ReduceOp op) noexcept;

/// IEEE half and bfloat16 conversions (round to nearest even; NaN stays NaN).
[[nodiscard]] std::uint16_t to_f16(float v) noexcept;
[[nodiscard]] float from_f16(std::uint16_t h) noexcept;
[[nodiscard]] std::uint16_t to_bf16(float v) noexcept;
[[nodiscard]] float from_bf16(std::uint16_t h) noexcept;

/// Reduces `inputs` element-wise into `out` (which may be one of the inputs): every span holds the
/// same whole number of `type` elements. f16 and bf16 accumulate in f32 and round once; Average
/// divides the sum by the number of inputs (an integer sum wraps in the element's width first,
/// then the quotient truncates toward zero). Integer Sum and Product wrap modulo 2^bits.
[[nodiscard]] Status reduce(std::span<const std::span<const std::byte>> inputs, std::span<std::byte> out, DType type,
                            ReduceOp op);

/// f16 or bf16 `inputs` reduced element-wise into f32 `out`, not rounded to the type (Average
/// sums; the caller divides as it narrows): partials that cross hosts this way keep a call to one
/// rounding, as on one host, and within the type's range wherever the result is.
[[nodiscard]] Status reduce_wide(std::span<const std::span<const std::byte>> inputs, std::span<float> out, DType type,
                                 ReduceOp op);
/// f16 or bf16 elements as f32 (backends whose libraries have no such types reduce them so).
[[nodiscard]] std::vector<float> widen(std::span<const std::byte> data, DType type);
/// f32 values back into f16 or bf16 elements of `out`, each divided by `divisor` first, rounded once.
void narrow(std::span<const float> values, std::span<std::byte> out, DType type, float divisor = 1);

/// data[i] /= n for every element (Average's last step after a Sum); integers truncate toward
/// zero, f16 and bf16 divide in f32 and round once.
[[nodiscard]] Status divide(std::span<std::byte> data, DType type, std::uint64_t n);

/// A collective or point-to-point call in flight. wait() and test() report its result; a Work
/// that is dropped while in flight is waited for first, so the buffers it uses stay valid until
/// it ends.
class Work {
 public:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::optional<Status> result;
    /// Set by backends whose calls advance in the caller's thread (MPI requests, shared-memory
    /// steps): wait() and test() call it, and it finishes this state when the call has ended.
    std::function<void()> progress;
    void finish(Status s);
  };
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  Work(Work&& o) noexcept
      : state_(std::move(o.state_)), error_(std::move(o.error_)), ended_(std::exchange(o.ended_, false)) {}
  Work& operator=(Work&& o) noexcept;
  ~Work();
  /// The call's result once it has ended; Timeout (the call goes on) when `timeout` runs out first.
  [[nodiscard]] Status wait(Duration timeout = kForever);
  /// Whether the call has ended (its result then comes from wait()).
  [[nodiscard]] bool test() const;
  /// A Work that has already ended with `result`.
  [[nodiscard]] static Work done(Status result);

 private:
  [[nodiscard]] bool test_ended() const;
  std::shared_ptr<State> state_;
  // A call that ended before it returned: `ended_`, with its error when it failed — behind a
  // pointer, so that a Work moves as a few words on the path of every small call.
  std::unique_ptr<Error> error_;
  bool ended_ = false;
};

/// Per-call options. Every collective ends within `timeout`: when a rank of the group does not
/// take part in time, every rank that did gets Timeout naming the group and, where the backend can
/// tell (native, Mock), the missing ranks; the MPI and NCCL backends cannot, and say so.
struct CallOptions {
  Duration timeout = std::chrono::seconds(60);
};

/// One rank's view of one process group. Buffers are bytes holding `type` elements; `send` may be
/// the same memory as `recv` (in place). Calls are matched across ranks by their order within the
/// group, so every rank must make the same calls in the same order (as with MPI and NCCL).
class Communicator {
 public:
  virtual ~Communicator() = default;
  [[nodiscard]] virtual const std::string& group() const = 0;
  /// This rank's index in the group (0 … size − 1) and the group's size.
  [[nodiscard]] virtual std::uint32_t rank() const = 0;
  [[nodiscard]] virtual std::uint32_t size() const = 0;
  [[nodiscard]] virtual std::string_view backend() const = 0;

  /// recv = op over every rank's send; all spans the same length.
  [[nodiscard]] virtual Work all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, DType type,
                                        ReduceOp op, CallOptions options = {}) = 0;
  /// recv (size × send's length) = every rank's send, in rank order.
  [[nodiscard]] virtual Work all_gather(std::span<const std::byte> send, std::span<std::byte> recv, DType type,
                                        CallOptions options = {}) = 0;
  /// Every rank's buffer becomes `root`'s.
  [[nodiscard]] virtual Work broadcast(std::span<std::byte> buffer, std::uint32_t root, DType type,
                                       CallOptions options = {}) = 0;
  /// recv (send's length ÷ size) = this rank's block of op over every rank's send. In place,
  /// recv is this rank's block of send (the native backend refuses any other overlap).
  [[nodiscard]] virtual Work reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType type,
                                            ReduceOp op, CallOptions options = {}) = 0;
  [[nodiscard]] virtual Work barrier(CallOptions options = {}) = 0;
  /// Point to point within the group: a send is matched by the recv of the same tag on `peer`
  /// (group ranks), in order; recv's buffer must be exactly the length sent.
  [[nodiscard]] virtual Work send(std::span<const std::byte> buffer, std::uint32_t peer, std::uint32_t tag = 0,
                                  CallOptions options = {}) = 0;
  [[nodiscard]] virtual Work recv(std::span<std::byte> buffer, std::uint32_t peer, std::uint32_t tag = 0,
                                  CallOptions options = {}) = 0;

  /// Memory the group's other ranks on this host can read where it is (the native backend's
  /// shared segment): an all_reduce whose send lies in it takes no copy in. It lasts as long as
  /// the communicator. Unsupported on backends without such memory, and when the group was opened
  /// without room for it.
  [[nodiscard]] virtual Result<std::span<std::byte>> allocate(std::size_t bytes) {
    (void)bytes;
    return fail(Errc::Unsupported, "mesh::Communicator::allocate",
                str_format("the {} backend has no shared memory to allocate", backend()));
  }
};

/// Opens this rank's communicator over some of a group's ranks (`ranks`: group ranks, each once,
/// this rank among them, in the order that numbers them: rank i of the result is ranks[i]) on the
/// group's backend, under the name `name`. Collective over those ranks. mesh::subgroups() makes
/// one from a mesh's factory.
using SubgroupOpener = std::function<Result<std::unique_ptr<Communicator>>(const std::string& name,
                                                                           const std::vector<std::uint32_t>& ranks)>;

}  // namespace lavaflow::mesh
