// SPDX-License-Identifier: MIT
// --cuda: the producer's frames are written by a CUDA kernel straight into the channel's Vulkan ring
// buffers (imported into CUDA once each). Where the channel has a shared timeline semaphore, CUDA
// signals it in stream order and publish() hands off without any CPU wait.
#include <cuda_runtime_api.h>

#include <optional>
#include <unordered_map>

#include "cuda_kernels.hpp"
#include "frame_writer.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/cuda/cuda.hpp"

namespace lfviewer {

using namespace lavaflow;

namespace {

Status cuda_check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return {};
  return fail(Errc::Driver, call, cudaGetErrorString(e));
}

class CudaWriter final : public FrameWriter {
 public:
  CudaWriter(cuda::Interop interop, cudaStream_t stream)
      : interop_(std::move(interop)), stream_(stream), releases_(interop_) {}
  ~CudaWriter() override {
    (void)cudaStreamSynchronize(stream_);
    buffers_.clear();
    timeline_.reset();
    releases_ = cuda::ChannelImports(interop_);
    (void)cudaStreamDestroy(stream_);
  }

  Status init(const Producer& p) {
    if (const auto* t = p.gpu_timeline()) {
      LF_TRY(auto s, interop_.import_semaphore(*t));
      timeline_.emplace(std::move(s));
    }
    return {};
  }

  std::string description() const override {
    return str_format("CUDA kernel on the imported Vulkan memory ({}; hand-off {})", interop_.device().name,
                      timeline_ ? "through the shared timeline semaphore, no CPU wait" : "after a stream synchronize");
  }

  Status write_and_publish(Producer& p, Loan&& loan, const FrameShape& f, MessageInfo info) override {
    const lavaflow::Buffer& ring = loan.buffer();
    auto it = buffers_.find(&ring);
    if (it == buffers_.end()) {
      LF_TRY(auto ext, interop_.import_buffer(ring));
      it = buffers_.emplace(&ring, std::move(ext)).first;
    }
    if (std::uint64_t{f.width} * f.height * 4 > it->second.size())
      return fail(Errc::InvalidArgument, "CudaWriter",
                  str_format("a {}x{} frame does not fit a ring buffer", f.width, f.height));
    LF_TRY_STATUS(releases_.wait(stream_, loan));  // the viewer's GPU is done with the slot's last frame
    LF_TRY_STATUS(
        cuda_check(lf_kernel_pattern(it->second.data(), f.width, f.height, f.frame, stream_), "lf_kernel_pattern"));
    if (auto sync = timeline_ ? loan.gpu_signal() : std::nullopt) {
      LF_TRY_STATUS(timeline_->signal(stream_, sync->value));
    } else {
      LF_TRY_STATUS(cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    }
    LF_TRY_STATUS(p.publish(std::move(loan), info));
    return {};
  }

 private:
  cuda::Interop interop_;
  cudaStream_t stream_;
  std::optional<cuda::ExternalSemaphore> timeline_;
  std::unordered_map<const lavaflow::Buffer*, cuda::ExternalBuffer> buffers_;
  cuda::ChannelImports releases_;  // the consumers' release timelines, imported once
};

}  // namespace

Result<std::unique_ptr<FrameWriter>> make_cuda_writer(const Producer& p) {
  if (!p.vulkan())
    return fail(
        Errc::Unsupported, "lavaflow-viewer --cuda",
        str_format("the channel took route {}: CUDA needs Vulkan ring buffers", to_string(p.route().transport)));
  LF_TRY(auto interop, cuda::Interop::create(*p.vulkan()));
  cudaStream_t stream = nullptr;
  LF_TRY_STATUS(cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  auto w = std::make_unique<CudaWriter>(std::move(interop), stream);
  LF_TRY_STATUS(w->init(p));
  return std::unique_ptr<FrameWriter>(std::move(w));
}

}  // namespace lfviewer
