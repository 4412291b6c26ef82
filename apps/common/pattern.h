/* SPDX-License-Identifier: MIT */
/* The viewer's animated test image, one formula for every writer and checker: the Vulkan compute
 * shader (GLSL, through glslc's #include), the CUDA kernel and the C++ side (CPU writer, screenshot
 * check). Integer arithmetic only, so every writer produces the same bytes and a screenshot can be
 * compared exactly. Written in the subset of syntax that GLSL 4.50, CUDA and C++ share. */
#ifndef LAVAFLOW_VIEWER_PATTERN_H
#define LAVAFLOW_VIEWER_PATTERN_H

#if defined(GL_core_profile) || defined(GL_ES)
#define LF_U32 uint
#define LF_FN
#else
#define LF_U32 unsigned
#if defined(__CUDACC__)
#define LF_FN __host__ __device__ inline
#else
#define LF_FN inline
#endif
#endif

/* Triangle wave 0..period..0 of t. */
LF_FN LF_U32 lf_triangle(LF_U32 t, LF_U32 period) {
  LF_U32 m = t % (2u * period);
  return m < period ? m : 2u * period - m;
}

/* RGBA8 pixel (x, y) of frame `frame` of a width x height image, packed little-endian (R lowest):
 * a colour ramp scrolling with the frame, concentric rings around a point bouncing across the image,
 * and a moving XOR weave. Alpha 255. */
LF_FN LF_U32 lf_pattern(LF_U32 x, LF_U32 y, LF_U32 width, LF_U32 height, LF_U32 frame) {
  LF_U32 cx = lf_triangle(frame * 3u, width > 1u ? width - 1u : 1u);
  LF_U32 cy = lf_triangle(frame * 2u, height > 1u ? height - 1u : 1u);
  LF_U32 dx = x > cx ? x - cx : cx - x;
  LF_U32 dy = y > cy ? y - cy : cy - y;
  LF_U32 rings = ((dx * dx + dy * dy) >> 5u) + frame * 4u;
  LF_U32 r = (x * 255u / (width > 1u ? width - 1u : 1u) + frame) & 255u;
  LF_U32 g = (rings & 64u) != 0u ? 255u - (rings & 63u) * 2u : (rings & 63u) * 2u;
  LF_U32 b = ((x + frame) ^ (y + frame * 2u)) & 255u;
  return r | (g << 8u) | (b << 16u) | (255u << 24u);
}

#if defined(GL_core_profile) || defined(GL_ES)
/* lf_message_word below for shaders without 64-bit integers: values as (low, high) 32-bit halves,
 * arithmetic modulo 2^64 like the C version. */
uvec2 lf_add64(uvec2 a, uvec2 b) {
  uint carry;
  uint lo = uaddCarry(a.x, b.x, carry);
  return uvec2(lo, a.y + b.y + carry);
}
uvec2 lf_mul64(uvec2 a, uvec2 b) {
  uint hi, lo;
  umulExtended(a.x, b.x, hi, lo);
  return uvec2(lo, hi + a.x * b.y + a.y * b.x);
}
uvec2 lf_message_word2(uvec2 seq, uint i) {
  return lf_add64(lf_mul64(lf_add64(seq, uvec2(1u, 0u)), uvec2(0x7F4A7C15u, 0x9E3779B9u)),
                  lf_mul64(uvec2(i, 0u), uvec2(0xD192ED03u, 0xD1B54A32u)));
}
#else
/* 64-bit word `i` of message `seq` of the demo, the benchmarks and the tests (lfapp::fill_message):
 * a message is these words, then as many tail bytes as its size needs, byte j being the top byte of
 * word j. Every word depends on both numbers, so a verifier catches a message from another sequence,
 * a torn message or a single corrupted byte. */
LF_FN unsigned long long lf_message_word(unsigned long long seq, unsigned long long i) {
  return (seq + 1ull) * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull;
}
#endif

#endif
