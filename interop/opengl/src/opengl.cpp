// SPDX-License-Identifier: MIT
#include "lavaflow/opengl/opengl.hpp"

#include <chrono>
#include <cstring>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/gpu_buffer.hpp"

namespace lavaflow::gl {

namespace {

std::string_view gl_error_name(GLenum e) {
  switch (e) {
    case GL_INVALID_ENUM:
      return "GL_INVALID_ENUM";
    case GL_INVALID_VALUE:
      return "GL_INVALID_VALUE";
    case GL_INVALID_OPERATION:
      return "GL_INVALID_OPERATION";
    case GL_OUT_OF_MEMORY:
      return "GL_OUT_OF_MEMORY";
    case GL_INVALID_FRAMEBUFFER_OPERATION:
      return "GL_INVALID_FRAMEBUFFER_OPERATION";
    default:
      return "GL error";
  }
}

/// Drains GL's error queue; the first error becomes a lava-flow Error naming `call`.
Status check_gl(const char* call, std::string_view what) {
  GLenum first = GL_NO_ERROR;
  for (GLenum e = glGetError(); e != GL_NO_ERROR; e = glGetError())
    if (first == GL_NO_ERROR) first = e;
  if (first == GL_NO_ERROR) return {};
  const Errc code = first == GL_OUT_OF_MEMORY ? Errc::OutOfMemory : Errc::Driver;
  return fail(code, call, str_format("{} ({:#x}) while {}", gl_error_name(first), first, what));
}

void clear_gl_errors() {
  while (glGetError() != GL_NO_ERROR) {
  }
}

Uuid read_uuid(auto&& getter) {
  Uuid u{};
  GLubyte raw[GL_UUID_SIZE_EXT] = {};
  getter(raw);
  std::memcpy(u.data(), raw, u.size());
  return u;
}

/// Creates a memory object and imports `fd` into it; consumes the fd only when GL accepted it.
Result<GLuint> import_memory(std::uint64_t allocation_size, bool dedicated, UniqueFd& fd, const char* call) {
  LF_TRY_STATUS(check_memory_fd(fd, allocation_size, call));
  clear_gl_errors();
  GLuint mem = 0;
  glCreateMemoryObjectsEXT(1, &mem);
  if (dedicated) {
    const GLint yes = GL_TRUE;
    glMemoryObjectParameterivEXT(mem, GL_DEDICATED_MEMORY_OBJECT_EXT, &yes);
  }
  if (auto ok = check_gl("glCreateMemoryObjectsEXT", "creating a memory object"); !ok) {
    glDeleteMemoryObjectsEXT(1, &mem);
    return std::unexpected(ok.error().within(call));
  }
  glImportMemoryFdEXT(mem, allocation_size, GL_HANDLE_TYPE_OPAQUE_FD_EXT, fd.get());
  if (auto ok = check_gl("glImportMemoryFdEXT", str_format("importing {} bytes from fd {}", allocation_size, fd.get()));
      !ok) {
    glDeleteMemoryObjectsEXT(1, &mem);
    return std::unexpected(ok.error().within(call));  // the caller keeps its fd
  }
  (void)fd.release();  // GL owns it now
  return mem;
}

}  // namespace

Status load_functions() {
  glewExperimental = GL_TRUE;
  const GLenum r = glewInit();
  // GLEW_ERROR_NO_GLX_DISPLAY (4): Debian's GLEW is built for GLX; under EGL it has loaded the GL
  // functions before failing on GLX. Anything else is a real failure.
  if (r != GLEW_OK && r != 4)
    return fail(Errc::Driver, "glewInit",
                str_format("{} (is a GL context current?)", reinterpret_cast<const char*>(glewGetErrorString(r))));
  if (glGetString(GL_VERSION) == nullptr)
    return fail(Errc::Unsupported, "glewInit", "no GL context is current on this thread");
  clear_gl_errors();  // GLEW's probing leaves GL_INVALID_ENUM on core profiles
  return {};
}

Result<Capabilities> query_current() {
  constexpr const char* call = "gl::query_current";
  const auto* version = glGetString(GL_VERSION);
  if (version == nullptr) return fail(Errc::Unsupported, call, "no GL context is current on this thread");
  Capabilities c;
  c.vendor = reinterpret_cast<const char*>(glGetString(GL_VENDOR));
  c.renderer = reinterpret_cast<const char*>(glGetString(GL_RENDERER));
  c.version = reinterpret_cast<const char*>(version);
  c.memory_object = GLEW_EXT_memory_object;
  c.memory_object_fd = GLEW_EXT_memory_object_fd && glImportMemoryFdEXT != nullptr;
  c.semaphore = GLEW_EXT_semaphore;
  c.semaphore_fd = GLEW_EXT_semaphore_fd && glImportSemaphoreFdEXT != nullptr;
  if (c.memory_object || c.semaphore) {
    GLint n = 0;
    glGetIntegerv(GL_NUM_DEVICE_UUIDS_EXT, &n);
    for (GLint i = 0; i < n && i < 8; ++i)
      c.device_uuids.push_back(
          read_uuid([&](GLubyte* out) { glGetUnsignedBytei_vEXT(GL_DEVICE_UUID_EXT, static_cast<GLuint>(i), out); }));
    c.driver_uuid = read_uuid([](GLubyte* out) { glGetUnsignedBytevEXT(GL_DRIVER_UUID_EXT, out); });
  }
  clear_gl_errors();
  return c;
}

Status add_devices(Accelerators& accelerators) {
  LF_TRY(auto egl, EglHeadless::create());
  LF_TRY_STATUS(egl.make_current());
  LF_TRY_STATUS(load_functions());
  LF_TRY(auto caps, query_current());
  const std::string detail = str_format("{}; memory objects (fd) {}, semaphores (fd) {}", caps.version,
                                        caps.memory_object_fd ? "yes" : "no", caps.semaphore_fd ? "yes" : "no");
  if (caps.device_uuids.empty()) accelerators.add({Api::OpenGL, caps.renderer, 0, detail}, std::nullopt);
  for (std::uint32_t i = 0; i < caps.device_uuids.size(); ++i)
    accelerators.add({Api::OpenGL, caps.renderer, i, detail}, caps.device_uuids[i]);
  return {};
}

Result<GLenum> internal_format(PixelFormat f) {
  switch (f) {
    case PixelFormat::Rgba8:
      return GLenum{GL_RGBA8};
    case PixelFormat::R8:
      return GLenum{GL_R8};
    case PixelFormat::R32f:
      return GLenum{GL_R32F};
    case PixelFormat::Rgba32f:
      return GLenum{GL_RGBA32F};
    case PixelFormat::Rgba16f:
      return GLenum{GL_RGBA16F};
  }
  return fail(Errc::InvalidArgument, "gl::internal_format", "unknown pixel format");
}

// ----- Interop

Result<Interop> Interop::create() {
  constexpr const char* call = "gl::Interop::create";
  if (auto ok = load_functions(); !ok) return std::unexpected(ok.error().within(call));
  LF_TRY(auto caps, query_current());
  if (!caps.memory_object_fd)
    return fail(Errc::Unsupported, call,
                str_format("GL context ({}, {}) lacks GL_EXT_memory_object_fd", caps.renderer, caps.version));
  return Interop(std::move(caps));
}

Status Interop::check_device(const Uuid& device_uuid, const Uuid& driver_uuid, const char* call) const {
  bool device_ok = false;
  for (const auto& u : caps_.device_uuids) device_ok = device_ok || u == device_uuid;
  if (!device_ok)
    return fail(
        Errc::DeviceMismatch, call,
        str_format("memory comes from device {}, but the GL context ({}) runs on {}", to_string(device_uuid),
                   caps_.renderer,
                   caps_.device_uuids.empty() ? std::string("no reported device") : to_string(caps_.device_uuids[0])));
  if (driver_uuid != caps_.driver_uuid)
    return fail(Errc::DeviceMismatch, call,
                str_format("memory comes from driver {}, the GL context's driver is {}", to_string(driver_uuid),
                           to_string(caps_.driver_uuid)));
  return {};
}

Result<Buffer> Interop::import_buffer(const ExportDescriptor& d, UniqueFd&& fd) const {
  constexpr const char* call = "gl::Interop::import_buffer";
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  if (!is_gpu(d.kind))
    return fail(Errc::Unsupported, call,
                str_format("{} memory is not Vulkan memory: GL_EXT_memory_object imports Vulkan allocations only",
                           to_string(d.kind)));
  LF_TRY_STATUS(check_device(d.device_uuid, d.driver_uuid, call));
  LF_TRY(GLuint mem, import_memory(d.allocation_size, d.dedicated, fd, call));
  GLuint buf = 0;
  glCreateBuffers(1, &buf);
  // From the allocation's start (see Buffer): the range is reached with offset().
  glNamedBufferStorageMemEXT(buf, static_cast<GLsizeiptr>(d.offset + d.size), mem, 0);
  if (auto ok = check_gl("glNamedBufferStorageMemEXT",
                         str_format("binding {} bytes of a {}-byte allocation", d.offset + d.size, d.allocation_size));
      !ok) {
    glDeleteBuffers(1, &buf);
    glDeleteMemoryObjectsEXT(1, &mem);
    return std::unexpected(ok.error().within(call));
  }
  return Buffer(mem, buf, d.offset, d.size);
}

Result<Buffer> Interop::import_buffer(const lavaflow::Buffer& buffer) const {
  LF_TRY(auto ex, buffer.export_handle());
  return import_buffer(ex.descriptor, std::move(ex.fd));
}

Result<Texture> Interop::import_image(const ImageDescriptor& d, UniqueFd&& fd) const {
  constexpr const char* call = "gl::Interop::import_image";
  if (auto ok = d.validate(); !ok) return std::unexpected(ok.error().within(call));
  LF_TRY_STATUS(check_device(d.device_uuid, d.driver_uuid, call));
  LF_TRY(GLenum fmt, internal_format(d.format));
  LF_TRY(GLuint mem, import_memory(d.allocation_size, d.dedicated, fd, call));
  GLuint tex = 0;
  glCreateTextures(GL_TEXTURE_2D, 1, &tex);
  glTextureParameteri(tex, GL_TEXTURE_TILING_EXT,
                      d.tiling == ImageTiling::Optimal ? GL_OPTIMAL_TILING_EXT : GL_LINEAR_TILING_EXT);
  glTextureStorageMem2DEXT(tex, 1, fmt, static_cast<GLsizei>(d.width), static_cast<GLsizei>(d.height), mem, 0);
  if (auto ok = check_gl("glTextureStorageMem2DEXT",
                         str_format("making a {}x{} {} texture", d.width, d.height, to_string(d.format)));
      !ok) {
    glDeleteTextures(1, &tex);
    glDeleteMemoryObjectsEXT(1, &mem);
    return std::unexpected(ok.error().within(call));
  }
  return Texture(mem, tex, fmt, d.width, d.height);
}

Result<Texture> Interop::import_image(const GpuImage& image) const {
  LF_TRY(auto ex, image.export_handle());
  return import_image(ex.descriptor, std::move(ex.fd));
}

Result<Semaphore> Interop::import_semaphore(UniqueFd&& fd) const {
  constexpr const char* call = "gl::Interop::import_semaphore";
  if (!caps_.semaphore_fd)
    return fail(Errc::Unsupported, call,
                str_format("GL context ({}) lacks GL_EXT_semaphore_fd: finish Vulkan work with a CPU wait instead",
                           caps_.renderer));
  LF_TRY_STATUS(check_handle_fd(fd, call));
  clear_gl_errors();
  GLuint sem = 0;
  glGenSemaphoresEXT(1, &sem);
  glImportSemaphoreFdEXT(sem, GL_HANDLE_TYPE_OPAQUE_FD_EXT, fd.get());
  if (auto ok = check_gl("glImportSemaphoreFdEXT", str_format("importing a semaphore from fd {}", fd.get())); !ok) {
    glDeleteSemaphoresEXT(1, &sem);
    return std::unexpected(ok.error().within(call));
  }
  (void)fd.release();
  return Semaphore(sem);
}

// ----- owners

Buffer::Buffer(Buffer&& o) noexcept
    : memory_(std::exchange(o.memory_, 0)), buffer_(std::exchange(o.buffer_, 0)), offset_(o.offset_), size_(o.size_) {}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    new (this) Buffer(std::move(o));
  }
  return *this;
}
Buffer::~Buffer() {
  if (buffer_) glDeleteBuffers(1, &buffer_);
  if (memory_) glDeleteMemoryObjectsEXT(1, &memory_);
}

Texture::Texture(Texture&& o) noexcept
    : memory_(std::exchange(o.memory_, 0)),
      texture_(std::exchange(o.texture_, 0)),
      internal_format_(o.internal_format_),
      width_(o.width_),
      height_(o.height_) {}
Texture& Texture::operator=(Texture&& o) noexcept {
  if (this != &o) {
    this->~Texture();
    new (this) Texture(std::move(o));
  }
  return *this;
}
Texture::~Texture() {
  if (texture_) glDeleteTextures(1, &texture_);
  if (memory_) glDeleteMemoryObjectsEXT(1, &memory_);
}

Semaphore::Semaphore(Semaphore&& o) noexcept : semaphore_(std::exchange(o.semaphore_, 0)) {}
Semaphore& Semaphore::operator=(Semaphore&& o) noexcept {
  if (this != &o) {
    this->~Semaphore();
    new (this) Semaphore(std::move(o));
  }
  return *this;
}
Semaphore::~Semaphore() {
  if (semaphore_) glDeleteSemaphoresEXT(1, &semaphore_);
}

void Semaphore::wait(const std::vector<GLuint>& buffers, const std::vector<GLuint>& textures,
                     const std::vector<GLenum>& layouts) const {
  std::vector<GLenum> l = layouts;
  l.resize(textures.size(), GL_LAYOUT_GENERAL_EXT);
  glWaitSemaphoreEXT(semaphore_, static_cast<GLuint>(buffers.size()), buffers.data(),
                     static_cast<GLuint>(textures.size()), textures.data(), l.data());
}

void Semaphore::signal(const std::vector<GLuint>& buffers, const std::vector<GLuint>& textures,
                       const std::vector<GLenum>& layouts) const {
  std::vector<GLenum> l = layouts;
  l.resize(textures.size(), GL_LAYOUT_GENERAL_EXT);
  glSignalSemaphoreEXT(semaphore_, static_cast<GLuint>(buffers.size()), buffers.data(),
                       static_cast<GLuint>(textures.size()), textures.data(), l.data());
  glFlush();
}

// ----- channel imports

ChannelImports::~ChannelImports() {
  if (!gl_semaphore_ && !gl_release_) return;
  // A semaphore must not go while GL or Vulkan still has a wait or signal on it queued (NVIDIA's GL
  // then stops drawing, and the producer's GPU never sees the last releases).
  glFinish();
  if (const VulkanContext* vk = consumer_->vulkan()) {
    try {
      vk->queue().waitIdle();
    } catch (const vk::SystemError&) {  // a lost device has nothing queued left to wait for
    }
  }
}

Status ChannelImports::setup_semaphore() {
  tried_semaphore_ = true;
  const VulkanContext* vk = consumer_->vulkan();
  if (vk == nullptr || !gl_->capabilities().semaphore_fd) return {};
  if (!GpuSemaphore::supported(*vk, SemaphoreKind::Binary, false)) return {};
  LF_TRY(auto sem, GpuSemaphore::create(*vk, SemaphoreKind::Binary));
  LF_TRY(UniqueFd fd, sem.export_fd());
  LF_TRY(auto imported, gl_->import_semaphore(std::move(fd)));
  vk_semaphore_.emplace(std::move(sem));
  gl_semaphore_.emplace(std::move(imported));
  return {};
}

Result<const Buffer*> ChannelImports::buffer(const Received& message) {
  constexpr const char* call = "gl::ChannelImports::buffer";
  if (!tried_semaphore_)
    if (auto ok = setup_semaphore(); !ok) return std::unexpected(ok.error().within(call));
  const lavaflow::Buffer* key = &message.buffer();
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    auto imported = gl_->import_buffer(*key);
    if (!imported) return std::unexpected(imported.error().within(call));
    it = cache_.emplace(key, std::move(*imported)).first;
  }
  auto wait = message.gpu_wait();
  if (wait && wait->kind() == GpuSyncKind::Flag) {  // GL cannot wait on a GPU flag: the CPU does
    if (auto ok = wait_on_host(*wait, std::chrono::seconds(60)); !ok) return std::unexpected(ok.error().within(call));
    wait.reset();
  }
  if (gl_semaphore_) {
    // Vulkan signals (after the producer's timeline point, if any); GL waits for this buffer.
    const VulkanContext& vk = *consumer_->vulkan();
    const vk::Semaphore signal = vk_semaphore_->semaphore();
    const vk::Semaphore wait_sem = wait ? wait->semaphore : vk::Semaphore{};
    const std::uint64_t wait_value = wait ? wait->value : 0, signal_value = 0;
    const vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eAllCommands;
    vk::TimelineSemaphoreSubmitInfo values(wait ? 1u : 0u, &wait_value, 1, &signal_value);
    vk::SubmitInfo submit(wait ? 1u : 0u, &wait_sem, &stage, 0, nullptr, 1, &signal, &values);
    try {
      vk.queue().submit(submit);
    } catch (const vk::SystemError& e) {
      return std::unexpected(from_vk(e.code().value(), "vkQueueSubmit(GL hand-off)").within(call));
    }
    gl_semaphore_->wait({it->second.name()});
    glFlush();  // the wait is queued before Vulkan may signal the semaphore again
  } else if (wait) {
    // No semaphore to hand the message to GL through: the CPU waits for the producer's GPU (at
    // once when the consumer's receive() has already waited).
    if (auto ok = wait_on_host(*wait, std::chrono::seconds(60)); !ok) return std::unexpected(ok.error().within(call));
  }
  return &it->second;
}

Status ChannelImports::release(Received& message) {
  constexpr const char* call = "gl::ChannelImports::release";
  auto it = cache_.find(&message.buffer());
  if (it == cache_.end())
    return fail(Errc::InvalidArgument, call, "the message's buffer was never handed to GL (buffer() or texture())");
  if (!gl_semaphore_ || consumer_->gpu_release_timeline() == nullptr) {
    glFinish();
    return {};
  }
  const VulkanContext& vk = *consumer_->vulkan();
  if (!vk_release_) {
    LF_TRY(auto sem, GpuSemaphore::create(vk, SemaphoreKind::Binary));
    LF_TRY(UniqueFd fd, sem.export_fd());
    auto imported = gl_->import_semaphore(std::move(fd));
    if (!imported) return std::unexpected(imported.error().within(call));
    vk_release_.emplace(std::move(sem));
    gl_release_.emplace(std::move(*imported));
  }
  LF_TRY(auto sync, message.gpu_release_point());
  gl_release_->signal({it->second.name()});  // after GL's commands so far; flushed
  const vk::Semaphore wait = vk_release_->semaphore();
  const std::uint64_t wait_value = 0;
  const vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eAllCommands;
  vk::TimelineSemaphoreSubmitInfo values(1, &wait_value, 1, &sync.value);
  vk::SubmitInfo submit(1, &wait, &stage, 0, nullptr, 1, &sync.semaphore, &values);
  try {
    vk.queue().submit(submit);
  } catch (const vk::SystemError& e) {
    // Not promised to the producer: GL finishes instead, so that the message can still be dropped.
    glFinish();
    return std::unexpected(from_vk(e.code().value(), "vkQueueSubmit(GL release)").within(call));
  }
  (void)message.gpu_release();
  return {};
}

Result<const Texture*> ChannelImports::texture(const Received& message, GLenum internal_format) {
  constexpr const char* call = "gl::ChannelImports::texture";
  LF_TRY(const Buffer* buf, buffer(message));
  auto& list = textures_[&message.buffer()];
  for (const auto& t : list)
    if (t.internal_format() == internal_format) return &t;
  clear_gl_errors();
  GLuint tex = 0;
  glCreateTextures(GL_TEXTURE_BUFFER, 1, &tex);
  glTextureBufferRange(tex, internal_format, buf->name(), static_cast<GLintptr>(buf->offset()),
                       static_cast<GLsizeiptr>(buf->size()));
  if (auto ok = check_gl("glTextureBufferRange", str_format("making a buffer texture over {} bytes", buf->size()));
      !ok) {
    glDeleteTextures(1, &tex);
    return std::unexpected(ok.error().within(call));
  }
  list.push_back(Texture(0, tex, internal_format, 0, 0));
  return &list.back();
}

}  // namespace lavaflow::gl
