// SPDX-License-Identifier: MIT
// lavaflow::opengl from the installed package: a headless EGL context and the interop's checks.
#include <cstdio>
#include <lavaflow/opengl/opengl.hpp>

int main() {
  auto egl = lavaflow::gl::EglHeadless::create();
  if (!egl) return std::printf("LAVAFLOW-SKIP: opengl: %s\n", egl.error().message().c_str()), 77;
  if (!egl->make_current()) return 1;
  auto gl = lavaflow::gl::Interop::create();
  if (!gl) return std::printf("opengl: %s\n", gl.error().message().c_str()), 1;
  std::printf("opengl: interop ready\n");
}
