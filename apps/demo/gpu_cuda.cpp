// SPDX-License-Identifier: MIT
// lavaflow-demo's GPU path through CUDA kernels on the imported ring.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "cuda_kernels.hpp"
#include "gpu.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/cuda/cuda.hpp"
#include "pattern.h"

namespace lfdemo {

using namespace lavaflow;

namespace {

#define DEMO_CUDA(expr)                                                                                \
  do {                                                                                                 \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) return std::unexpected(cuda::to_error(e_, #expr)); \
  } while (0)

/// Latency samples kept on the GPU (a ring: the last ones when a run has more frames).
constexpr std::uint64_t kSamples = 1 << 20;

Status wait_stream(cudaStream_t s, Duration timeout, const char* what) {
  const Deadline dl(timeout);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return {};
    if (e != cudaErrorNotReady) return std::unexpected(cuda::to_error(e, what));
    if (dl.passed()) return fail(Errc::Timeout, what, "the queued GPU work did not finish (is the peer alive?)");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

/// The CUDA device under a channel's Vulkan ring, when it has one and the channel orders GPU work.
Result<cuda::Interop> interop_for(const VulkanContext* vk, std::optional<GpuSyncKind> sync, const char* call) {
  if (!vk) return fail(Errc::Unsupported, call, "the ring is not in Vulkan memory");
  if (!sync)
    return fail(Errc::Unsupported, call,
                str_format("the channel orders no GPU work: device {} cannot share a timeline semaphore",
                           vk->capabilities().identity.name));
  auto cu = cuda::Interop::create(*vk);
  if (!cu) return std::unexpected(cu.error().within(call));
  return cu;
}

/// Loads every kernel before a stream can block on another process (lazy loading there deadlocks).
Status load_kernels(cudaStream_t s) {
  void* p = nullptr;
  DEMO_CUDA(cudaMalloc(&p, 4096));
  auto* w = static_cast<unsigned long long*>(p);
  const cudaError_t e = [&] {
    if (auto r = lf_kernel_fill_frame(p, 1024, 0, s); r != cudaSuccess) return r;
    if (auto r = lf_kernel_stamp(w + 200, s); r != cudaSuccess) return r;
    if (auto r = lf_kernel_check_frame(p, 1024, 0, 0, w + 201, w + 202, nullptr, s); r != cudaSuccess) return r;
    if (auto r = lf_kernel_elapsed(w + 200, w + 203, s); r != cudaSuccess) return r;
    return cudaStreamSynchronize(s);
  }();
  cudaFree(p);
  DEMO_CUDA(e);
  return {};
}

class CudaWriter final : public GpuWriter {
 public:
  explicit CudaWriter(cuda::Interop c) : cu_(std::move(c)), imports_(cu_) {}
  ~CudaWriter() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init() {
    LF_TRY_STATUS(cu_.make_current());
    DEMO_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return load_kernels(stream_);
  }

  Status write(Loan& loan, std::uint64_t seq, std::uint64_t size, std::optional<std::uint64_t> corrupt) override {
    LF_TRY(const auto* dst, imports_.buffer(loan));
    LF_TRY_STATUS(imports_.wait(stream_, loan));
    auto* base = static_cast<unsigned char*>(dst->data());
    DEMO_CUDA(lf_kernel_fill_frame(base, size, seq, stream_));
    if (corrupt && *corrupt < size) {
      const std::uint64_t j = *corrupt;
      const auto good = static_cast<unsigned char>(j < size / 8 * 8 ? lf_message_word(seq, j / 8) >> (8 * (j % 8))
                                                                    : lf_message_word(seq, j) >> 56);
      DEMO_CUDA(cudaMemsetAsync(base + j, good ^ 0x5a, 1, stream_));
    }
    DEMO_CUDA(lf_kernel_stamp(reinterpret_cast<unsigned long long*>(base + stamp_offset(size)), stream_));
    return imports_.signal(stream_, loan);
  }

  Status finish(Duration timeout) override { return wait_stream(stream_, timeout, "GpuWriter::finish"); }

  std::string description() const override {
    return str_format("CUDA [{}] {} (CUDA kernel, GPU-ordered hand-off)", cu_.device().ordinal, cu_.device().name);
  }

 private:
  cuda::Interop cu_;
  cuda::ChannelImports imports_;
  cudaStream_t stream_ = nullptr;
};

class CudaVerifier final : public GpuVerifier {
 public:
  explicit CudaVerifier(cuda::Interop c) : cu_(std::move(c)), imports_(cu_) {}
  ~CudaVerifier() override {
    if (stream_) cudaStreamDestroy(stream_);
    if (counters_) cudaFree(counters_);
    if (latency_) cudaFree(latency_);
  }

  Status init() {
    LF_TRY_STATUS(cu_.make_current());
    DEMO_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DEMO_CUDA(cudaMalloc(reinterpret_cast<void**>(&counters_), 2 * sizeof(unsigned long long)));
    DEMO_CUDA(cudaMalloc(reinterpret_cast<void**>(&latency_), kSamples * sizeof(unsigned long long)));
    const unsigned long long init[2] = {0, ~0ull};
    DEMO_CUDA(cudaMemcpy(counters_, init, sizeof init, cudaMemcpyHostToDevice));
    return load_kernels(stream_);
  }

  Status verify(Received& message) override {
    const std::uint64_t size = message.info().size;
    if (stamp_offset(size) + kStampBytes > message.buffer().size())
      return fail(Errc::Malformed, "GpuVerifier::verify", "the frame leaves no room for its write stamp");
    LF_TRY(const auto* src, imports_.buffer(message));
    LF_TRY_STATUS(imports_.wait(stream_, message));
    const auto* base = static_cast<const unsigned char*>(src->data());
    DEMO_CUDA(
        lf_kernel_check_frame(base, size, message.info().sequence, 0, counters_, counters_ + 1, nullptr, stream_));
    DEMO_CUDA(lf_kernel_elapsed(reinterpret_cast<const unsigned long long*>(base + stamp_offset(size)),
                                latency_ + frames_ % kSamples, stream_));
    ++frames_;
    return imports_.release(stream_, message);
  }

  Result<Report> finish(Duration timeout) override {
    LF_TRY_STATUS(wait_stream(stream_, timeout, "GpuVerifier::finish"));
    unsigned long long counters[2] = {};
    DEMO_CUDA(cudaMemcpy(counters, counters_, sizeof counters, cudaMemcpyDeviceToHost));
    std::vector<unsigned long long> lat(std::min(frames_, kSamples));
    if (!lat.empty()) DEMO_CUDA(cudaMemcpy(lat.data(), latency_, lat.size() * sizeof lat[0], cudaMemcpyDeviceToHost));
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double q) {
      return lat.empty() ? 0.0 : double(lat[static_cast<std::size_t>(q * double(lat.size() - 1))]) / 1000;
    };
    return Report{frames_, counters[0], counters[1], pct(0.5), pct(0.99), "GPU write done -> GPU verified"};
  }

  std::string description() const override {
    return str_format("CUDA [{}] {} (CUDA kernel, every word)", cu_.device().ordinal, cu_.device().name);
  }

 private:
  cuda::Interop cu_;
  cuda::ChannelImports imports_;
  cudaStream_t stream_ = nullptr;
  unsigned long long* counters_ = nullptr;  // [0] wrong words, [1] first bad frame
  unsigned long long* latency_ = nullptr;   // kSamples
  std::uint64_t frames_ = 0;
};

}  // namespace

Result<std::unique_ptr<GpuWriter>> make_cuda_writer(const Producer& producer) {
  constexpr const char* call = "CUDA writer";
  LF_TRY(auto cu, interop_for(producer.vulkan(), producer.gpu_sync(), call));
  if (producer.slot_size() < kStampBytes)
    return fail(Errc::InvalidArgument, call, "slots too small for the write stamp");
  auto w = std::make_unique<CudaWriter>(std::move(cu));
  LF_TRY_STATUS(w->init());
  return w;
}

Result<std::unique_ptr<GpuVerifier>> make_cuda_verifier(const Consumer& consumer) {
  constexpr const char* call = "CUDA verifier";
  LF_TRY(auto cu, interop_for(consumer.vulkan(), consumer.gpu_sync(), call));
  auto v = std::make_unique<CudaVerifier>(std::move(cu));
  LF_TRY_STATUS(v->init());
  return v;
}

}  // namespace lfdemo
