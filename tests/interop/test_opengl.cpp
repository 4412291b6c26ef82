// SPDX-License-Identifier: MIT
// lavaflow::opengl on real drivers: lavapipe exports, llvmpipe's GL (headless EGL) imports — or an
// NVIDIA GPU's Vulkan and GL in the GPU tier. Byte-exact both ways, buffers and textures, odd sizes,
// non-zero offsets, refusals, fd accounting, and consumer/producer processes over a channel.
#include <sys/mman.h>
#include <unistd.h>

#include "gl_support.hpp"
#include "payload.hpp"
#include "support.hpp"

using namespace lavaflow;

namespace {

struct Fixture {
  VulkanContext vk;
  lftest::GlSetup gl;
};

Fixture setup() {
  auto vk = lftest::context_or_skip();
  auto gl = lftest::gl_for(vk);
  if (!gl) lftest::skip("no GL context with GL_EXT_memory_object_fd on this Vulkan device: " + gl.error().message());
  return Fixture{std::move(vk), std::move(*gl)};
}

}  // namespace

TEST_CASE("Vulkan to GL and GL to Vulkan buffers are byte-exact, odd sizes and both memory kinds") {
  auto f = setup();
  for (auto mem : {GpuMemory::DeviceLocal, GpuMemory::HostVisible}) {
    for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{4093}, (std::uint64_t{1} << 20) + 3}) {
      INFO("size " << size << " memory " << static_cast<int>(mem));
      auto buf = lftest::ok(GpuBuffer::allocate(f.vk, {.size = size, .memory = mem}));
      CHECK(lftest::gpu_fill(f.vk, buf, size) == "");
      auto glbuf = lftest::ok(f.gl.gl.import_buffer(buf));
      CHECK(glbuf.size() == size);
      auto seen = lftest::gl_read(glbuf.name(), 0, size);
      CHECK(lftest::first_mismatch(seen, size) == -1);
      const auto next = lftest::pattern(size, size + 7);
      glNamedBufferSubData(glbuf.name(), 0, static_cast<GLsizeiptr>(size), next.data());
      glFinish();  // llvmpipe has no GL_EXT_semaphore_fd: the CPU waits for GL
      CHECK(lftest::gpu_check(f.vk, buf, size + 7) == "");
      CHECK(glGetError() == GL_NO_ERROR);
    }
  }
}

TEST_CASE("GL imports a sub-range at a non-zero offset of an exported buffer") {
  auto f = setup();
  const std::uint64_t size = 65536 + 17, offset = 4096 + 256, len = 30001;
  auto buf = lftest::ok(GpuBuffer::allocate(f.vk, {.size = size}));
  CHECK(lftest::gpu_fill(f.vk, buf, 3) == "");
  auto ex = lftest::ok(buf.export_handle());
  ex.descriptor.offset = offset;
  ex.descriptor.size = len;
  auto glbuf = lftest::ok(f.gl.gl.import_buffer(ex.descriptor, std::move(ex.fd)));
  CHECK_FALSE(ex.fd.valid());
  CHECK(glbuf.offset() == offset);
  CHECK(glbuf.size() == len);
  auto seen = lftest::gl_read(glbuf.name(), glbuf.offset(), len);
  auto all = lftest::pattern(size, 3);
  CHECK(std::equal(seen.begin(), seen.end(), all.begin() + static_cast<std::ptrdiff_t>(offset)));
}

TEST_CASE("Vulkan images and GL textures share pixels both ways") {
  auto f = setup();
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glPixelStorei(GL_UNPACK_ALIGNMENT, 1);
  struct Case {
    PixelFormat fmt;
    GLenum format, type;
  };
  for (auto c : {Case{PixelFormat::Rgba8, GL_RGBA, GL_UNSIGNED_BYTE}, Case{PixelFormat::R8, GL_RED, GL_UNSIGNED_BYTE},
                 Case{PixelFormat::R32f, GL_RED, GL_FLOAT}}) {
    for (auto [w, h] : {std::pair{333u, 77u}, std::pair{256u, 256u}}) {
      INFO(to_string(c.fmt) << " " << w << "x" << h);
      auto img = lftest::ok(GpuImage::allocate(f.vk, {.width = w, .height = h, .format = c.fmt}));
      const auto n = img.descriptor().packed_size();
      // Float patterns must stay finite and exact: use small integers.
      auto px = lftest::pattern(n, w + h);
      if (c.fmt == PixelFormat::R32f)
        for (std::size_t i = 0; i < n / 4; ++i) {
          const float v = static_cast<float>(i % 1000);
          std::memcpy(px.data() + i * 4, &v, 4);
        }
      lftest::ok(upload_image(f.vk, img, px));
      auto tex = lftest::ok(f.gl.gl.import_image(img));
      std::vector<std::byte> seen(n);
      glGetTextureImage(tex.name(), 0, c.format, c.type, static_cast<GLsizei>(n), seen.data());
      CHECK(glGetError() == GL_NO_ERROR);
      CHECK(seen == px);
      std::reverse(px.begin(), px.end());
      if (c.fmt == PixelFormat::R32f)
        for (std::size_t i = 0; i < n / 4; ++i) {
          const float v = static_cast<float>(i % 777);
          std::memcpy(px.data() + i * 4, &v, 4);
        }
      glTextureSubImage2D(tex.name(), 0, 0, 0, static_cast<GLsizei>(w), static_cast<GLsizei>(h), c.format, c.type,
                          px.data());
      glFinish();
      std::vector<std::byte> back(n);
      lftest::ok(download_image(f.vk, img, back));
      CHECK(back == px);
    }
  }
}

TEST_CASE("GL import refuses other devices, CPU memory and non-memory fds, and leaves the fd open") {
  auto f = setup();
  auto buf = lftest::ok(GpuBuffer::allocate(f.vk, {.size = 4096}));
  auto ex = lftest::ok(buf.export_handle());
  const int raw = ex.fd.get();
  auto d = ex.descriptor;
  d.device_uuid[0] ^= 0x5a;
  auto e = lftest::err(f.gl.gl.import_buffer(d, std::move(ex.fd)));
  CHECK(e.code() == Errc::DeviceMismatch);
  CHECK(e.cause().find("GL context") != std::string::npos);
  CHECK(lftest::fd_is_open(raw));
  d = ex.descriptor;
  d.driver_uuid[15] ^= 1;
  CHECK(lftest::err(f.gl.gl.import_buffer(d, std::move(ex.fd))).code() == Errc::DeviceMismatch);
  CHECK(ex.fd.get() == raw);

  auto cpu = lftest::ok(CpuBuffer::allocate({.size = 4096}));
  CHECK(lftest::err(f.gl.gl.import_buffer(cpu)).code() == Errc::Unsupported);

  int p[2];
  REQUIRE(::pipe(p) == 0);
  UniqueFd not_memory(p[0]), other_end(p[1]);
  auto bad = lftest::err(f.gl.gl.import_buffer(ex.descriptor, std::move(not_memory)));
  CHECK(bad.code() == Errc::InvalidArgument);
  CHECK(bad.cause().find("pipe") != std::string::npos);
  CHECK(not_memory.valid());
  CHECK(lftest::fd_is_open(p[0]));
  // A memory file smaller than the descriptor says: refused before GL maps it.
  UniqueFd small(::memfd_create("short", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(::ftruncate(small.get(), 16) == 0);
  auto short_file = lftest::err(f.gl.gl.import_buffer(ex.descriptor, std::move(small)));
  CHECK(short_file.code() == Errc::Malformed);
  CHECK(short_file.cause().find("does not match the allocation") != std::string::npos);
  CHECK(small.valid());
  // GL_EXT_semaphore_fd: llvmpipe lacks it (CPU waits instead); say so clearly.
  if (!f.gl.gl.capabilities().semaphore_fd) {
    auto s = lftest::err(f.gl.gl.import_semaphore(std::move(ex.fd)));
    CHECK(s.code() == Errc::Unsupported);
    CHECK(s.cause().find("GL_EXT_semaphore_fd") != std::string::npos);
    CHECK(lftest::fd_is_open(raw));
  }
}

TEST_CASE("GL import and destroy cycles leave the open-fd count unchanged") {
  auto f = setup();
  auto buf = lftest::ok(GpuBuffer::allocate(f.vk, {.size = 65536}));
  auto img = lftest::ok(GpuImage::allocate(f.vk, {.width = 64, .height = 64}));
  { auto warm = lftest::ok(f.gl.gl.import_buffer(buf)); }
  const int before = lftest::steady_fds();
  for (int i = 0; i < 1000; ++i) {
    auto b = lftest::ok(f.gl.gl.import_buffer(buf));
    auto t = lftest::ok(f.gl.gl.import_image(img));
  }
  glFinish();
  CHECK(lftest::fds_settled(before) <= before);
}

TEST_CASE("a consumer process reads every channel message through GL, importing each ring buffer once") {
  auto vk = lftest::context_or_skip();
  if (auto gl = lftest::gl_for(vk); !gl) lftest::skip("no GL on this Vulkan device: " + gl.error().message());
  const auto dir = lftest::channel_dir();
  auto prod = lftest::ok(Producer::create(
      "gl-frames",
      {.slots = 4, .slot_size = 100003, .transport = TransportKind::Vulkan, .vulkan = &vk, .directory = dir}));
  const std::uint64_t count = 300;
  const pid_t pid = lftest::run({LAVAFLOW_GL_PEER, "consume", dir.string(), "gl-frames", std::to_string(count)});
  lftest::ok(prod->wait_for_consumers(1, std::chrono::seconds(20)));
  auto stager = lftest::ok(Stager::create(vk, prod->slot_size()));
  std::vector<std::byte> msg;
  for (std::uint64_t i = 0; i < count; ++i) {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(20)));
    msg.resize(1000 + (i * 7919) % 99000);
    lfapp::fill_message(msg, i);
    lftest::ok(stager.upload(static_cast<const GpuBuffer&>(loan.buffer()), msg));
    lftest::ok(prod->publish(std::move(loan), {.size = msg.size()}));
  }
  CHECK(lftest::wait_exit(pid) == 0);
}

TEST_CASE("a GL producer writes ring buffers through GL and a Vulkan consumer process verifies every byte") {
  auto vk = lftest::context_or_skip();
  auto gl = lftest::gl_for(vk);
  if (!gl) lftest::skip("no GL on this Vulkan device: " + gl.error().message());
  const auto dir = lftest::channel_dir();
  auto prod = lftest::ok(Producer::create(
      "gl-writes",
      {.slots = 4, .slot_size = 1 << 16, .transport = TransportKind::Vulkan, .vulkan = &vk, .directory = dir}));
  const std::uint64_t count = 300;
  const pid_t pid = lftest::run(
      {LAVAFLOW_DEMO, "consume", "--channel", "gl-writes", "--count", std::to_string(count), "--dir", dir.string()});
  lftest::ok(prod->wait_for_consumers(1, std::chrono::seconds(20)));
  std::unordered_map<const Buffer*, gl::Buffer> imported;
  std::vector<std::byte> msg(1 << 16);
  for (std::uint64_t i = 0; i < count; ++i) {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(20)));
    auto it = imported.find(&loan.buffer());
    if (it == imported.end())
      it = imported.emplace(&loan.buffer(), lftest::ok(gl->gl.import_buffer(loan.buffer()))).first;
    lfapp::fill_message(msg, i);
    glNamedBufferSubData(it->second.name(), 0, static_cast<GLsizeiptr>(msg.size()), msg.data());
    glFinish();  // GL's writes are done before the hand-off
    lftest::ok(prod->publish(std::move(loan), {.user_tag = lfapp::checksum(msg)}));  // the demo checks it
  }
  CHECK(imported.size() == 4);
  CHECK(lftest::wait_exit(pid) == 0);
}

TEST_CASE("binary semaphore ping-pong between Vulkan and a GL compute shader with a data dependency") {
  auto f = setup();
  if (!f.gl.gl.capabilities().semaphore_fd) lftest::skip("GL context lacks GL_EXT_semaphore_fd");
  auto to_gl = GpuSemaphore::create(f.vk, SemaphoreKind::Binary);
  if (!to_gl) lftest::skip(to_gl.error().message());
  auto to_vk = lftest::ok(GpuSemaphore::create(f.vk, SemaphoreKind::Binary));
  auto gl_wait = lftest::ok(f.gl.gl.import_semaphore(lftest::ok(to_gl->export_fd())));
  auto gl_signal = lftest::ok(f.gl.gl.import_semaphore(lftest::ok(to_vk.export_fd())));
  const std::uint64_t words = 1 << 18, bytes = words * 4;
  auto a = lftest::ok(GpuBuffer::allocate(f.vk, {.size = bytes}));
  auto b = lftest::ok(GpuBuffer::allocate(f.vk, {.size = bytes}));
  std::vector<std::byte> zero(bytes);
  lftest::ok(upload(f.vk, a, zero));
  auto ga = lftest::ok(f.gl.gl.import_buffer(a));
  auto gb = lftest::ok(f.gl.gl.import_buffer(b));
  const char* src =
      "#version 430\nlayout(local_size_x = 256) in;\n"
      "layout(std430, binding = 0) buffer A { uint a[]; };\n"
      "layout(std430, binding = 1) readonly buffer B { uint b[]; };\n"
      "void main() { uint i = gl_GlobalInvocationID.x; a[i] = b[i] + 1u; }\n";
  GLuint sh = glCreateShader(GL_COMPUTE_SHADER);
  glShaderSource(sh, 1, &src, nullptr);
  glCompileShader(sh);
  GLint ok = 0;
  glGetShaderiv(sh, GL_COMPILE_STATUS, &ok);
  REQUIRE(ok == GL_TRUE);
  GLuint prog = glCreateProgram();
  glAttachShader(prog, sh);
  glLinkProgram(prog);
  glGetProgramiv(prog, GL_LINK_STATUS, &ok);
  REQUIRE(ok == GL_TRUE);
  glUseProgram(prog);
  glBindBufferRange(GL_SHADER_STORAGE_BUFFER, 0, ga.name(), static_cast<GLintptr>(ga.offset()),
                    static_cast<GLsizeiptr>(bytes));
  glBindBufferRange(GL_SHADER_STORAGE_BUFFER, 1, gb.name(), static_cast<GLintptr>(gb.offset()),
                    static_cast<GLsizeiptr>(bytes));
  const auto& dev = f.vk.device();
  vk::raii::CommandPool pool(dev, {{}, f.vk.queue_family()});
  vk::raii::CommandBuffers cbs(dev, {*pool, vk::CommandBufferLevel::ePrimary, 1});
  cbs[0].begin({vk::CommandBufferUsageFlagBits::eSimultaneousUse});
  cbs[0].copyBuffer(a.buffer(), b.buffer(), vk::BufferCopy(0, 0, bytes));
  cbs[0].end();
  vk::CommandBuffer raw = *cbs[0];
  vk::Semaphore sig = to_gl->semaphore(), wt = to_vk.semaphore();
  vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eTransfer;
  vk::raii::Fence fence(dev, vk::FenceCreateInfo{});
  const int rounds = 200;
  for (int i = 0; i < rounds; ++i) {
    // Vulkan: b = a (after GL's previous step); GL: a = b + 1 (after this copy).
    vk::SubmitInfo si(i == 0 ? 0u : 1u, &wt, &stage, 1, &raw, 1, &sig);
    f.vk.queue().submit(si, i + 1 == rounds ? *fence : vk::Fence{});
    gl_wait.wait({ga.name(), gb.name()});
    glDispatchCompute(static_cast<GLuint>(words / 256), 1, 1);
    glMemoryBarrier(GL_ALL_BARRIER_BITS);
    if (i + 1 < rounds)
      gl_signal.signal({ga.name(), gb.name()});
    else
      glFlush();
  }
  glFinish();
  REQUIRE(glGetError() == GL_NO_ERROR);
  REQUIRE(dev.waitForFences(*fence, VK_TRUE, 10'000'000'000ull) == vk::Result::eSuccess);
  std::vector<std::uint32_t> out(words);
  lftest::ok(download(f.vk, a, std::as_writable_bytes(std::span(out))));
  CHECK(std::all_of(out.begin(), out.end(), [&](std::uint32_t v) { return v == rounds; }));
  glDeleteProgram(prog);
  glDeleteShader(sh);
}

TEST_CASE("a channel consumer reads received ring buffers as GL buffer textures in a shader") {
  auto f = setup();
  const auto dir = lftest::channel_dir();
  auto prod = lftest::ok(Producer::create(
      "gl-tex",
      {.slots = 2, .slot_size = 4096, .transport = TransportKind::Vulkan, .vulkan = &f.vk, .directory = dir}));
  auto con = lftest::ok(Consumer::open("gl-tex", {.directory = dir}));
  gl::ChannelImports imports(f.gl.gl, *con);
  const char* src =
      "#version 430\nlayout(local_size_x = 64) in;\n"
      "layout(binding = 0) uniform usamplerBuffer words;\n"
      "layout(std430, binding = 1) buffer Out { uint o[]; };\n"
      "void main() { uint i = gl_GlobalInvocationID.x; o[i] = texelFetch(words, int(i)).r; }\n";
  GLuint sh = glCreateShader(GL_COMPUTE_SHADER);
  glShaderSource(sh, 1, &src, nullptr);
  glCompileShader(sh);
  GLuint prog = glCreateProgram();
  glAttachShader(prog, sh);
  glLinkProgram(prog);
  GLint linked = 0;
  glGetProgramiv(prog, GL_LINK_STATUS, &linked);
  REQUIRE(linked == GL_TRUE);
  GLuint out = 0;
  glCreateBuffers(1, &out);
  glNamedBufferStorage(out, 4096, nullptr, GL_DYNAMIC_STORAGE_BIT);
  auto stager = lftest::ok(Stager::create(f.vk, 4096));
  for (std::uint32_t m = 0; m < 6; ++m) {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(10)));
    std::vector<std::uint32_t> words(1024);
    for (std::uint32_t i = 0; i < 1024; ++i) words[i] = m * 100000 + i;
    lftest::ok(stager.upload(static_cast<const GpuBuffer&>(loan.buffer()), std::as_bytes(std::span(words))));
    lftest::ok(prod->publish(std::move(loan)));
    auto r = lftest::ok(con->receive(std::chrono::seconds(10)));
    const auto* tex = lftest::ok(imports.texture(r, GL_R32UI));
    glUseProgram(prog);
    glBindTextureUnit(0, tex->name());
    glBindBufferBase(GL_SHADER_STORAGE_BUFFER, 1, out);
    glDispatchCompute(1024 / 64, 1, 1);
    glMemoryBarrier(GL_ALL_BARRIER_BITS);
    std::vector<std::uint32_t> seen(1024);
    glGetNamedBufferSubData(out, 0, 4096, seen.data());
    REQUIRE(glGetError() == GL_NO_ERROR);
    REQUIRE(seen == words);
    lftest::ok(imports.release(r));  // GL is done with it: dropped at once, the slot reused after GL
  }
  CHECK(imports.imported() == 2);
  if (imports.gpu_handoff() && con->gpu_release_timeline())  // released through the consumer's GPU
    lftest::ok(con->gpu_release_timeline()->wait(6, std::chrono::seconds(10)));
  glDeleteBuffers(1, &out);
  glDeleteProgram(prog);
  glDeleteShader(sh);
}
