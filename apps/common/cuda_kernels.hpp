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
