// SPDX-License-Identifier: MIT
// Kernels for the CUDA adapter tests, samples and benchmarks, behind plain C++ launchers (nvcc does not
// compile lava-flow's C++23 headers; the callers do).
#include <cuda_runtime.h>

#include <cstdint>

namespace {

__global__ void xor_kernel(unsigned char* dst, const unsigned char* src, unsigned char key, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < n; i += 256ull * gridDim.x) dst[i] = src[i] ^ key;
}

__global__ void add_one_kernel(unsigned* dst, const unsigned* src, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < n; i += 256ull * gridDim.x) dst[i] = src[i] + 1;
}

__global__ void copy_kernel(uint4* dst, const uint4* src, unsigned long long n) {
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < n; i += 256ull * gridDim.x) dst[i] = src[i];
}

unsigned blocks(unsigned long long n) { return static_cast<unsigned>(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096); }

}  // namespace

cudaError_t lf_kernel_xor(void* dst, const void* src, unsigned char key, unsigned long long n, cudaStream_t s) {
  xor_kernel<<<blocks(n), 256, 0, s>>>(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), key,
                                       n);
  return cudaGetLastError();
}

cudaError_t lf_kernel_add_one(void* dst, const void* src, unsigned long long words, cudaStream_t s) {
  add_one_kernel<<<blocks(words), 256, 0, s>>>(static_cast<unsigned*>(dst), static_cast<const unsigned*>(src), words);
  return cudaGetLastError();
}

cudaError_t lf_kernel_copy16(void* dst, const void* src, unsigned long long bytes, cudaStream_t s) {
  const unsigned long long n = bytes / 16;
  copy_kernel<<<blocks(n) < 132 * 16 ? blocks(n) : 132 * 16, 256, 0, s>>>(static_cast<uint4*>(dst),
                                                                          static_cast<const uint4*>(src), n);
  return cudaGetLastError();
}

namespace {
__global__ void invert_kernel(cudaSurfaceObject_t s, unsigned w, unsigned h) {
  const unsigned x = blockIdx.x * 16 + threadIdx.x, y = blockIdx.y * 16 + threadIdx.y;
  if (x >= w || y >= h) return;
  uchar4 p;
  surf2Dread(&p, s, x * 4, y);
  p.x = 255 - p.x;
  p.y = 255 - p.y;
  p.z = 255 - p.z;
  surf2Dwrite(p, s, x * 4, y);
}
}  // namespace

cudaError_t lf_kernel_invert_rgba8(cudaSurfaceObject_t surface, unsigned width, unsigned height, cudaStream_t s) {
  invert_kernel<<<dim3((width + 15) / 16, (height + 15) / 16), dim3(16, 16), 0, s>>>(surface, width, height);
  return cudaGetLastError();
}

// lavaflow-viewer's test image (pattern.h: the same formula as its Vulkan shader).
#include "pattern.h"

namespace {
__global__ void pattern_kernel(unsigned* pixels, unsigned width, unsigned height, unsigned frame) {
  const unsigned x = blockIdx.x * 16 + threadIdx.x, y = blockIdx.y * 16 + threadIdx.y;
  if (x < width && y < height)
    pixels[static_cast<unsigned long long>(y) * width + x] = lf_pattern(x, y, width, height, frame);
}
}  // namespace

cudaError_t lf_kernel_pattern(void* pixels, unsigned width, unsigned height, unsigned frame, cudaStream_t s) {
  pattern_kernel<<<dim3((width + 15) / 16, (height + 15) / 16), dim3(16, 16), 0, s>>>(static_cast<unsigned*>(pixels),
                                                                                      width, height, frame);
  return cudaGetLastError();
}

// Messages in the pattern of pattern.h (lf_message_word), written and checked on the GPU.
namespace {
__global__ void fill_frame_kernel(unsigned long long* dst, unsigned long long bytes, unsigned long long seq) {
  const unsigned long long words = bytes / 8;
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < words; i += 256ull * gridDim.x)
    dst[i] = lf_message_word(seq, i);
  if (blockIdx.x == 0 && threadIdx.x < bytes - words * 8) {
    const unsigned long long j = words * 8 + threadIdx.x;
    reinterpret_cast<unsigned char*>(dst)[j] = static_cast<unsigned char>(lf_message_word(seq, j) >> 56);
  }
}

__global__ void check_frame_kernel(const unsigned long long* src, unsigned long long bytes, unsigned long long seq,
                                   unsigned delay_ns, unsigned long long* errors, unsigned long long* first_bad,
                                   unsigned long long* stamp) {
  if (stamp != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *stamp = t;
  }
  if (delay_ns != 0) __nanosleep(delay_ns);
  const unsigned long long words = bytes / 8;
  unsigned long long bad = 0;
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < words; i += 256ull * gridDim.x)
    bad += src[i] != lf_message_word(seq, i);
  if (blockIdx.x == 0 && threadIdx.x < bytes - words * 8) {
    const unsigned long long j = words * 8 + threadIdx.x;
    bad += reinterpret_cast<const unsigned char*>(src)[j] != static_cast<unsigned char>(lf_message_word(seq, j) >> 56);
  }
  if (bad != 0) {
    atomicAdd(errors, bad);
    if (first_bad != nullptr) atomicMin(first_bad, seq);
  }
}

__global__ void stamp_kernel(unsigned long long* at) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *at = t;
}

// One hop of a GPU ping-pong: stamps the time it starts (it starts once its stream's waits are
// met), then copies the frame it received into the frame it sends.
__global__ void relay_kernel(uint4* dst, const uint4* src, unsigned long long n, unsigned long long* stamp) {
  if (stamp != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *stamp = t;
  }
  for (unsigned long long i = blockIdx.x * 256ull + threadIdx.x; i < n; i += 256ull * gridDim.x) dst[i] = src[i];
}
}  // namespace

cudaError_t lf_kernel_fill_frame(void* dst, unsigned long long bytes, unsigned long long seq, cudaStream_t s) {
  fill_frame_kernel<<<blocks(bytes / 8), 256, 0, s>>>(static_cast<unsigned long long*>(dst), bytes, seq);
  return cudaGetLastError();
}

cudaError_t lf_kernel_check_frame(const void* src, unsigned long long bytes, unsigned long long seq, unsigned delay_ns,
                                  unsigned long long* errors, unsigned long long* first_bad, unsigned long long* stamp,
                                  cudaStream_t s) {
  check_frame_kernel<<<blocks(bytes / 8), 256, 0, s>>>(static_cast<const unsigned long long*>(src), bytes, seq,
                                                       delay_ns, errors, first_bad, stamp);
  return cudaGetLastError();
}

cudaError_t lf_kernel_stamp(unsigned long long* at, cudaStream_t s) {
  stamp_kernel<<<1, 1, 0, s>>>(at);
  return cudaGetLastError();
}

cudaError_t lf_kernel_relay(void* dst, const void* src, unsigned long long bytes, unsigned long long* stamp,
                            cudaStream_t s) {
  const unsigned long long n = bytes / 16;
  relay_kernel<<<blocks(n) < 132 * 16 ? blocks(n) : 132 * 16, 256, 0, s>>>(static_cast<uint4*>(dst),
                                                                           static_cast<const uint4*>(src), n, stamp);
  return cudaGetLastError();
}

namespace {
__global__ void elapsed_kernel(const unsigned long long* since, unsigned long long* out) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *out = t - *since;
}
}  // namespace

cudaError_t lf_kernel_elapsed(const unsigned long long* since, unsigned long long* out, cudaStream_t s) {
  elapsed_kernel<<<1, 1, 0, s>>>(since, out);
  return cudaGetLastError();
}
