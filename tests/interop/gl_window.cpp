// SPDX-License-Identifier: MIT
// lavaflow::opengl in a window: a GLFW window (GLX, under Xvfb in CI) instead of headless EGL.
// Imports a Vulkan buffer and image, checks both byte-exact through GL, writes back through GL and
// checks with Vulkan. Exit 0 on success, 77 (skip) without a display or a Vulkan/GL device.
#include <GL/glew.h>
#include <GLFW/glfw3.h>

#include <cstdio>
#include <vector>

#include "gl_support.hpp"
#include "vk_helpers.hpp"

using namespace lavaflow;

int skip(const std::string& why) {
  std::printf("LAVAFLOW-SKIP: %s\n", why.c_str());
  return 77;
}

int fail(const std::string& why) {
  std::fprintf(stderr, "FAILED: %s\n", why.c_str());
  return 1;
}

int main() {
  if (!glfwInit()) return skip("glfwInit failed: no display (run under xvfb-run)");
  glfwWindowHint(GLFW_VISIBLE, GLFW_FALSE);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 4);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 5);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  GLFWwindow* win = glfwCreateWindow(64, 64, "lavaflow gl window test", nullptr, nullptr);
  if (!win) {
    glfwTerminate();
    return skip("no GL 4.5 window on this display");
  }
  glfwMakeContextCurrent(win);
  int rc = 0;
  {
    auto vk = VulkanContext::create();
    if (!vk) return skip("no Vulkan device: " + vk.error().message());
    auto gl = gl::Interop::create();  // GLEW under GLX: glewInit returns GLEW_OK here
    if (!gl) return skip(gl.error().message());
    if (auto ok = gl->check_device(vk->capabilities().identity.device_uuid, vk->capabilities().identity.driver_uuid,
                                   "window");
        !ok)
      return skip("the window's GL runs on another device: " + ok.error().message());
    std::printf("window GL: %s, %s\n", gl->capabilities().renderer.c_str(), gl->capabilities().version.c_str());
    const std::uint64_t n = 100003;
    auto buf = GpuBuffer::allocate(*vk, {.size = n});
    if (!buf) return fail(buf.error().message());
    if (auto e = lftest::gpu_fill(*vk, *buf, 21); !e.empty()) return fail(e);
    auto glbuf = gl->import_buffer(*buf);
    if (!glbuf) return fail(glbuf.error().message());
    if (lftest::first_mismatch(lftest::gl_read(glbuf->name(), glbuf->offset(), n), 21) != -1)
      rc = fail("Vulkan -> GL buffer differs");
    std::vector<std::byte> next(n);
    lftest::fill(next, 22);
    glNamedBufferSubData(glbuf->name(), 0, static_cast<GLsizeiptr>(n), next.data());
    glFinish();
    if (auto e = lftest::gpu_check(*vk, *buf, 22); !e.empty()) rc = fail("GL -> Vulkan buffer: " + e);
    auto img = GpuImage::allocate(*vk, {.width = 97, .height = 31});
    if (!img) return fail(img.error().message());
    std::vector<std::byte> px(img->descriptor().packed_size());
    lftest::fill(px, 23);
    if (auto ok = upload_image(*vk, *img, px); !ok) return fail(ok.error().message());
    auto tex = gl->import_image(*img);
    if (!tex) return fail(tex.error().message());
    std::vector<std::byte> seen(px.size());
    glGetTextureImage(tex->name(), 0, GL_RGBA, GL_UNSIGNED_BYTE, static_cast<GLsizei>(seen.size()), seen.data());
    if (seen != px) rc = fail("Vulkan image -> GL texture differs");
    if (rc == 0) std::puts("gl window: buffer both ways and image to texture byte-exact");
  }
  glfwDestroyWindow(win);
  glfwTerminate();
  return rc;
}
