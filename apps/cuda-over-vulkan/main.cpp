// SPDX-License-Identifier: MIT
// cuda-over-vulkan — Vulkan allocates a buffer and an image, CUDA imports both, a CUDA kernel
// transforms them, Vulkan works on the results, and the two APIs take turns for many rounds ordered
// only by a shared timeline semaphore: no CPU wait inside the loop. At the end Vulkan reads back and
// verifies every word and every pixel.
//
//   cuda-over-vulkan [--rounds N] [--words N] [--width W] [--height H]
//
// Exit 0 when verified, 1 on a mismatch or error, 77 when there is no CUDA GPU under Vulkan.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli.hpp"
#include "cuda_kernels.hpp"
#include "lavaflow/cuda/cuda.hpp"
#include "lavaflow/lavaflow.hpp"

using namespace lavaflow;

namespace {

int die(const Error& e) {
  std::fprintf(stderr, "cuda-over-vulkan: %s\n", e.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t rounds = 1000, words = 1 << 20;
  std::uint32_t width = 1920, height = 1080;
  CLI::App app{
      "cuda-over-vulkan: a Vulkan buffer and image imported by CUDA; each round Vulkan copies the buffer\n"
      "(b = a) and CUDA computes a = b + 1 and inverts the image, ordered by one timeline semaphore.",
      "cuda-over-vulkan"};
  lfapp::add_whole(app, "--rounds", rounds, "rounds", 1, 1'000'000'000);
  lfapp::add_whole(app, "--words", words, "32-bit words in the buffer", 1, 1ull << 32);
  lfapp::add_whole(app, "--width", width, "image width", 1, 16384);
  lfapp::add_whole(app, "--height", height, "image height", 1, 16384);
  if (auto rc = lfapp::parse(app, argc, argv)) return *rc;
  auto devs = cuda::devices();
  if (!devs || devs->empty()) {
    std::printf("cuda-over-vulkan: skipped, no CUDA device (%s)\n", devs ? "none" : devs.error().message().c_str());
    return 77;
  }
  auto vk = VulkanContext::create({.device = devs->front().uuid});
  if (!vk) return die(vk.error());
  auto cu = cuda::Interop::create(*vk);
  if (!cu) return die(cu.error());
  std::printf("Vulkan and CUDA on %s (UUID %s)\n", cu->device().name.c_str(), to_string(cu->device().uuid).c_str());

  const std::uint64_t bytes = words * 4;
  auto a = GpuBuffer::allocate(*vk, {.size = bytes});
  auto b = GpuBuffer::allocate(*vk, {.size = bytes});
  auto img = GpuImage::allocate(*vk, {.width = width, .height = height, .format = PixelFormat::Rgba8});
  auto sem = GpuSemaphore::create(*vk, SemaphoreKind::Timeline);
  for (const Error* e :
       {a ? nullptr : &a.error(), b ? nullptr : &b.error(), img ? nullptr : &img.error(), sem ? nullptr : &sem.error()})
    if (e) return die(*e);
  std::vector<std::uint32_t> zero(words, 0);
  std::vector<std::byte> pixels(img->descriptor().packed_size());
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::byte>(i * 7 + i / 4096);
  if (auto ok = upload(*vk, *a, std::as_bytes(std::span(zero))); !ok) return die(ok.error());
  if (auto ok = upload_image(*vk, *img, pixels); !ok) return die(ok.error());

  auto ca = cu->import_buffer(*a);
  auto cb = cu->import_buffer(*b);
  auto arr = cu->import_image(*img);
  auto csem = cu->import_semaphore(*sem);
  for (const Error* e : {ca ? nullptr : &ca.error(), cb ? nullptr : &cb.error(), arr ? nullptr : &arr.error(),
                         csem ? nullptr : &csem.error()})
    if (e) return die(*e);
  cudaResourceDesc res{};
  res.resType = cudaResourceTypeArray;
  res.res.array.array = arr->level0();
  cudaSurfaceObject_t surface = 0;
  cudaStream_t stream = nullptr;
  if (auto ok = cuda::check(cudaCreateSurfaceObject(&surface, &res), "cudaCreateSurfaceObject"); !ok)
    return die(ok.error());
  if (auto ok = cuda::check(cudaStreamCreate(&stream), "cudaStreamCreate"); !ok) return die(ok.error());

  // One recorded Vulkan copy, resubmitted each round between timeline points.
  const auto& dev = vk->device();
  vk::raii::CommandPool pool(dev, {{}, vk->queue_family()});
  vk::raii::CommandBuffers cbs(dev, {*pool, vk::CommandBufferLevel::ePrimary, 1});
  cbs[0].begin({vk::CommandBufferUsageFlagBits::eSimultaneousUse});
  cbs[0].copyBuffer(a->buffer(), b->buffer(), vk::BufferCopy(0, 0, bytes));
  cbs[0].end();
  const vk::CommandBuffer raw = *cbs[0];
  const vk::Semaphore tl = sem->semaphore();
  const vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eTransfer;

  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < rounds; ++i) {
    const std::uint64_t wait = 2 * i, signal = 2 * i + 1;
    vk::TimelineSemaphoreSubmitInfo values(1, &wait, 1, &signal);
    vk::SubmitInfo submit(1, &tl, &stage, 1, &raw, 1, &tl, &values);
    vk->queue().submit(submit);  // Vulkan: b = a, after CUDA's previous round
    if (auto ok = csem->wait(stream, 2 * i + 1); !ok) return die(ok.error());
    if (auto ok = cuda::check(lf_kernel_add_one(ca->data(), cb->data(), words, stream), "add_one"); !ok)
      return die(ok.error());
    if (auto ok = cuda::check(lf_kernel_invert_rgba8(surface, width, height, stream), "invert"); !ok)
      return die(ok.error());
    if (auto ok = csem->signal(stream, 2 * i + 2); !ok) return die(ok.error());  // CUDA: a = b + 1, image inverted
  }
  if (auto ok = sem->wait(2 * rounds, std::chrono::seconds(60)); !ok) return die(ok.error());  // the only CPU wait
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  std::vector<std::uint32_t> out(words);
  std::vector<std::byte> img_out(pixels.size());
  if (auto ok = download(*vk, *a, std::as_writable_bytes(std::span(out))); !ok) return die(ok.error());
  if (auto ok = download_image(*vk, *img, img_out); !ok) return die(ok.error());
  std::uint64_t bad_words = 0, bad_pixels = 0;
  for (auto v : out) bad_words += v != rounds;
  for (std::size_t i = 0; i < pixels.size(); ++i) {
    const bool alpha = i % 4 == 3;
    const auto want =
        (rounds % 2 == 1 && !alpha) ? static_cast<std::byte>(255 - std::to_integer<int>(pixels[i])) : pixels[i];
    bad_pixels += img_out[i] != want;
  }
  cudaDestroySurfaceObject(surface);
  cudaStreamDestroy(stream);
  std::printf(
      "%llu rounds of Vulkan copy (%s) -> CUDA add-one + image invert (%ux%u) in %.1f ms (%.1f us per round), "
      "ordered by one timeline semaphore, no CPU wait in the loop\n",
      static_cast<unsigned long long>(rounds), std::to_string(bytes >> 20).append(" MiB").c_str(), width, height, ms,
      ms * 1000 / double(rounds));
  if (bad_words || bad_pixels) {
    std::printf("FAILED: %llu words and %llu pixel bytes differ\n", static_cast<unsigned long long>(bad_words),
                static_cast<unsigned long long>(bad_pixels));
    return 1;
  }
  std::printf("OK: every word is %llu and every pixel is as expected after %llu inversions\n",
              static_cast<unsigned long long>(rounds), static_cast<unsigned long long>(rounds));
  return 0;
}
