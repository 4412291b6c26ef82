// SPDX-License-Identifier: MIT
// A headless GL context on the EGL device platform: no X server, no window, no surface.
#include <EGL/egl.h>
#include <EGL/eglext.h>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/opengl/opengl.hpp"

namespace lavaflow::gl {

struct EglHeadless::Impl {
  EGLDisplay display = EGL_NO_DISPLAY;
  EGLContext context = EGL_NO_CONTEXT;
  std::string description;
  ~Impl() {
    if (display == EGL_NO_DISPLAY) return;
    if (context != EGL_NO_CONTEXT) {
      if (eglGetCurrentContext() == context) eglMakeCurrent(display, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
      eglDestroyContext(display, context);
    }
    // eglTerminate would also end other users' contexts on this (shared, per-device) display.
  }
};

namespace {

template <class F>
F egl_proc(const char* name) {
  return reinterpret_cast<F>(eglGetProcAddress(name));
}

std::string egl_error(EGLint e) { return str_format("EGL error {:#x}", e); }

}  // namespace

EglHeadless::EglHeadless(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EglHeadless::EglHeadless(EglHeadless&&) noexcept = default;
EglHeadless& EglHeadless::operator=(EglHeadless&&) noexcept = default;
EglHeadless::~EglHeadless() = default;

Result<EglHeadless> EglHeadless::create(std::optional<Uuid> device_uuid) {
  constexpr const char* call = "gl::EglHeadless::create";
  const char* client = eglQueryString(EGL_NO_DISPLAY, EGL_EXTENSIONS);
  if (client == nullptr || std::string_view(client).find("EGL_EXT_platform_device") == std::string_view::npos)
    return fail(Errc::Unsupported, call, "EGL lacks EGL_EXT_platform_device (no headless device platform)");
  auto query_devices = egl_proc<PFNEGLQUERYDEVICESEXTPROC>("eglQueryDevicesEXT");
  auto query_string = egl_proc<PFNEGLQUERYDEVICESTRINGEXTPROC>("eglQueryDeviceStringEXT");
  auto platform_display = egl_proc<PFNEGLGETPLATFORMDISPLAYEXTPROC>("eglGetPlatformDisplayEXT");
  if (!query_devices || !query_string || !platform_display)
    return fail(Errc::Unsupported, call, "EGL device enumeration functions are missing");
  EGLDeviceEXT devices[16];
  EGLint count = 0;
  if (!query_devices(16, devices, &count) || count == 0)
    return fail(Errc::NotFound, call, str_format("eglQueryDevicesEXT found no device ({})", egl_error(eglGetError())));

  std::string tried;
  for (EGLint i = 0; i < count; ++i) {
    const char* ext = query_string(devices[i], EGL_EXTENSIONS);
    const std::string desc = str_format("EGL device {} [{}]", i, ext ? ext : "");
    auto impl = std::make_unique<Impl>();
    impl->display = platform_display(EGL_PLATFORM_DEVICE_EXT, devices[i], nullptr);
    EGLint major = 0, minor = 0;
    if (impl->display == EGL_NO_DISPLAY || !eglInitialize(impl->display, &major, &minor)) {
      tried += str_format("; {}: eglInitialize failed ({})", desc, egl_error(eglGetError()));
      impl->display = EGL_NO_DISPLAY;
      continue;
    }
    if (!eglBindAPI(EGL_OPENGL_API)) {
      tried += str_format("; {}: no desktop OpenGL", desc);
      continue;
    }
    const EGLint attrs[] = {
        EGL_CONTEXT_MAJOR_VERSION,           4,       EGL_CONTEXT_MINOR_VERSION, 5, EGL_CONTEXT_OPENGL_PROFILE_MASK,
        EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT, EGL_NONE};
    impl->context = eglCreateContext(impl->display, EGL_NO_CONFIG_KHR, EGL_NO_CONTEXT, attrs);
    if (impl->context == EGL_NO_CONTEXT) {
      tried += str_format("; {}: no GL 4.5 core context ({})", desc, egl_error(eglGetError()));
      continue;
    }
    impl->description = str_format("{} (EGL {}.{}, {})", desc, major, minor, eglQueryString(impl->display, EGL_VENDOR));
    EglHeadless ctx(std::move(impl));
    if (!device_uuid) return ctx;
    if (auto ok = ctx.make_current(); !ok) {
      tried += str_format("; {}: {}", desc, ok.error().message());
      continue;
    }
    if (auto ok = load_functions(); !ok) {
      tried += str_format("; {}: {}", desc, ok.error().message());
      continue;
    }
    auto caps = query_current();
    if (caps) {
      for (const auto& u : caps->device_uuids)
        if (u == *device_uuid) return ctx;
      tried +=
          str_format("; {}: GL runs on {} ({})", desc,
                     caps->device_uuids.empty() ? std::string("no reported device") : to_string(caps->device_uuids[0]),
                     caps->renderer);
    }
  }
  return fail(device_uuid ? Errc::DeviceMismatch : Errc::NotFound, call,
              device_uuid ? str_format("no EGL device runs on device {}{}", to_string(*device_uuid), tried)
                          : str_format("no EGL device gave a GL 4.5 context{}", tried));
}

Status EglHeadless::make_current() const {
  if (!eglMakeCurrent(impl_->display, EGL_NO_SURFACE, EGL_NO_SURFACE, impl_->context))
    return fail(Errc::Driver, "eglMakeCurrent", egl_error(eglGetError()));
  return {};
}

const std::string& EglHeadless::description() const { return impl_->description; }

}  // namespace lavaflow::gl
