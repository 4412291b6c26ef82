// SPDX-License-Identifier: MIT
#pragma once
// Inputs and reference results for collectives tests: every rank's input is known to every rank,
// and the reference is computed on one rank in doubles, then encoded like the result.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "lavaflow/mesh/collectives.hpp"

namespace lftest::mesh_ref {

using lavaflow::mesh::DType;
using lavaflow::mesh::ReduceOp;
using lavaflow::mesh::to_bf16;
using lavaflow::mesh::to_f16;

/// Element `i` of rank `r`'s input, as a double, chosen so that every op stays exact in every type.
inline double value(std::uint32_t r, std::size_t i, DType t) {
  const double v = double((r * 7 + i * 3) % 5 + 1);  // 1 … 5
  return t == DType::U8 ? v : (i % 2 ? -v : v);
}

inline std::vector<std::byte> encode(const std::vector<double>& v, DType t) {
  std::vector<std::byte> out(v.size() * size_of(t));
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::byte* p = out.data() + i * size_of(t);
    switch (t) {
      case DType::F32: {
        const float f = float(v[i]);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::F16: {
        const auto h = to_f16(float(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::BF16: {
        const auto h = to_bf16(float(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::I32: {
        const auto x = static_cast<std::int32_t>(v[i]);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::I64: {
        const auto x = static_cast<std::int64_t>(v[i]);
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::U8: {
        const auto x = static_cast<std::uint8_t>(v[i]);
        std::memcpy(p, &x, 1);
        break;
      }
    }
  }
  return out;
}

inline std::vector<double> inputs(std::uint32_t r, std::size_t count, DType t) {
  std::vector<double> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value(r, i, t);
  return v;
}

/// Every rank's input of `count` elements, in rank order: what an all_gather gives every rank.
inline std::vector<std::byte> gathered(std::uint32_t ranks, std::size_t count, DType t) {
  std::vector<std::byte> all;
  for (std::uint32_t j = 0; j < ranks; ++j) {
    const auto e = encode(inputs(j, count, t), t);
    all.insert(all.end(), e.begin(), e.end());
  }
  return all;
}

/// The reference, computed on one rank in doubles (then encoded like the result).
inline std::vector<std::byte> expected(std::uint32_t ranks, std::size_t count, DType t, ReduceOp op) {
  std::vector<double> acc = inputs(0, count, t);
  for (std::uint32_t r = 1; r < ranks; ++r) {
    const auto in = inputs(r, count, t);
    for (std::size_t i = 0; i < count; ++i) switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Average:
          acc[i] += in[i];
          break;
        case ReduceOp::Product:
          acc[i] *= in[i];
          break;
        case ReduceOp::Min:
          acc[i] = std::min(acc[i], in[i]);
          break;
        case ReduceOp::Max:
          acc[i] = std::max(acc[i], in[i]);
          break;
      }
  }
  if (op == ReduceOp::Average)
    for (auto& a : acc)
      a = (t == DType::F32 || t == DType::F16 || t == DType::BF16) ? a / ranks : std::trunc(a / ranks);
  if (t == DType::U8)
    for (auto& a : acc) a = double(static_cast<std::uint8_t>(static_cast<std::int64_t>(a)));  // wraps
  return encode(acc, t);
}

constexpr DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max, ReduceOp::Average};

}  // namespace lftest::mesh_ref

namespace lftest::mesh_ref {
/// Rank r's f32 inputs with the values where backends are most likely to part from the host
/// reduction: NaN (first or second operand, for min and max only), signed zeros and ties.
inline std::vector<float> special_inputs(std::uint32_t r, bool with_nan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v = {r % 2 ? -0.0f : 0.0f, r % 2 ? 0.0f : -0.0f, 1.0f, float(r), -float(r) * 0.5f};
  if (with_nan) v.insert(v.end(), {r == 0 ? nan : 2.0f, r == 1 ? nan : 3.0f});
  return v;
}
/// The host reduction (lavaflow::mesh::reduce) of every rank's special_inputs: the definition the
/// device backends must match bit for bit.
inline std::vector<std::byte> special_expected(std::uint32_t ranks, lavaflow::mesh::ReduceOp op, bool with_nan) {
  std::vector<std::vector<float>> all;
  for (std::uint32_t r = 0; r < ranks; ++r) all.push_back(special_inputs(r, with_nan));
  std::vector<std::span<const std::byte>> in;
  for (const auto& v : all) in.push_back(std::as_bytes(std::span(v)));
  std::vector<std::byte> out(in[0].size());
  (void)lavaflow::mesh::reduce(in, out, lavaflow::mesh::DType::F32, op);
  return out;
}
}  // namespace lftest::mesh_ref
