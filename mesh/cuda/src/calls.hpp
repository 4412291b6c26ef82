// SPDX-License-Identifier: MIT
#pragma once
// What the CUDA collectives' two paths (one host; hierarchical across hosts) share about a call:
// its name, the checks of its arguments, and a bounded wait for an event.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <thread>

#include "cuda_util.hpp"
#include "kernels.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh::cuda_calls {

/// "CudaCollectives::all_reduce" and so on: the API call's name.
inline std::string_view call_name(std::uint32_t kind) {
  switch (kind) {
    case cuda_kernels::kAllReduce:
      return "CudaCollectives::all_reduce";
    case cuda_kernels::kAllGather:
      return "CudaCollectives::all_gather";
    case cuda_kernels::kReduceScatter:
      return "CudaCollectives::reduce_scatter";
    default:
      return "CudaCollectives::broadcast";
  }
}

/// A call's arguments for a group of `ranks`, checked before anything is enqueued (a string only
/// for an error: this is every call's path).
inline Status check_arguments(std::uint32_t kind, const void* send, const void* recv, std::uint64_t bytes, DType type,
                              ReduceOp op, std::uint32_t root, std::uint32_t ranks) {
  const std::string_view call = call_name(kind);
  if (static_cast<std::uint8_t>(type) > static_cast<std::uint8_t>(DType::U8) ||
      static_cast<std::uint8_t>(op) > static_cast<std::uint8_t>(ReduceOp::Average))
    return fail(Errc::InvalidArgument, std::string(call), "unknown element type or reduce op");
  if (bytes > UINT64_MAX / 2 / ranks)  // the kernels address ranks × bytes
    return fail(Errc::InvalidArgument, std::string(call),
                str_format("{} bytes per rank overflow {} ranks' buffers", bytes, ranks));
  if (bytes % size_of(type))
    return fail(Errc::InvalidArgument, std::string(call),
                str_format("{} bytes are not whole {} elements", bytes, to_string(type)));
  if (bytes && (!send || !recv)) return fail(Errc::InvalidArgument, std::string(call), "a null buffer");
  if ((reinterpret_cast<std::uintptr_t>(send) | reinterpret_cast<std::uintptr_t>(recv)) % size_of(type))
    return fail(Errc::InvalidArgument, std::string(call),
                str_format("buffers not aligned to their {}-byte {} elements", size_of(type), to_string(type)));
  if (root >= ranks)
    return fail(Errc::InvalidArgument, std::string(call), str_format("root {} is not a rank of {}", root, ranks));
  return {};
}

/// Waits for `e` until `d`; Timeout from `call`, saying `late`, when it has not completed then.
inline Status wait_event(cudaEvent_t e, const Deadline& d, std::string_view call, std::string_view late) {
  for (;;) {
    const auto q = cudaEventQuery(e);
    if (q == cudaSuccess) return {};
    if (q != cudaErrorNotReady) return cuda_ok(q, "cudaEventQuery");
    if (d.passed()) return fail(Errc::Timeout, std::string(call), std::string(late));
    std::this_thread::yield();
  }
}

}  // namespace lavaflow::mesh::cuda_calls
