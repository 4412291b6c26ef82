// SPDX-License-Identifier: MIT
// lavaflow-viewer's window: receives frames from the compute process and draws them with OpenGL.
// On the Vulkan route each ring buffer is imported into GL once (lavaflow::opengl, no copy) and read
// by the fragment shader as a buffer texture; on the shared-memory route (GL on another device, or
// no GL_EXT_memory_object_fd) the frame is uploaded instead, and the viewer says so.
#include <GL/glew.h>
#include <GLFW/glfw3.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/opengl/opengl.hpp"
#include "lavaflow/transports/local.hpp"
#include "pattern.h"
#include "png.hpp"
#include "viewer.hpp"

namespace lfviewer {

using namespace lavaflow;
using namespace std::chrono_literals;

namespace {

int die(const Error& e) { return report_failure("viewer", e); }

/// Where GL draws: a GLFW window, or a headless EGL context. Either way frames are drawn into an
/// offscreen framebuffer of the frame's exact size (what --screenshot reads), then shown.
class Surface {
 public:
  Surface() = default;
  Surface(const Surface&) = delete;
  Surface& operator=(const Surface&) = delete;
  ~Surface() {
    if (window_) glfwDestroyWindow(window_);
    if (glfw_) glfwTerminate();
  }

  Status open(bool headless, std::optional<Uuid> device) {
    if (!headless) {
      if (glfwInit()) {
        glfw_ = true;
        glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 4);
        glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 5);
        glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
        window_ = glfwCreateWindow(640, 360, "lavaflow-viewer", nullptr, nullptr);
        if (!window_) return fail(Errc::Unsupported, "glfwCreateWindow", "no OpenGL 4.5 core window on this display");
        glfwMakeContextCurrent(window_);
        glfwSwapInterval(0);  // the producer sets the pace
        return {};
      }
      std::printf("[viewer] no display (glfwInit failed): rendering headless through EGL\n");
    }
    LF_TRY(auto egl, gl::EglHeadless::create(device));
    LF_TRY_STATUS(egl.make_current());
    egl_.emplace(std::move(egl));
    return {};
  }

  /// Binds the context to this thread (again, for a new session) and checks that it works.
  [[nodiscard]] Status make_current() const {
    if (window_)
      glfwMakeContextCurrent(window_);
    else if (egl_)
      LF_TRY_STATUS(egl_->make_current());
    if (!glGetString(GL_RENDERER)) return fail(Errc::Driver, "viewer", "the GL context cannot be made current again");
    return {};
  }

  [[nodiscard]] bool windowed() const { return window_ != nullptr; }
  [[nodiscard]] bool closed() const {
    if (!window_) return false;
    glfwPollEvents();
    return glfwWindowShouldClose(window_);
  }
  void present(GLuint fbo, std::uint32_t w, std::uint32_t h) const {
    if (!window_) return;
    int fw = 0, fh = 0;
    glfwGetFramebufferSize(window_, &fw, &fh);
    glBindFramebuffer(GL_FRAMEBUFFER, 0);
    glClearColor(0, 0, 0, 1);
    glClear(GL_COLOR_BUFFER_BIT);
    // Letterbox: keep the frame's aspect ratio in whatever size the window has.
    const double s = std::min(double(fw) / w, double(fh) / h);
    const auto dw = static_cast<GLint>(w * s), dh = static_cast<GLint>(h * s);
    const GLint x0 = (fw - dw) / 2, y0 = (fh - dh) / 2;
    glBlitNamedFramebuffer(fbo, 0, 0, 0, static_cast<GLint>(w), static_cast<GLint>(h), x0, y0, x0 + dw, y0 + dh,
                           GL_COLOR_BUFFER_BIT, GL_LINEAR);
    glfwSwapBuffers(window_);
  }
  void set_title(const std::string& t) const {
    if (window_) glfwSetWindowTitle(window_, t.c_str());
  }
  void fit(std::uint32_t w, std::uint32_t h) const {
    if (window_) glfwSetWindowSize(window_, static_cast<int>(w), static_cast<int>(h));
  }

 private:
  bool glfw_ = false;
  GLFWwindow* window_ = nullptr;
  std::optional<gl::EglHeadless> egl_;
};

constexpr const char* kVertex = R"(#version 450 core
void main() {
  vec2 p = vec2((gl_VertexID << 1) & 2, gl_VertexID & 2);
  gl_Position = vec4(p * 2.0 - 1.0, 0.0, 1.0);
})";

// Row 0 of the frame is the top of the picture; GL's framebuffer row 0 is the bottom.
constexpr const char* kFragment = R"(#version 450 core
layout(binding = 0) uniform samplerBuffer frame;
layout(location = 0) uniform ivec2 size;
out vec4 color;
void main() {
  ivec2 p = ivec2(gl_FragCoord.xy);
  color = texelFetch(frame, (size.y - 1 - p.y) * size.x + p.x);
})";

Result<GLuint> compile(GLenum type, const char* src) {
  GLuint s = glCreateShader(type);
  glShaderSource(s, 1, &src, nullptr);
  glCompileShader(s);
  GLint ok = 0;
  glGetShaderiv(s, GL_COMPILE_STATUS, &ok);
  if (!ok) {
    char log[1024] = {};
    glGetShaderInfoLog(s, sizeof log, nullptr, log);
    glDeleteShader(s);
    return fail(Errc::Driver, "glCompileShader", log);
  }
  return s;
}

/// The program, the offscreen framebuffer and (shared-memory route) the upload buffer.
class Renderer {
 public:
  Renderer() = default;
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;
  ~Renderer() {
    glDeleteProgram(program_);
    glDeleteVertexArrays(1, &vao_);
    glDeleteFramebuffers(1, &fbo_);
    glDeleteRenderbuffers(1, &color_);
    glDeleteTextures(1, &upload_texture_);
    glDeleteBuffers(1, &upload_buffer_);
  }

  Status init() {
    LF_TRY(GLuint vs, compile(GL_VERTEX_SHADER, kVertex));
    auto fs = compile(GL_FRAGMENT_SHADER, kFragment);
    if (!fs) {
      glDeleteShader(vs);
      return std::unexpected(fs.error());
    }
    program_ = glCreateProgram();
    glAttachShader(program_, vs);
    glAttachShader(program_, *fs);
    glLinkProgram(program_);
    glDeleteShader(vs);
    glDeleteShader(*fs);
    GLint ok = 0;
    glGetProgramiv(program_, GL_LINK_STATUS, &ok);
    if (!ok) return fail(Errc::Driver, "glLinkProgram", "the viewer's shaders did not link");
    glCreateVertexArrays(1, &vao_);
    return {};
  }

  /// Draws the frame held by buffer texture `texture` into the offscreen framebuffer.
  void draw(GLuint texture, std::uint32_t w, std::uint32_t h) {
    if (w != fbo_w_ || h != fbo_h_) resize(w, h);
    glBindFramebuffer(GL_FRAMEBUFFER, fbo_);
    glViewport(0, 0, static_cast<GLsizei>(w), static_cast<GLsizei>(h));
    glUseProgram(program_);
    glUniform2i(0, static_cast<GLint>(w), static_cast<GLint>(h));
    glBindTextureUnit(0, texture);
    glBindVertexArray(vao_);
    glDrawArrays(GL_TRIANGLES, 0, 3);
  }

  /// Shared-memory route: copies the frame into a GL buffer texture (the one copy of this route).
  GLuint upload(std::span<const std::byte> bytes) {
    if (bytes.size() > upload_size_) {
      glDeleteTextures(1, &upload_texture_);
      glDeleteBuffers(1, &upload_buffer_);
      glCreateBuffers(1, &upload_buffer_);
      glNamedBufferStorage(upload_buffer_, static_cast<GLsizeiptr>(bytes.size()), nullptr, GL_DYNAMIC_STORAGE_BIT);
      glCreateTextures(GL_TEXTURE_BUFFER, 1, &upload_texture_);
      glTextureBuffer(upload_texture_, GL_RGBA8, upload_buffer_);
      upload_size_ = bytes.size();
    }
    glNamedBufferSubData(upload_buffer_, 0, static_cast<GLsizeiptr>(bytes.size()), bytes.data());
    return upload_texture_;
  }

  [[nodiscard]] GLuint framebuffer() const { return fbo_; }

  /// The last drawn frame, row 0 at the top, RGBA8.
  std::vector<std::uint8_t> read_back() const {
    std::vector<std::uint8_t> px(std::size_t{fbo_w_} * fbo_h_ * 4), flipped(px.size());
    glPixelStorei(GL_PACK_ALIGNMENT, 1);
    glNamedFramebufferReadBuffer(fbo_, GL_COLOR_ATTACHMENT0);
    glBindFramebuffer(GL_READ_FRAMEBUFFER, fbo_);
    glReadPixels(0, 0, static_cast<GLsizei>(fbo_w_), static_cast<GLsizei>(fbo_h_), GL_RGBA, GL_UNSIGNED_BYTE,
                 px.data());
    const std::size_t row = std::size_t{fbo_w_} * 4;
    for (std::uint32_t y = 0; y < fbo_h_; ++y)
      std::copy_n(px.begin() + static_cast<std::ptrdiff_t>((fbo_h_ - 1 - y) * row), row,
                  flipped.begin() + static_cast<std::ptrdiff_t>(y * row));
    return flipped;
  }

 private:
  void resize(std::uint32_t w, std::uint32_t h) {
    glDeleteFramebuffers(1, &fbo_);
    glDeleteRenderbuffers(1, &color_);
    glCreateRenderbuffers(1, &color_);
    glNamedRenderbufferStorage(color_, GL_RGBA8, static_cast<GLsizei>(w), static_cast<GLsizei>(h));
    glCreateFramebuffers(1, &fbo_);
    glNamedFramebufferRenderbuffer(fbo_, GL_COLOR_ATTACHMENT0, GL_RENDERBUFFER, color_);
    fbo_w_ = w;
    fbo_h_ = h;
  }

  GLuint program_ = 0, vao_ = 0, fbo_ = 0, color_ = 0, upload_buffer_ = 0, upload_texture_ = 0;
  std::uint32_t fbo_w_ = 0, fbo_h_ = 0;
  std::size_t upload_size_ = 0;
};

/// Compares the read-back frame with the producer's formula: the screenshot must be exactly frame
/// `tag.frame`, not a blank, stale or torn one.
Status verify(const std::vector<std::uint8_t>& px, const FrameTag& tag) {
  for (std::uint32_t y = 0; y < tag.height; ++y)
    for (std::uint32_t x = 0; x < tag.width; ++x) {
      const std::size_t i = (std::size_t{y} * tag.width + x) * 4;
      const std::uint32_t got = px[i] | (px[i + 1] << 8) | (px[i + 2] << 16) | (std::uint32_t{px[i + 3]} << 24);
      const std::uint32_t want = lf_pattern(x, y, tag.width, tag.height, tag.frame);
      if (got != want)
        return fail(Errc::Malformed, "screenshot",
                    str_format("pixel ({}, {}) is {:#010x}, frame {} has {:#010x} there", x, y, got, tag.frame, want));
    }
  return {};
}

struct Stats {
  std::uint64_t drawn = 0, received = 0;
  std::vector<double> latency_ms;  // publish -> drawn, every frame of the session
  std::vector<double> window_ms;   // since the last report
  Clock::time_point since = Clock::now();
  std::uint64_t drawn_at_report = 0;

  static double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(q * double(v.size() - 1))];
  }
};

enum class End { PeerLost, WindowClosed, FramesDone, Stopped };

}  // namespace

int display_main(const DisplayOptions& o) {
  if (o.channel.empty()) return die(Error(Errc::InvalidArgument, "viewer", "--channel NAME is required"));
  install_stop_handlers();
  std::optional<Surface> surface;
  std::optional<gl::Interop> gl;
  std::optional<Renderer> renderer;
  std::uint64_t total_drawn = 0;
  std::optional<FrameTag> last;
  std::string route_line;

  auto finish = [&](int rc) -> int {
    if (rc == 0 && !o.screenshot.empty()) {
      if (!last || !renderer)
        return die(Error(Errc::NotFound, "--screenshot", "no frame was drawn since the last producer connected"));
      const auto px = renderer->read_back();
      if (o.verify) {
        if (auto ok = verify(px, *last); !ok) return die(ok.error());
        std::printf("[viewer] screenshot verified: every pixel is frame %u as the producer computes it\n", last->frame);
      }
      if (auto ok = write_png(o.screenshot, last->width, last->height, px,
                              {{"lavaflow-frame", std::to_string(last->frame)}, {"lavaflow-route", route_line}});
          !ok)
        return die(ok.error());
      std::printf("[viewer] wrote %s (%ux%u, frame %u)\n", o.screenshot.c_str(), last->width, last->height,
                  last->frame);
    }
    return rc;
  };

  while (!stop_requested()) {
    std::printf("[viewer] waiting for a producer on \"%s\"…\n", o.channel.c_str());
    std::fflush(stdout);
    // GL waits for each frame's GPU write itself (gl::ChannelImports), so receive() does not.
    auto opened = Consumer::open(o.channel, {.host_wait_for_gpu = false,
                                             .connect_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 std::chrono::duration<double>(o.timeout_s))});
    if (!opened) {
      // With --wait, keep waiting: also when we reached a producer that was dying (its socket
      // still listening for a moment after kill -9), which answers with a hang-up.
      if (o.wait && (opened.error().code() == Errc::Timeout || opened.error().code() == Errc::PeerLost)) {
        std::this_thread::sleep_for(50ms);
        continue;
      }
      return die(opened.error());
    }
    Consumer& c = **opened;
    route_line = str_format("{} ({})", to_string(c.route().transport), c.route().reason);
    std::printf("[viewer] producer pid %d, route %s\n", c.producer_pid(), route_line.c_str());

    if (!renderer) {  // the GL context: on the producer's device where we can tell
      std::optional<Uuid> device;
      if (c.vulkan()) device = c.vulkan()->capabilities().identity.device_uuid;
      if (!surface) {
        surface.emplace();
        if (auto ok = surface->open(o.headless, device); !ok) return die(ok.error());
      }
      if (auto ok = surface->make_current(); !ok) return die(ok.error());
      if (auto ok = gl::load_functions(); !ok) return die(ok.error());
      renderer.emplace();
      if (auto ok = renderer->init(); !ok) return die(ok.error());
    }
    // Zero copy where GL can import this ring (same device, GL_EXT_memory_object_fd); else upload.
    std::string gl_path = "upload (one copy per frame)";
    std::optional<gl::ChannelImports> imports;
    if (c.vulkan()) {
      if (!gl) {
        if (auto g = gl::Interop::create())
          gl.emplace(std::move(*g));
        else
          gl_path = "upload: " + g.error().message();
      }
      const auto& id = c.vulkan()->capabilities().identity;
      if (gl) {
        if (auto ok = gl->check_device(id.device_uuid, id.driver_uuid, "viewer"); ok) {
          imports.emplace(*gl, c);
          gl_path = "imported into GL, zero copy";
        } else {
          gl_path = "upload: " + ok.error().message();
        }
      }
    }
    const char* gl_name = reinterpret_cast<const char*>(glGetString(GL_RENDERER));
    std::printf("[viewer] %s on %s: frames %s\n", surface->windowed() ? "window" : "headless EGL",
                gl_name ? gl_name : "?", gl_path.c_str());
    std::fflush(stdout);

    Stats st;
    const auto session_start = Clock::now();
    End end = End::Stopped;
    while (true) {
      if (stop_requested()) break;
      if (surface->closed()) {
        end = End::WindowClosed;
        break;
      }
      auto r = c.receive(50ms);
      if (!r) {
        if (r.error().code() == Errc::Timeout) continue;
        if (r.error().code() == Errc::PeerLost) {
          end = End::PeerLost;
          break;
        }
        return die(r.error());
      }
      ++st.received;
      while (auto newer = c.try_receive()) {  // show the newest frame; older ones go back at once
        r = std::move(newer);
        ++st.received;
      }
      const auto tag = parse_tag(r->info().user_tag);
      const std::uint64_t bytes = std::uint64_t{tag.width} * tag.height * 4;
      if (tag.width == 0 || tag.height == 0 || bytes > r->info().size)
        return die(Error(Errc::Malformed, "viewer",
                         str_format("message {} says {}x{} but holds {} bytes", r->info().sequence, tag.width,
                                    tag.height, r->info().size)));
      GLuint texture = 0;
      if (imports) {
        auto t = imports->texture(*r, GL_RGBA8);
        if (!t) return die(t.error());
        texture = (*t)->name();
      } else {
        if (r->bytes().size() < bytes)
          return die(Error(Errc::Unsupported, "viewer",
                           "the ring buffers are device-local GPU memory that this GL cannot import; "
                           "start the producer with --transport shm"));
        texture = renderer->upload(r->bytes().first(bytes));
      }
      if (!last || last->width != tag.width || last->height != tag.height) surface->fit(tag.width, tag.height);
      renderer->draw(texture, tag.width, tag.height);
      // GL's reads of the ring buffer end the message: through the GPU where GL shares semaphores
      // with the consumer's Vulkan device (no CPU wait), else GL finishes first.
      if (imports) {
        if (auto ok = imports->release(*r); !ok) return die(ok.error());
      } else {
        glFinish();
      }
      const double lat = double(now_ns() - r->info().timestamp_ns) / 1e6;
      r->release();
      surface->present(renderer->framebuffer(), tag.width, tag.height);
      last = tag;
      ++st.drawn;
      ++total_drawn;
      st.latency_ms.push_back(lat);
      st.window_ms.push_back(lat);
      const double secs = std::chrono::duration<double>(Clock::now() - st.since).count();
      if (secs >= (surface->windowed() ? 0.5 : 1.0)) {
        const double fps = double(st.drawn - st.drawn_at_report) / secs;
        const auto line = str_format("{:.1f} fps, latency {:.2f} ms (p50), route {}", fps,
                                     Stats::percentile(st.window_ms, 0.5), to_string(c.route().transport));
        if (surface->windowed()) surface->set_title("lavaflow-viewer — " + line);
        std::printf("[viewer] %s, %llu frames\n", line.c_str(), static_cast<unsigned long long>(total_drawn));
        std::fflush(stdout);
        st.window_ms.clear();
        st.since = Clock::now();
        st.drawn_at_report = st.drawn;
      }
      if (o.frames && total_drawn >= o.frames) {
        end = End::FramesDone;
        break;
      }
    }
    const double session_s = std::chrono::duration<double>(Clock::now() - session_start).count();
    std::printf(
        "[viewer] %llu frames drawn in %.2f s (%.1f fps; %llu received, older ones skipped to show the newest), "
        "latency publish->drawn p50 %.2f ms, p99 %.2f ms\n",
        static_cast<unsigned long long>(st.drawn), session_s, double(st.drawn) / session_s,
        static_cast<unsigned long long>(st.received), Stats::percentile(st.latency_ms, 0.5),
        Stats::percentile(st.latency_ms, 0.99));
    imports.reset();  // GL objects go while the context is current
    switch (end) {
      case End::PeerLost:
        std::printf("[viewer] the producer (pid %d) went away\n", c.producer_pid());
        std::fflush(stdout);
        if (o.wait) {
          // The next producer may be on another device; and on NVIDIA a headless EGL context does
          // not survive the Vulkan device that shared its memory. Start GL afresh (a window stays).
          renderer.reset();
          gl.reset();
          if (!surface->windowed()) surface.reset();
          continue;
        }
        if (o.frames && total_drawn < o.frames) {
          std::fprintf(stderr, "[viewer] FAILED: only %llu of %llu frames before the producer left\n",
                       static_cast<unsigned long long>(total_drawn), static_cast<unsigned long long>(o.frames));
          return 1;
        }
        return finish(0);
      case End::WindowClosed:
        std::printf("[viewer] window closed\n");
        return finish(0);
      case End::FramesDone:
        return finish(0);
      case End::Stopped:
        break;
    }
    break;
  }
  std::printf("[viewer] stopped\n");
  return finish(0);
}

}  // namespace lfviewer
