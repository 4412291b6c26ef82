// SPDX-License-Identifier: MIT
// lavaflow::mpi: MPI errors, the MPI transport's probe, GPU awareness and the shared argument checks.
#include "lavaflow/mpi/mpi.hpp"

#if __has_include(<mpi-ext.h>)  // Open MPI's extensions: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#include <mpi-ext.h>
#endif

#include "checks.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "ring.hpp"

namespace lavaflow::mpi {
namespace {

class MpiTransport final : public Transport {
 public:
  TransportKind kind() const override { return TransportKind::Mpi; }
  Probe can_connect(const ProcessLocation& me, const std::optional<ProcessLocation>& peer,
                    const TransportEnv&) const override {
    if (!peer) return {true, "MPI point-to-point (any rank)"};
    const auto scope = detect_scope(me, *peer);
    return {true, str_format("MPI point-to-point: {}", scope.reason)};
  }
  Result<std::unique_ptr<Buffer>> allocate(const TransportEnv& env, std::uint64_t size) const override {
    LF_TRY(auto block, detail::RingBlock::create(env, size));
    return std::unique_ptr<Buffer>(std::move(block));
  }
  Result<std::unique_ptr<Buffer>> import(const TransportEnv& env, const ExportDescriptor& desc,
                                         UniqueFd&& fd) const override {
    constexpr const char* call = "mpi transport: import";
    if (fd)
      return fail(Errc::InvalidArgument, call,
                  "a ring buffer over MPI does not travel as an fd (MPI moves its bytes), and an fd was given");
    // Only the shape is read: the memory is this side's own. (ExportDescriptor::validate is for
    // memory behind an fd, and refuses private memory.) Its kind is what this side makes: pinned
    // memory of TransportEnv::vulkan for GPU staging, private memory otherwise.
    const BufferKind mine = env.vulkan ? BufferKind::CpuGpuPinned : BufferKind::CpuPrivate;
    if (desc.kind != mine)
      return fail(Errc::InvalidArgument, call,
                  str_format("a {} ring buffer: over MPI this side's ring is {} memory{}", to_string(desc.kind),
                             to_string(mine), env.vulkan ? " (GPU staging)" : ""));
    if (desc.size == 0 || desc.offset != 0)
      return fail(Errc::InvalidArgument, call,
                  str_format("a ring buffer of {} bytes at offset {}: it must be non-empty and start at 0", desc.size,
                             desc.offset));
    return allocate(env, desc.size);
  }
};

}  // namespace

Status detail::check_channel(int channel, const char* call) {
  if (channel < 0 || channel > kMaxChannel)
    return fail(Errc::InvalidArgument, call, str_format("channel {} outside 0..{}", channel, kMaxChannel));
  return {};
}

Status detail::check_peer(const Communicator& comm, int peer, const char* call) {
  if (peer < 0 || peer >= comm.size() || peer == comm.rank())
    return fail(Errc::InvalidArgument, call,
                str_format("peer rank {} (this is rank {} of {})", peer, comm.rank(), comm.size()));
  return {};
}

Error to_error(int code, std::string call) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, text, &len);
  int cls = MPI_ERR_UNKNOWN;
  MPI_Error_class(code, &cls);
  const Errc e = cls == MPI_ERR_TRUNCATE                                             ? Errc::Malformed
                 : cls == MPI_ERR_RANK || cls == MPI_ERR_TAG || cls == MPI_ERR_COUNT ? Errc::InvalidArgument
                 : cls == MPI_ERR_NO_MEM                                             ? Errc::OutOfMemory
                                                                                     : Errc::System;
  return Error(e, std::move(call),
               str_format("MPI error class {}: {}", cls, std::string(text, static_cast<std::size_t>(len))));
}

std::shared_ptr<const Transport> mpi_transport() { return std::make_shared<MpiTransport>(); }

GpuAwareness gpu_awareness() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  const int yes = MPIX_Query_cuda_support();
  return {yes == 1, str_format("MPIX_Query_cuda_support() = {} (Open MPI built with CUDA support)", yes)};
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
  return {false, "Open MPI built without CUDA support (MPIX_CUDA_AWARE_SUPPORT = 0)"};
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int yes = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &yes) != MPI_SUCCESS)
    return {false, "MPIX_GPU_query_support(CUDA) failed"};
  return {yes != 0, str_format("MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA) = {}", yes)};
#else
  return {false, "this MPI library has no query for GPU support"};
#endif
}

}  // namespace lavaflow::mpi
