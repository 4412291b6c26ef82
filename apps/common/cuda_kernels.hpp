// SPDX-License-Identifier: MIT
#pragma once
// Launchers of the kernels in cuda_kernels.cu (grid-stride loops, asynchronous on `s`).
#include <cuda_runtime_api.h>

cudaError_t lf_kernel_xor(void* dst, const void* src, unsigned char key, unsigned long long n, cudaStream_t s);
/// dst[i] = src[i] + 1 over `words` 32-bit words.
cudaError_t lf_kernel_add_one(void* dst, const void* src, unsigned long long words, cudaStream_t s);
/// 16-byte-vector copy of `bytes` (a multiple of 16).
cudaError_t lf_kernel_copy16(void* dst, const void* src, unsigned long long bytes, cudaStream_t s);
/// Inverts R, G and B of every pixel of an RGBA8 surface in place (alpha kept).
cudaError_t lf_kernel_invert_rgba8(cudaSurfaceObject_t surface, unsigned width, unsigned height, cudaStream_t s);
/// lavaflow-viewer's test image, frame `frame`, into `pixels` (width x height RGBA8, row-major).
cudaError_t lf_kernel_pattern(void* pixels, unsigned width, unsigned height, unsigned frame, cudaStream_t s);
/// Writes message `seq` (pattern.h's lf_message_word; 8-byte aligned `dst`, any size).
cudaError_t lf_kernel_fill_frame(void* dst, unsigned long long bytes, unsigned long long seq, cudaStream_t s);
/// Adds to `*errors` the number of words (and tail bytes) of `src` that differ from message `seq`
/// and, when some do, lowers `*first_bad` (if not null) to `seq`; sleeps about `delay_ns` in every
/// thread first (a slow reader, for tests of slot reuse); writes the global timer at its start to
/// `*stamp` (if not null).
cudaError_t lf_kernel_check_frame(const void* src, unsigned long long bytes, unsigned long long seq, unsigned delay_ns,
                                  unsigned long long* errors, unsigned long long* first_bad, unsigned long long* stamp,
                                  cudaStream_t s);
/// Writes the GPU's global timer (ns) to `*at` when the stream reaches it.
cudaError_t lf_kernel_stamp(unsigned long long* at, cudaStream_t s);
/// Copies `bytes` (a multiple of 16) from `src` to `dst`, first writing the global timer at its
/// start to `*stamp` (when not null).
cudaError_t lf_kernel_relay(void* dst, const void* src, unsigned long long bytes, unsigned long long* stamp,
                            cudaStream_t s);
/// Writes the global timer (ns) minus `*since` to `*out` when the stream reaches it.
cudaError_t lf_kernel_elapsed(const unsigned long long* since, unsigned long long* out, cudaStream_t s);
