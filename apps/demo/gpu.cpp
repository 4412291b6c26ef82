// SPDX-License-Identifier: MIT
#include "gpu.hpp"

#include "lavaflow/core/detail/format.hpp"

namespace lfdemo {

using namespace lavaflow;

namespace {

template <class T, class Cuda, class Vulkan>
Result<std::unique_ptr<T>> pick(std::string_view api, Cuda&& cuda, Vulkan&& vulkan) {
  if (api == "cuda") return cuda();
  if (api == "vulkan") return vulkan();
  auto first = cuda();
  if (first) return first;
  // Vulkan compute is the broader path: its reason is the one that says why no GPU took part.
  return vulkan();
}

}  // namespace

Result<std::unique_ptr<GpuWriter>> make_gpu_writer(const Producer& producer, std::string_view api) {
  return pick<GpuWriter>(
      api, [&] { return make_cuda_writer(producer); }, [&] { return make_vulkan_writer(producer); });
}

Result<std::unique_ptr<GpuVerifier>> make_gpu_verifier(const Consumer& consumer, std::string_view api) {
  return pick<GpuVerifier>(
      api, [&] { return make_cuda_verifier(consumer); }, [&] { return make_vulkan_verifier(consumer); });
}

#if !LAVAFLOW_DEMO_CUDA
Result<std::unique_ptr<GpuWriter>> make_cuda_writer(const Producer&) {
  return fail(Errc::Unsupported, "CUDA", "built without CUDA");
}
Result<std::unique_ptr<GpuVerifier>> make_cuda_verifier(const Consumer&) {
  return fail(Errc::Unsupported, "CUDA", "built without CUDA");
}
#endif

#if !LAVAFLOW_DEMO_VULKAN_GPU
Result<std::unique_ptr<GpuWriter>> make_vulkan_writer(const Producer&) {
  return fail(Errc::Unsupported, "Vulkan compute", "built without glslc");
}
Result<std::unique_ptr<GpuVerifier>> make_vulkan_verifier(const Consumer&) {
  return fail(Errc::Unsupported, "Vulkan compute", "built without glslc");
}
#endif

}  // namespace lfdemo
