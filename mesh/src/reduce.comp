// SPDX-License-Identifier: MIT
// The Vulkan collectives' reduction: out = op over every rank's input, all of them ranges of the
// one shared segment that every rank's device has imported. One invocation reduces one unit: a
// 32-bit word (one f32/i32, two f16/bf16, four u8) or, for i64, two words. The rules are those of
// the host reduction (mesh::reduce): f16 and bf16 accumulate in f32 and round once to nearest
// even; integer sums and products wrap in the element's width; Average divides the (wrapped) sum
// by the number of ranks, integers truncating toward zero. i64 is done in pairs of 32-bit words,
// so that no device needs shaderInt64.
#version 450

layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer Segment {
  uint w[];
}
seg;

layout(push_constant) uniform Params {
  uint src;     // word offset of rank 0's input
  uint stride;  // words from one rank's input to the next
  uint dst;     // word offset of the output (may be one of the inputs)
  uint units;   // units to reduce
  uint ranks;
}
p;

// The element type and the operation are fixed per pipeline, so that the inner loop has no
// branches on them.
layout(constant_id = 0) const uint DTYPE = 0u;  // mesh::DType
layout(constant_id = 1) const uint OP = 0u;     // mesh::ReduceOp

const uint F32 = 0u, F16 = 1u, BF16 = 2u, I32 = 3u, I64 = 4u, U8 = 5u;
const uint SUM = 0u, PRODUCT = 1u, MIN = 2u, MAX = 3u, AVERAGE = 4u;

// NaN wins min and max, and ties keep the second operand, exactly as the host reduction.
float combine_f(float a, float b) {
  if (OP == PRODUCT) return a * b;
  if (OP == MIN) return isnan(a) || a < b ? a : b;
  if (OP == MAX) return isnan(a) || a > b ? a : b;
  return a + b;
}

int combine_i(int a, int b) {
  if (OP == PRODUCT) return a * b;
  if (OP == MIN) return min(a, b);
  if (OP == MAX) return max(a, b);
  return a + b;
}

uint combine_u8(uint a, uint b) {
  if (OP == PRODUCT) return (a * b) & 0xffu;
  if (OP == MIN) return min(a, b);
  if (OP == MAX) return max(a, b);
  return (a + b) & 0xffu;
}

// Round to nearest even, as the host's to_f16; NaN stays NaN, overflow becomes infinity.
uint to_f16(float f) {
  const uint x = floatBitsToUint(f);
  const uint sign = (x >> 16) & 0x8000u;
  const uint e = (x >> 23) & 0xffu;
  uint m = x & 0x7fffffu;
  if (e == 255u) return sign | 0x7c00u | (m != 0u ? 0x200u : 0u);
  const int ee = int(e) - 112;  // rebias 127 → 15
  if (ee >= 31) return sign | 0x7c00u;
  if (ee <= 0) {  // subnormal half (or zero)
    if (ee < -10) return sign;
    m |= 0x800000u;
    const uint shift = uint(14 - ee);
    uint h = m >> shift;
    const uint rest = m & ((1u << shift) - 1u);
    const uint half_way = 1u << (shift - 1u);
    if (rest > half_way || (rest == half_way && (h & 1u) != 0u)) h += 1u;
    return sign | h;
  }
  uint h = sign | (uint(ee) << 10) | (m >> 13);
  const uint rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) h += 1u;  // a carry into the exponent is right
  return h;
}

float from_f16(uint h) { return unpackHalf2x16(h).x; }

uint to_bf16(float f) {
  const uint x = floatBitsToUint(f);
  if (isnan(f)) return (x >> 16) | 0x40u;
  return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

float from_bf16(uint h) { return uintBitsToFloat(h << 16); }

// a / n rounded to nearest even, as the host divides. A shader's division may be off by an ulp
// (it need not be correctly rounded), so the quotient is formed by integer long division of the
// significand instead (exact for normal quotients; a GPU may flush subnormal ones anyway); n beyond
// 128 leaves too few quotient bits and takes the shader's division.
float divide(float a, uint n) {
  if (a == 0.0 || isinf(a) || isnan(a) || n > 128u) return a / float(n);
  const uint x = floatBitsToUint(a);
  const uint biased = (x >> 23) & 0xffu;
  uint m = x & 0x7fffffu;
  int e = -149;
  if (biased != 0u) {
    m |= 0x800000u;
    e = int(biased) - 150;
  }
  const int lift = 31 - findMSB(m);  // the significand's top bit to bit 31
  const uint num = m << uint(lift);
  uint q = num / n;
  const bool sticky = num % n != 0u;
  const int shift = findMSB(q) - 23;  // at least 1 for n <= 128
  const uint dropped = q & ((1u << uint(shift)) - 1u);
  const uint half_way = 1u << uint(shift - 1);
  q >>= uint(shift);
  if (dropped > half_way || (dropped == half_way && (sticky || (q & 1u) != 0u))) q += 1u;
  const float r = ldexp(float(q), e - lift + shift);
  return (x & 0x80000000u) != 0u ? -r : r;
}

float half_of(uint word, uint lane) {
  const uint h = (word >> (16u * lane)) & 0xffffu;
  return DTYPE == F16 ? from_f16(h) : from_bf16(h);
}

uint round_half(float f) { return DTYPE == F16 ? to_f16(f) : to_bf16(f); }

// 64-bit two's complement integers as (low, high) words.
uvec2 add64(uvec2 a, uvec2 b) {
  uint carry;
  const uint lo = uaddCarry(a.x, b.x, carry);
  return uvec2(lo, a.y + b.y + carry);
}

uvec2 mul64(uvec2 a, uvec2 b) {
  uint hi, lo;
  umulExtended(a.x, b.x, hi, lo);
  return uvec2(lo, hi + a.x * b.y + a.y * b.x);
}

bool less64(uvec2 a, uvec2 b) {
  if (a.y != b.y) return int(a.y) < int(b.y);
  return a.x < b.x;
}

uvec2 negate64(uvec2 a) { return add64(~a, uvec2(1u, 0u)); }

// Signed quotient truncated toward zero; n is small (the number of ranks).
uvec2 divide64(uvec2 a, uint n) {
  const bool negative = int(a.y) < 0;
  const uvec2 v = negative ? negate64(a) : a;
  const uint hi = v.y / n;
  uint rest = v.y % n;
  uint lo = 0u;
  for (int bit = 31; bit >= 0; --bit) {
    rest = (rest << 1) | ((v.x >> uint(bit)) & 1u);
    lo <<= 1;
    if (rest >= n) {
      rest -= n;
      lo |= 1u;
    }
  }
  const uvec2 q = uvec2(lo, hi);
  return negative ? negate64(q) : q;
}

uvec2 combine64(uvec2 a, uvec2 b) {
  if (OP == PRODUCT) return mul64(a, b);
  if (OP == MIN) return less64(b, a) ? b : a;
  if (OP == MAX) return less64(a, b) ? b : a;
  return add64(a, b);
}

void reduce_unit(uint u) {
  if (DTYPE == I64) {
    const uint at = 2u * u;
    uvec2 acc = uvec2(seg.w[p.src + at], seg.w[p.src + at + 1u]);
    for (uint r = 1u; r < p.ranks; ++r) {
      const uint q = p.src + r * p.stride + at;
      acc = combine64(acc, uvec2(seg.w[q], seg.w[q + 1u]));
    }
    if (OP == AVERAGE) acc = divide64(acc, p.ranks);
    seg.w[p.dst + at] = acc.x;
    seg.w[p.dst + at + 1u] = acc.y;
    return;
  }
  const uint first = seg.w[p.src + u];
  uint result = 0u;
  if (DTYPE == F32) {
    float acc = uintBitsToFloat(first);
    for (uint r = 1u; r < p.ranks; ++r) acc = combine_f(acc, uintBitsToFloat(seg.w[p.src + r * p.stride + u]));
    if (OP == AVERAGE) acc = divide(acc, p.ranks);
    result = floatBitsToUint(acc);
  } else if (DTYPE == I32) {
    int acc = int(first);
    for (uint r = 1u; r < p.ranks; ++r) acc = combine_i(acc, int(seg.w[p.src + r * p.stride + u]));
    if (OP == AVERAGE) acc /= int(p.ranks);
    result = uint(acc);
  } else if (DTYPE == F16 || DTYPE == BF16) {
    vec2 acc = vec2(half_of(first, 0u), half_of(first, 1u));
    for (uint r = 1u; r < p.ranks; ++r) {
      const uint word = seg.w[p.src + r * p.stride + u];
      acc = vec2(combine_f(acc.x, half_of(word, 0u)), combine_f(acc.y, half_of(word, 1u)));
    }
    if (OP == AVERAGE) acc = vec2(divide(acc.x, p.ranks), divide(acc.y, p.ranks));
    result = round_half(acc.x) | (round_half(acc.y) << 16);
  } else {  // U8
    uvec4 acc = uvec4(first & 0xffu, (first >> 8) & 0xffu, (first >> 16) & 0xffu, first >> 24);
    for (uint r = 1u; r < p.ranks; ++r) {
      const uint word = seg.w[p.src + r * p.stride + u];
      acc = uvec4(combine_u8(acc.x, word & 0xffu), combine_u8(acc.y, (word >> 8) & 0xffu),
                  combine_u8(acc.z, (word >> 16) & 0xffu), combine_u8(acc.w, word >> 24));
    }
    if (OP == AVERAGE) acc /= p.ranks;
    result = acc.x | (acc.y << 8) | (acc.z << 16) | (acc.w << 24);
  }
  seg.w[p.dst + u] = result;
}

void main() {
  const uint total = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  for (uint u = gl_GlobalInvocationID.x; u < p.units; u += total) reduce_unit(u);
}
