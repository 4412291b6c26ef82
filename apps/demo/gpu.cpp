// SPDX-License-Identifier: MIT
#include "gpu.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "cuda_kernels.hpp"
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
Result<cuda::Interop> interop_for(const VulkanContext* vk, bool timeline, const char* call) {
  if (!vk) return fail(Errc::Unsupported, call, "the ring is not in Vulkan memory");
  if (!timeline)
    return fail(Errc::Unsupported, call,
                str_format("device {} cannot share a timeline semaphore", vk->capabilities().identity.name));
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

}  // namespace

// ---------------------------------------------------------------------------------------------

struct GpuWriter::Impl {
  cuda::Interop cu;
  cuda::ChannelImports imports;
  cudaStream_t stream = nullptr;
  std::string device;
  explicit Impl(cuda::Interop c) : cu(std::move(c)), imports(cu) {}
  ~Impl() {
    if (stream) cudaStreamDestroy(stream);
  }
};

GpuWriter::GpuWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuWriter::~GpuWriter() = default;
const std::string& GpuWriter::device() const { return impl_->device; }

Result<std::unique_ptr<GpuWriter>> GpuWriter::create(const Producer& producer) {
  constexpr const char* call = "GpuWriter";
  LF_TRY(auto cu, interop_for(producer.vulkan(), producer.has_gpu_timeline(), call));
  if (producer.slot_size() < kStampBytes)
    return fail(Errc::InvalidArgument, call, "slots too small for the write stamp");
  auto impl = std::make_unique<Impl>(std::move(cu));
  LF_TRY_STATUS(impl->cu.make_current());
  DEMO_CUDA(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  LF_TRY_STATUS(load_kernels(impl->stream));
  impl->device = str_format("CUDA [{}] {}", impl->cu.device().ordinal, impl->cu.device().name);
  return std::unique_ptr<GpuWriter>(new GpuWriter(std::move(impl)));
}

Status GpuWriter::write(Loan& loan, std::uint64_t seq, std::uint64_t size, std::optional<std::uint64_t> corrupt) {
  auto& m = *impl_;
  LF_TRY(const auto* dst, m.imports.buffer(loan));
  LF_TRY_STATUS(m.imports.wait(m.stream, loan));
  auto* base = static_cast<unsigned char*>(dst->data());
  DEMO_CUDA(lf_kernel_fill_frame(base, size, seq, m.stream));
  if (corrupt && *corrupt < size) {
    const std::uint64_t j = *corrupt;
    const auto good = static_cast<unsigned char>(j < size / 8 * 8 ? lf_message_word(seq, j / 8) >> (8 * (j % 8))
                                                                  : lf_message_word(seq, j) >> 56);
    DEMO_CUDA(cudaMemsetAsync(base + j, good ^ 0x5a, 1, m.stream));
  }
  DEMO_CUDA(lf_kernel_stamp(reinterpret_cast<unsigned long long*>(base + stamp_offset(size)), m.stream));
  return m.imports.signal(m.stream, loan);
}

Status GpuWriter::finish(Duration timeout) { return wait_stream(impl_->stream, timeout, "GpuWriter::finish"); }

// ---------------------------------------------------------------------------------------------

struct GpuVerifier::Impl {
  cuda::Interop cu;
  cuda::ChannelImports imports;
  cudaStream_t stream = nullptr;
  unsigned long long* counters = nullptr;  // [0] wrong words, [1] first bad frame
  unsigned long long* latency = nullptr;   // kSamples
  std::uint64_t frames = 0;
  std::string device;
  explicit Impl(cuda::Interop c) : cu(std::move(c)), imports(cu) {}
  ~Impl() {
    if (stream) cudaStreamDestroy(stream);
    if (counters) cudaFree(counters);
    if (latency) cudaFree(latency);
  }
};

GpuVerifier::GpuVerifier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuVerifier::~GpuVerifier() = default;
const std::string& GpuVerifier::device() const { return impl_->device; }

Result<std::unique_ptr<GpuVerifier>> GpuVerifier::create(const Consumer& consumer) {
  constexpr const char* call = "GpuVerifier";
  LF_TRY(auto cu, interop_for(consumer.vulkan(), consumer.has_gpu_timeline(), call));
  if (!consumer.gpu_release_timeline())
    return fail(Errc::Unsupported, call, "the channel gives this consumer no release timeline");
  auto impl = std::make_unique<Impl>(std::move(cu));
  LF_TRY_STATUS(impl->cu.make_current());
  DEMO_CUDA(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  DEMO_CUDA(cudaMalloc(reinterpret_cast<void**>(&impl->counters), 2 * sizeof(unsigned long long)));
  DEMO_CUDA(cudaMalloc(reinterpret_cast<void**>(&impl->latency), kSamples * sizeof(unsigned long long)));
  const unsigned long long init[2] = {0, ~0ull};
  DEMO_CUDA(cudaMemcpy(impl->counters, init, sizeof init, cudaMemcpyHostToDevice));
  LF_TRY_STATUS(load_kernels(impl->stream));
  impl->device = str_format("CUDA [{}] {}", impl->cu.device().ordinal, impl->cu.device().name);
  return std::unique_ptr<GpuVerifier>(new GpuVerifier(std::move(impl)));
}

Status GpuVerifier::verify(Received& message) {
  auto& m = *impl_;
  const std::uint64_t size = message.info().size;
  if (stamp_offset(size) + kStampBytes > message.buffer().size())
    return fail(Errc::Malformed, "GpuVerifier::verify", "the frame leaves no room for its write stamp");
  LF_TRY(const auto* src, m.imports.buffer(message));
  LF_TRY_STATUS(m.imports.wait(m.stream, message));
  const auto* base = static_cast<const unsigned char*>(src->data());
  DEMO_CUDA(
      lf_kernel_check_frame(base, size, message.info().sequence, 0, m.counters, m.counters + 1, nullptr, m.stream));
  DEMO_CUDA(lf_kernel_elapsed(reinterpret_cast<const unsigned long long*>(base + stamp_offset(size)),
                              m.latency + m.frames % kSamples, m.stream));
  ++m.frames;
  return m.imports.release(m.stream, message);
}

Result<GpuVerifier::Report> GpuVerifier::finish(Duration timeout) {
  auto& m = *impl_;
  LF_TRY_STATUS(wait_stream(m.stream, timeout, "GpuVerifier::finish"));
  unsigned long long counters[2] = {};
  DEMO_CUDA(cudaMemcpy(counters, m.counters, sizeof counters, cudaMemcpyDeviceToHost));
  std::vector<unsigned long long> lat(std::min(m.frames, kSamples));
  if (!lat.empty()) DEMO_CUDA(cudaMemcpy(lat.data(), m.latency, lat.size() * sizeof lat[0], cudaMemcpyDeviceToHost));
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double q) {
    return lat.empty() ? 0.0 : double(lat[static_cast<std::size_t>(q * double(lat.size() - 1))]) / 1000;
  };
  return Report{m.frames, counters[0], counters[1], pct(0.5), pct(0.99)};
}

}  // namespace lfdemo
