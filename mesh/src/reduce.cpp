// SPDX-License-Identifier: MIT
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <thread>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/wait.hpp"
#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh {

std::size_t size_of(DType t) noexcept {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::F16:
    case DType::BF16:
      return 2;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
  }
  return 1;
}

std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U8:
      return "u8";
  }
  return "?";
}

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Product:
      return "product";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Average:
      return "average";
  }
  return "?";
}

std::uint16_t to_f16(float v) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(v);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t exp = (x >> 23) & 0xFFu;
  std::uint32_t mant = x & 0x7FFFFFu;
  if (exp == 0xFF) return static_cast<std::uint16_t>(sign | 0x7C00u | (mant ? 0x200u | (mant >> 13) : 0u));
  const int e = int(exp) - 127 + 15;
  if (e >= 31) return static_cast<std::uint16_t>(sign | 0x7C00u);  // too large: infinity
  // Rounds `m >> shift` to nearest, ties to even (a carry into the exponent is the right result).
  auto round = [](std::uint32_t m, int shift) {
    std::uint32_t r = m >> shift;
    const std::uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (r & 1u))) ++r;
    return r;
  };
  if (e <= 0) {  // subnormal half, or zero
    if (e < -10) return static_cast<std::uint16_t>(sign);
    return static_cast<std::uint16_t>(sign | round(mant | 0x800000u, 14 - e));
  }
  return static_cast<std::uint16_t>(sign | round((std::uint32_t(e) << 23) | mant, 13));
}

float from_f16(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0) {
    const float f = std::ldexp(float(mant), -24);
    return sign ? -f : f;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

std::uint16_t to_bf16(float v) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(v);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

float from_bf16(std::uint16_t h) noexcept { return std::bit_cast<float>(std::uint32_t(h) << 16); }

namespace {

// Element access per type: loaded into the accumulator type, stored back rounded or wrapped.
template <DType T>
struct Elem;
template <>
struct Elem<DType::F32> {
  using Acc = float;
  static Acc load(const std::byte* p) { return std::bit_cast<float>(raw<std::uint32_t>(p)); }
  static void store(std::byte* p, Acc v) { std::memcpy(p, &v, 4); }
  template <class U>
  static U raw(const std::byte* p) {
    U u;
    std::memcpy(&u, p, sizeof u);
    return u;
  }
};
template <>
struct Elem<DType::F16> {
  using Acc = float;
  static Acc load(const std::byte* p) { return from_f16(Elem<DType::F32>::raw<std::uint16_t>(p)); }
  static void store(std::byte* p, Acc v) {
    const std::uint16_t h = to_f16(v);
    std::memcpy(p, &h, 2);
  }
};
template <>
struct Elem<DType::BF16> {
  using Acc = float;
  static Acc load(const std::byte* p) { return from_bf16(Elem<DType::F32>::raw<std::uint16_t>(p)); }
  static void store(std::byte* p, Acc v) {
    const std::uint16_t h = to_bf16(v);
    std::memcpy(p, &h, 2);
  }
};
// Integers accumulate in 64 bits; sums and products wrap (computed unsigned), then are truncated
// to the element's width.
template <class Int>
struct IntElem {
  using Acc = std::int64_t;
  static Acc load(const std::byte* p) { return static_cast<Acc>(Elem<DType::F32>::raw<Int>(p)); }
  static void store(std::byte* p, Acc v) {
    const auto i = static_cast<Int>(v);
    std::memcpy(p, &i, sizeof i);
  }
};
template <>
struct Elem<DType::I32> : IntElem<std::int32_t> {};
template <>
struct Elem<DType::I64> : IntElem<std::int64_t> {};
template <>
struct Elem<DType::U8> : IntElem<std::uint8_t> {};

template <class Acc>
Acc combine(Acc a, Acc b, ReduceOp op) {
  if constexpr (std::is_integral_v<Acc>) {
    using U = std::make_unsigned_t<Acc>;
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Average:
        return static_cast<Acc>(static_cast<U>(a) + static_cast<U>(b));
      case ReduceOp::Product:
        return static_cast<Acc>(static_cast<U>(a) * static_cast<U>(b));
      case ReduceOp::Min:
        return std::min(a, b);
      case ReduceOp::Max:
        return std::max(a, b);
    }
  } else {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Average:
        return a + b;
      case ReduceOp::Product:
        return a * b;
      case ReduceOp::Min:  // NaN wins, as in the other backends' min/max
        return std::isnan(a) || a < b ? a : b;
      case ReduceOp::Max:
        return std::isnan(a) || a > b ? a : b;
    }
  }
  return a;
}

template <ReduceOp Op, class Acc>
inline Acc combine_as(Acc a, Acc b) {
  return combine(a, b, Op);
}

// Element-wise over chunks: every input's chunk is read before `out`'s is written, so `out` may
// be any of the inputs. The op is a template argument so that the inner loops vectorise.
template <DType T, ReduceOp Op>
void reduce_typed(std::span<const std::span<const std::byte>> inputs, std::span<std::byte> out) {
  using E = Elem<T>;
  using Acc = typename E::Acc;
  constexpr std::size_t kSize = T == DType::F32 || T == DType::I32 ? 4 : T == DType::I64 ? 8 : T == DType::U8 ? 1 : 2;
  constexpr std::size_t kChunk = 1024;
  std::array<Acc, kChunk> acc;
  const std::size_t count = out.size() / kSize;
  const auto n = static_cast<Acc>(inputs.size());
  for (std::size_t base = 0; base < count; base += kChunk) {
    const std::size_t len = std::min(kChunk, count - base);
    const std::byte* first = inputs[0].data() + base * kSize;
    for (std::size_t i = 0; i < len; ++i) acc[i] = E::load(first + i * kSize);
    for (std::size_t k = 1; k < inputs.size(); ++k) {
      const std::byte* in = inputs[k].data() + base * kSize;
      for (std::size_t i = 0; i < len; ++i) acc[i] = combine_as<Op>(acc[i], E::load(in + i * kSize));
    }
    std::byte* dst = out.data() + base * kSize;
    if constexpr (Op == ReduceOp::Average) {
      // An integer sum wraps in the element's width before it is divided (as in NCCL), so that
      // the result does not depend on how the ranks' sums were grouped.
      for (std::size_t i = 0; i < len; ++i) {
        if constexpr (std::is_integral_v<Acc>) {
          E::store(dst + i * kSize, acc[i]);
          acc[i] = E::load(dst + i * kSize);
        }
        acc[i] /= n;
      }
    }
    for (std::size_t i = 0; i < len; ++i) E::store(dst + i * kSize, acc[i]);
  }
}

template <DType T>
void reduce_op(std::span<const std::span<const std::byte>> inputs, std::span<std::byte> out, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return reduce_typed<T, ReduceOp::Sum>(inputs, out);
    case ReduceOp::Product:
      return reduce_typed<T, ReduceOp::Product>(inputs, out);
    case ReduceOp::Min:
      return reduce_typed<T, ReduceOp::Min>(inputs, out);
    case ReduceOp::Max:
      return reduce_typed<T, ReduceOp::Max>(inputs, out);
    case ReduceOp::Average:
      return reduce_typed<T, ReduceOp::Average>(inputs, out);
  }
}

}  // namespace

Status reduce(std::span<const std::span<const std::byte>> inputs, std::span<std::byte> out, DType type, ReduceOp op) {
  constexpr const char* call = "mesh::reduce";
  if (inputs.empty()) return fail(Errc::InvalidArgument, call, "nothing to reduce");
  const std::size_t elem = size_of(type);
  if (out.size() % elem != 0)
    return fail(Errc::InvalidArgument, call,
                str_format("{} bytes are not a whole number of {} elements", out.size(), to_string(type)));
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].size() != out.size())
      return fail(Errc::InvalidArgument, call,
                  str_format("input {} holds {} bytes, the output {}", k, inputs[k].size(), out.size()));
  switch (type) {
    case DType::F32:
      reduce_op<DType::F32>(inputs, out, op);
      break;
    case DType::F16:
      reduce_op<DType::F16>(inputs, out, op);
      break;
    case DType::BF16:
      reduce_op<DType::BF16>(inputs, out, op);
      break;
    case DType::I32:
      reduce_op<DType::I32>(inputs, out, op);
      break;
    case DType::I64:
      reduce_op<DType::I64>(inputs, out, op);
      break;
    case DType::U8:
      reduce_op<DType::U8>(inputs, out, op);
      break;
  }
  return {};
}

// ---------------------------------------------------------------------------------------------

namespace {
template <DType T>
void divide_typed(std::span<std::byte> data, std::uint64_t n) {
  using E = Elem<T>;
  constexpr std::size_t kSize = T == DType::F32 || T == DType::I32 ? 4 : T == DType::I64 ? 8 : T == DType::U8 ? 1 : 2;
  const auto by = static_cast<typename E::Acc>(n);
  for (std::size_t i = 0; i + kSize <= data.size(); i += kSize)
    E::store(data.data() + i, E::load(data.data() + i) / by);
}
}  // namespace

Status divide(std::span<std::byte> data, DType type, std::uint64_t n) {
  if (n == 0 || data.size() % size_of(type) != 0)
    return fail(Errc::InvalidArgument, "mesh::divide",
                str_format("{} bytes of {} by {}", data.size(), to_string(type), n));
  switch (type) {
    case DType::F32:
      divide_typed<DType::F32>(data, n);
      break;
    case DType::F16:
      divide_typed<DType::F16>(data, n);
      break;
    case DType::BF16:
      divide_typed<DType::BF16>(data, n);
      break;
    case DType::I32:
      divide_typed<DType::I32>(data, n);
      break;
    case DType::I64:
      divide_typed<DType::I64>(data, n);
      break;
    case DType::U8:
      divide_typed<DType::U8>(data, n);
      break;
  }
  return {};
}

namespace {
template <DType T, ReduceOp Op>
void reduce_wide_typed(std::span<const std::span<const std::byte>> inputs, std::span<float> out) {
  using E = Elem<T>;
  for (std::size_t i = 0; i < out.size(); ++i) {
    float acc = E::load(inputs[0].data() + 2 * i);
    for (std::size_t k = 1; k < inputs.size(); ++k) acc = combine_as<Op>(acc, E::load(inputs[k].data() + 2 * i));
    out[i] = acc;
  }
}

template <DType T>
void reduce_wide_op(std::span<const std::span<const std::byte>> inputs, std::span<float> out, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Average:
      return reduce_wide_typed<T, ReduceOp::Sum>(inputs, out);
    case ReduceOp::Product:
      return reduce_wide_typed<T, ReduceOp::Product>(inputs, out);
    case ReduceOp::Min:
      return reduce_wide_typed<T, ReduceOp::Min>(inputs, out);
    case ReduceOp::Max:
      return reduce_wide_typed<T, ReduceOp::Max>(inputs, out);
  }
}
}  // namespace

Status reduce_wide(std::span<const std::span<const std::byte>> inputs, std::span<float> out, DType type, ReduceOp op) {
  constexpr const char* call = "mesh::reduce_wide";
  if (type != DType::F16 && type != DType::BF16)
    return fail(Errc::InvalidArgument, call, str_format("{} is not f16 or bf16", to_string(type)));
  if (inputs.empty()) return fail(Errc::InvalidArgument, call, "nothing to reduce");
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].size() != out.size() * 2)
      return fail(Errc::InvalidArgument, call,
                  str_format("input {} holds {} bytes, not {} elements", k, inputs[k].size(), out.size()));
  if (type == DType::F16)
    reduce_wide_op<DType::F16>(inputs, out, op);
  else
    reduce_wide_op<DType::BF16>(inputs, out, op);
  return {};
}

std::vector<float> widen(std::span<const std::byte> data, DType type) {
  std::vector<float> out(data.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint16_t h;
    std::memcpy(&h, data.data() + 2 * i, 2);
    out[i] = type == DType::F16 ? from_f16(h) : from_bf16(h);
  }
  return out;
}

void narrow(std::span<const float> values, std::span<std::byte> out, DType type, float divisor) {
  for (std::size_t i = 0; i < values.size() && 2 * i + 2 <= out.size(); ++i) {
    const float v = divisor == 1 ? values[i] : values[i] / divisor;
    const std::uint16_t h = type == DType::F16 ? to_f16(v) : to_bf16(v);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
}

void Work::State::finish(Status s) {
  {
    std::lock_guard lock(mutex);
    result = std::move(s);
  }
  cv.notify_all();
}

Work& Work::operator=(Work&& o) noexcept {
  if (this != &o) {
    if (state_) (void)wait();
    state_ = std::move(o.state_);
    error_ = std::move(o.error_);
    ended_ = std::exchange(o.ended_, false);
  }
  return *this;
}

Work::~Work() {
  if (state_) (void)wait();
}

Status Work::wait(Duration timeout) {
  if (!state_) {
    if (ended_) return error_ ? Status(std::unexpected(*error_)) : Status{};
    return fail(Errc::InvalidArgument, "mesh::Work::wait", "this Work holds no call");
  }
  if (state_->progress) {
    // Polled: spin briefly (a peer's step takes microseconds), then yield the core — a peer that
    // shares this core runs only once this one yields — then nap.
    LF_TRY_STATUS(lavaflow::detail::wait_for(
        [&] {
          state_->progress();
          return test_ended();
        },
        lavaflow::detail::never_stop, lavaflow::detail::YieldThenNap{20000, std::chrono::microseconds(50)},
        WaitMode::SpinThenBlock, timeout, {.clock_every = 8, .relax = false, .spin_for = std::chrono::microseconds(10)},
        [] { return Error(Errc::Timeout, "mesh::Work::wait", "the call has not ended yet"); }));
    std::lock_guard lock(state_->mutex);
    return *state_->result;
  }
  const Deadline deadline(timeout);
  std::unique_lock lock(state_->mutex);
  auto ended = [&] { return state_->result.has_value(); };
  if (deadline.forever()) {
    state_->cv.wait(lock, ended);
  } else if (!state_->cv.wait_until(lock, deadline.at(), ended)) {
    return fail(Errc::Timeout, "mesh::Work::wait", "the call has not ended yet");
  }
  return *state_->result;
}

bool Work::test_ended() const {
  std::lock_guard lock(state_->mutex);
  return state_->result.has_value();
}

bool Work::test() const {
  if (!state_) return true;
  if (state_->progress && !test_ended()) state_->progress();
  return test_ended();
}

Work Work::done(Status result) {
  Work w;
  w.ended_ = true;
  if (!result) w.error_ = std::make_unique<Error>(std::move(result.error()));
  return w;
}

}  // namespace lavaflow::mesh
