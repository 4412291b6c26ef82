// SPDX-License-Identifier: MIT
#pragma once
// A headless GL context on the Vulkan context's device, or the reason there is none.
#include <string>

#include "lavaflow/lavaflow.hpp"
#include "lavaflow/opengl/opengl.hpp"

namespace lftest {

struct GlSetup {
  lavaflow::gl::EglHeadless egl;
  lavaflow::gl::Interop gl;
};

/// EGL context on `ctx`'s device, made current, with its importer; the error says why not.
inline lavaflow::Result<GlSetup> gl_for(const lavaflow::VulkanContext& ctx) {
  LF_TRY(auto egl, lavaflow::gl::EglHeadless::create(ctx.capabilities().identity.device_uuid));
  LF_TRY_STATUS(egl.make_current());
  LF_TRY(auto gl, lavaflow::gl::Interop::create());
  return GlSetup{std::move(egl), std::move(gl)};
}

/// The bytes of a GL buffer as GL's GPU sees them: a GL copy into a GL-owned buffer, read back.
/// (Reading an imported buffer with glGetBufferSubData directly is not enough: NVIDIA's GL may
/// answer from what it read before, although the exporter has changed the memory since.)
inline std::vector<std::byte> gl_read(GLuint buffer, std::uint64_t offset, std::uint64_t size) {
  std::vector<std::byte> out(size);
  if (size == 0) return out;
  GLuint scratch = 0;
  glCreateBuffers(1, &scratch);
  glNamedBufferStorage(scratch, static_cast<GLsizeiptr>(size), nullptr, GL_DYNAMIC_STORAGE_BIT);
  glCopyNamedBufferSubData(buffer, scratch, static_cast<GLintptr>(offset), 0, static_cast<GLsizeiptr>(size));
  glGetNamedBufferSubData(scratch, 0, static_cast<GLsizeiptr>(size), out.data());
  glDeleteBuffers(1, &scratch);
  return out;
}

}  // namespace lftest
