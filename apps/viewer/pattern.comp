#version 450
// lavaflow-viewer's producer: writes frame `frame` of the test image into a ring buffer of RGBA8
// texels (row-major, row 0 at the top).
#extension GL_GOOGLE_include_directive : require
#include "pattern.h"

layout(local_size_x = 16, local_size_y = 16) in;
layout(std430, binding = 0) writeonly buffer Pixels { uint pixels[]; };
layout(push_constant) uniform Frame { uint width; uint height; uint frame; } pc;

void main() {
  uint x = gl_GlobalInvocationID.x, y = gl_GlobalInvocationID.y;
  if (x >= pc.width || y >= pc.height) return;
  pixels[y * pc.width + x] = lf_pattern(x, y, pc.width, pc.height, pc.frame);
}
