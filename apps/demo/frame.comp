#version 450
// lavaflow-demo on a GPU without CUDA: writes (CHECK == 0) or verifies (CHECK == 1) every word of
// one frame, the same words as the CPU and CUDA writers (pattern.h). Frames are words of 64 bits
// (two 32-bit halves here), then `bytes % 8` tail bytes, byte j being the top byte of word j.
#extension GL_GOOGLE_include_directive : require
#include "pattern.h"

layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) buffer Frame { uint halves[]; };
layout(std430, set = 0, binding = 1) buffer Counters { uint wrong_words; uint first_bad_frame; };
// corrupt: a byte to flip after writing it (the demo's corruption test); ~0u: none.
layout(push_constant) uniform Push { uvec2 seq; uint bytes; uint corrupt; } pc;

uvec2 expected(uint i) {
  uvec2 w = lf_message_word2(pc.seq, i);
  if (CHECK == 0 && pc.corrupt != 0xFFFFFFFFu && pc.corrupt / 8u == i) {
    uint b = pc.corrupt % 8u;
    if (b < 4u) w.x ^= 0x5Au << (8u * b); else w.y ^= 0x5Au << (8u * (b - 4u));
  }
  return w;
}

void main() {
  uint words = pc.bytes / 8u;
  uint stride = gl_NumWorkGroups.x * 256u;
  uint wrong = 0u;
  for (uint i = gl_GlobalInvocationID.x; i < words; i += stride) {
    uvec2 w = expected(i);
    if (CHECK == 0) {
      halves[2u * i] = w.x;
      halves[2u * i + 1u] = w.y;
    } else if (halves[2u * i] != w.x || halves[2u * i + 1u] != w.y) {
      ++wrong;
    }
  }
  // The tail: its bytes packed into one more word (the rest of that word is padding).
  if (gl_GlobalInvocationID.x == 0u && pc.bytes % 8u != 0u) {
    uvec2 t = uvec2(0u);
    uvec2 mask = uvec2(0u);
    for (uint k = 0u; k < pc.bytes % 8u; ++k) {
      uint top = lf_message_word2(pc.seq, words * 8u + k).y >> 24u;
      if (CHECK == 0 && pc.corrupt == words * 8u + k) top ^= 0x5Au;
      if (k < 4u) { t.x |= top << (8u * k); mask.x |= 0xFFu << (8u * k); }
      else { t.y |= top << (8u * (k - 4u)); mask.y |= 0xFFu << (8u * (k - 4u)); }
    }
    if (CHECK == 0) {
      halves[2u * words] = t.x;
      halves[2u * words + 1u] = t.y;
    } else if ((halves[2u * words] & mask.x) != t.x || (halves[2u * words + 1u] & mask.y) != t.y) {
      ++wrong;
    }
  }
  if (CHECK == 1 && wrong != 0u) {
    atomicAdd(wrong_words, wrong);
    atomicMin(first_bad_frame, pc.seq.x);
  }
}
