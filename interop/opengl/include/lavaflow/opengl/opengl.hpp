// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// lavaflow::opengl — imports lava-flow's Vulkan memory (buffers, 2D images) and semaphores into
/// OpenGL through GL_EXT_memory_object_fd and GL_EXT_semaphore_fd. Works in a window (GLFW, GLX)
/// and headless (EglHeadless: EGL device platform, no X server).
///
/// GL objects belong to the GL context that was current when they were made: create, use and
/// destroy them with that context current (GL's rule, not lava-flow's).

#include <GL/glew.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "lavaflow/core/accelerators.hpp"
#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/error.hpp"
#include "lavaflow/core/gpu_image.hpp"
#include "lavaflow/core/gpu_semaphore.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/transports/channel.hpp"

namespace lavaflow::gl {

/// Loads GL entry points (GLEW) for the current context. Accepts GLEW_ERROR_NO_GLX_DISPLAY, which
/// Debian's GLX-built GLEW returns under EGL after it has loaded the core and extension functions.
[[nodiscard]] Status load_functions();

/// What the current GL context offers for sharing.
struct Capabilities {
  std::string vendor, renderer, version;
  bool memory_object = false;      ///< GL_EXT_memory_object
  bool memory_object_fd = false;   ///< GL_EXT_memory_object_fd
  bool semaphore = false;          ///< GL_EXT_semaphore
  bool semaphore_fd = false;       ///< GL_EXT_semaphore_fd
  std::vector<Uuid> device_uuids;  ///< GL_DEVICE_UUID_EXT, one per device of the context
  Uuid driver_uuid{};              ///< GL_DRIVER_UUID_EXT
};

/// Reads the current context's capabilities (load_functions() first).
[[nodiscard]] Result<Capabilities> query_current();

/// Adds the GL devices a headless context reaches (its GL_DEVICE_UUID_EXTs) to the accelerator
/// list, merged by UUID. Makes and releases a context of its own.
[[nodiscard]] Status add_devices(Accelerators& accelerators);

/// A headless GL 4.5 core context on the EGL device platform. Picks the EGL device whose GL device
/// UUID equals `device_uuid` (e.g. the Vulkan exporter's), or the first usable one.
class EglHeadless {
 public:
  [[nodiscard]] static Result<EglHeadless> create(std::optional<Uuid> device_uuid = std::nullopt);
  EglHeadless(EglHeadless&&) noexcept;
  EglHeadless& operator=(EglHeadless&&) noexcept;
  ~EglHeadless();
  /// Makes the context current on the calling thread.
  [[nodiscard]] Status make_current() const;
  /// The EGL device's name and extensions, for reports.
  [[nodiscard]] const std::string& description() const;

 private:
  struct Impl;
  explicit EglHeadless(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// An imported buffer: a GL buffer object over lava-flow memory (no copy). The GL buffer starts
/// at the start of the exported buffer; the user's range is [offset(), offset() + size()) of it
/// (bind it with glBindBufferRange). Mesa's llvmpipe ignores the memory offset argument of
/// glNamedBufferStorageMemEXT, so lava-flow never relies on it.
class Buffer {
 public:
  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) noexcept;
  ~Buffer();
  [[nodiscard]] GLuint name() const { return buffer_; }
  [[nodiscard]] GLuint memory_object() const { return memory_; }
  [[nodiscard]] std::uint64_t offset() const { return offset_; }
  [[nodiscard]] std::uint64_t size() const { return size_; }

 private:
  friend class Interop;
  Buffer(GLuint memory, GLuint buffer, std::uint64_t offset, std::uint64_t size)
      : memory_(memory), buffer_(buffer), offset_(offset), size_(size) {}
  GLuint memory_ = 0;
  GLuint buffer_ = 0;
  std::uint64_t offset_ = 0;
  std::uint64_t size_ = 0;
};

/// An imported 2D image as a GL texture (GL_TEXTURE_2D, one level).
class ChannelImports;

class Texture {
 public:
  Texture(Texture&&) noexcept;
  Texture& operator=(Texture&&) noexcept;
  ~Texture();
  [[nodiscard]] GLuint name() const { return texture_; }
  [[nodiscard]] GLenum internal_format() const { return internal_format_; }
  [[nodiscard]] std::uint32_t width() const { return width_; }
  [[nodiscard]] std::uint32_t height() const { return height_; }

 private:
  friend class Interop;
  friend class ChannelImports;
  Texture(GLuint memory, GLuint texture, GLenum fmt, std::uint32_t w, std::uint32_t h)
      : memory_(memory), texture_(texture), internal_format_(fmt), width_(w), height_(h) {}
  GLuint memory_ = 0;
  GLuint texture_ = 0;
  GLenum internal_format_ = 0;
  std::uint32_t width_ = 0, height_ = 0;
};

/// An imported binary Vulkan semaphore. GL waits/signals it in its command stream.
class Semaphore {
 public:
  Semaphore(Semaphore&&) noexcept;
  Semaphore& operator=(Semaphore&&) noexcept;
  ~Semaphore();
  [[nodiscard]] GLuint name() const { return semaphore_; }
  /// GL commands after this wait for the Vulkan signal. `layouts` (GL_LAYOUT_*_EXT) give each
  /// texture's Vulkan layout at the signal.
  void wait(const std::vector<GLuint>& buffers, const std::vector<GLuint>& textures = {},
            const std::vector<GLenum>& layouts = {}) const;
  /// Signals after the GL commands issued so far (and flushes them).
  void signal(const std::vector<GLuint>& buffers, const std::vector<GLuint>& textures = {},
              const std::vector<GLenum>& layouts = {}) const;

 private:
  friend class Interop;
  explicit Semaphore(GLuint s) : semaphore_(s) {}
  GLuint semaphore_ = 0;
};

[[nodiscard]] Result<GLenum> internal_format(PixelFormat f);

/// The importer for the GL context current at creation.
class Interop {
 public:
  /// Loads functions and checks GL_EXT_memory_object_fd on the current context.
  [[nodiscard]] static Result<Interop> create();

  [[nodiscard]] const Capabilities& capabilities() const { return caps_; }
  /// DeviceMismatch unless this context runs on the device and driver that exported the memory.
  [[nodiscard]] Status check_device(const Uuid& device_uuid, const Uuid& driver_uuid, const char* call) const;

  /// Imports the range [desc.offset, +desc.size) of an exported buffer. Consumes `fd` on success
  /// only (GL's own rule).
  [[nodiscard]] Result<Buffer> import_buffer(const ExportDescriptor& desc, UniqueFd&& fd) const;
  /// Imports a lava-flow buffer (exports it first: the buffer itself stays usable).
  [[nodiscard]] Result<Buffer> import_buffer(const lavaflow::Buffer& buffer) const;
  [[nodiscard]] Result<Texture> import_image(const ImageDescriptor& desc, UniqueFd&& fd) const;
  [[nodiscard]] Result<Texture> import_image(const GpuImage& image) const;
  /// Imports a binary semaphore (GL_EXT_semaphore_fd). Consumes `fd` on success only.
  [[nodiscard]] Result<Semaphore> import_semaphore(UniqueFd&& fd) const;

 private:
  explicit Interop(Capabilities caps) : caps_(std::move(caps)) {}
  Capabilities caps_;
};

/// A channel consumer's GL view: each ring buffer is imported once, on first sight, and reused
/// for every later message in that slot. Each message is also handed to GL properly: where GL has
/// GL_EXT_semaphore_fd and the consumer's Vulkan device exports binary semaphores, the consumer's
/// Vulkan queue signals a shared semaphore (after the channel's timeline point, when the producer
/// ordered the message on the GPU) and GL waits on it for that buffer — without that, a GL driver
/// may serve reads of reused memory from what it saw before (NVIDIA does). Elsewhere (llvmpipe)
/// the CPU has already waited in receive().
class ChannelImports {
 public:
  ChannelImports(const Interop& gl, const Consumer& consumer) : gl_(&gl), consumer_(&consumer) {}
  /// Waits for GL and the consumer's Vulkan queue to be done with the shared semaphores: destroy
  /// it while GL's context is current and before the consumer.
  ~ChannelImports();
  ChannelImports(const ChannelImports&) = delete;
  ChannelImports& operator=(const ChannelImports&) = delete;
  /// The GL buffer for a received message's ring buffer, ready for GL commands issued after this.
  [[nodiscard]] Result<const Buffer*> buffer(const Received& message);
  /// The same as a buffer texture (GL_TEXTURE_BUFFER over the imported buffer, `internal_format`
  /// texels, e.g. GL_RGBA8 or GL_R32UI) for shaders that read it with texelFetch; made once per
  /// ring buffer and format, the message handed to GL as in buffer().
  [[nodiscard]] Result<const Texture*> texture(const Received& message, GLenum internal_format);
  /// Ends GL's use of a message's buffer, after the GL commands issued so far, so that the message
  /// can be dropped at once. Where messages reach GL through a semaphore (gpu_handoff()) and the
  /// channel gives this consumer a release timeline, GL signals a second shared semaphore and the
  /// consumer's Vulkan queue turns it into the message's GPU release (Received::gpu_release): no
  /// CPU waits for GL, and the producer rewrites the slot only after GL is done. Elsewhere the CPU
  /// waits for GL to finish.
  [[nodiscard]] Status release(Received& message);
  [[nodiscard]] std::size_t imported() const { return cache_.size(); }
  /// Whether messages reach GL through a semaphore (else through the CPU wait in receive()).
  [[nodiscard]] bool gpu_handoff() const { return gl_semaphore_.has_value(); }

 private:
  Status setup_semaphore();
  const Interop* gl_;
  const Consumer* consumer_;
  std::unordered_map<const lavaflow::Buffer*, Buffer> cache_;
  std::unordered_map<const lavaflow::Buffer*, std::vector<Texture>> textures_;
  bool tried_semaphore_ = false;
  std::optional<GpuSemaphore> vk_semaphore_;
  std::optional<Semaphore> gl_semaphore_;
  std::optional<GpuSemaphore> vk_release_;  // GL signals, Vulkan waits: the release direction
  std::optional<Semaphore> gl_release_;
};

}  // namespace lavaflow::gl
