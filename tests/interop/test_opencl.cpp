// SPDX-License-Identifier: MIT
// lavaflow::opencl on real drivers: PoCL (CPU, host-pointer path) in CI; NVIDIA OpenCL (external
// memory + semaphores) in the GPU tier. A kernel computes on lava-flow memory in place.
#include <sys/mman.h>
#include <unistd.h>

#include "lavaflow/opencl/opencl.hpp"
#include "support.hpp"

using namespace lavaflow;

namespace {

const char* kKernel = R"(
__kernel void xor_bytes(__global uchar* dst, __global const uchar* src, uchar key, ulong n) {
  size_t i = get_global_id(0);
  if (i < n) dst[i] = src[i] ^ key;
}
__kernel void add_one(__global uint* dst, __global const uint* src, ulong n) {
  size_t i = get_global_id(0);
  if (i < n) dst[i] = src[i] + 1;
})";

struct Cl {
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;
  cl_program program = nullptr;
  cl_kernel kernel = nullptr;
  cl_kernel add_one = nullptr;
  std::optional<cl::Interop> interop;
  ~Cl() {
    interop.reset();
    if (add_one) clReleaseKernel(add_one);
    if (kernel) clReleaseKernel(kernel);
    if (program) clReleaseProgram(program);
    if (queue) clReleaseCommandQueue(queue);
    if (context) clReleaseContext(context);
  }
};

/// The OpenCL device that runs on `vk`'s device (external memory), else a CPU device (first, when
/// `cpu_first`).
std::unique_ptr<Cl> open_cl(const VulkanContext& vk, bool cpu_first = false) {
  auto all = lftest::ok(cl::devices());
  const cl::DeviceInfo* pick = nullptr;
  for (const auto& d : all)
    if (d.uuid_known && d.device_uuid == vk.capabilities().identity.device_uuid && d.external_memory_fd && !cpu_first)
      pick = &d;
  if (!pick)
    for (const auto& d : all)
      if (d.host_pointer_path) pick = pick ? pick : &d;
  if (!pick)
    lftest::skip("no OpenCL device on this Vulkan device and no CPU OpenCL device (" + std::to_string(all.size()) +
                 " devices)");
  auto c = std::make_unique<Cl>();
  cl_int err = CL_SUCCESS;
  c->context = clCreateContext(nullptr, 1, &pick->device, nullptr, nullptr, &err);
  REQUIRE(err == CL_SUCCESS);
  c->queue = clCreateCommandQueueWithProperties(c->context, pick->device, nullptr, &err);
  REQUIRE(err == CL_SUCCESS);
  c->program = clCreateProgramWithSource(c->context, 1, &kKernel, nullptr, &err);
  REQUIRE(clBuildProgram(c->program, 1, &pick->device, "", nullptr, nullptr) == CL_SUCCESS);
  c->kernel = clCreateKernel(c->program, "xor_bytes", &err);
  REQUIRE(err == CL_SUCCESS);
  c->add_one = clCreateKernel(c->program, "add_one", &err);
  REQUIRE(err == CL_SUCCESS);
  c->interop.emplace(lftest::ok(cl::Interop::create(c->context, pick->device)));
  return c;
}

/// dst = src ^ key on the OpenCL device, bracketed by acquire/release; waits for it.
void run_xor(Cl& c, const cl::Memory& dst, const cl::Memory& src, std::uint8_t key, std::uint64_t n) {
  const cl::Memory* both[] = {&dst, &src};
  auto access = lftest::ok(c.interop->acquire(c.queue, both));
  cl_mem d = dst.get(), s = src.get();
  cl_ulong count = n;
  cl_uchar k = key;
  REQUIRE(clSetKernelArg(c.kernel, 0, sizeof d, &d) == CL_SUCCESS);
  REQUIRE(clSetKernelArg(c.kernel, 1, sizeof s, &s) == CL_SUCCESS);
  REQUIRE(clSetKernelArg(c.kernel, 2, sizeof k, &k) == CL_SUCCESS);
  REQUIRE(clSetKernelArg(c.kernel, 3, sizeof count, &count) == CL_SUCCESS);
  const std::size_t global = (n + 63) / 64 * 64;
  REQUIRE(clEnqueueNDRangeKernel(c.queue, c.kernel, 1, nullptr, &global, nullptr, 0, nullptr, nullptr) == CL_SUCCESS);
  lftest::ok(access.release());
  REQUIRE(clFinish(c.queue) == CL_SUCCESS);
}

GpuMemory memory_for(const cl::Interop& cl) {
  return cl.device().external_memory_fd ? GpuMemory::DeviceLocal : GpuMemory::HostVisible;
}

}  // namespace

TEST_CASE("an OpenCL kernel computes on Vulkan memory in place, both directions, odd sizes") {
  auto vk = lftest::context_or_skip();
  auto c = open_cl(vk);
  INFO("OpenCL device " << c->interop->device().name);
  for (std::uint64_t n : {std::uint64_t{1}, std::uint64_t{4093}, (std::uint64_t{1} << 20) + 5}) {
    auto src = lftest::ok(GpuBuffer::allocate(vk, {.size = n, .memory = memory_for(*c->interop)}));
    auto dst = lftest::ok(GpuBuffer::allocate(vk, {.size = n, .memory = memory_for(*c->interop)}));
    CHECK(lftest::gpu_fill(vk, src, n) == "");
    auto s = lftest::ok(c->interop->import_buffer(src));
    auto d = lftest::ok(c->interop->import_buffer(dst));
    CHECK(s.path() ==
          (c->interop->device().external_memory_fd ? cl::ImportPath::ExternalMemory : cl::ImportPath::HostPointer));
    run_xor(*c, d, s, 0x5a, n);
    std::vector<std::byte> seen(n), want(n);
    lftest::ok(download(vk, dst, seen));
    lftest::fill(want, n);
    for (auto& b : want) b ^= std::byte{0x5a};
    CHECK(seen == want);
    // Vulkan writes new bytes into the same memory; OpenCL sees them without re-import.
    CHECK(lftest::gpu_fill(vk, src, n + 1) == "");
    run_xor(*c, d, s, 0, n);
    CHECK(lftest::gpu_check(vk, dst, n + 1) == "");
  }
}

TEST_CASE("OpenCL uses CPU shared memory in place on a CPU device") {
  auto vk = lftest::context_or_skip();
  auto c = open_cl(vk, true);
  if (!c->interop->device().host_pointer_path) lftest::skip("no CPU OpenCL device");
  const std::uint64_t n = 100003;
  auto a = lftest::ok(CpuBuffer::allocate({.size = n}));
  auto b = lftest::ok(CpuBuffer::allocate({.size = n}));
  lftest::fill(a.bytes(), 11);
  auto ma = lftest::ok(c->interop->import_buffer(a));
  auto mb = lftest::ok(c->interop->import_buffer(b));
  CHECK(ma.path() == cl::ImportPath::HostPointer);
  run_xor(*c, mb, ma, 0, n);
  CHECK(lftest::first_mismatch(b.bytes(), 11) == -1);  // the kernel wrote the shared mapping itself
}

TEST_CASE("OpenCL refuses what it cannot share without a copy, naming why, and keeps the fd") {
  auto vk = lftest::context_or_skip();
  auto c = open_cl(vk);
  const auto& dev = c->interop->device();
  auto buf = lftest::ok(GpuBuffer::allocate(vk, {.size = 4096}));
  auto ex = lftest::ok(buf.export_handle());
  const int raw = ex.fd.get();
  if (!dev.external_memory_fd) {
    auto e = lftest::err(c->interop->import_buffer(ex.descriptor, std::move(ex.fd)));
    CHECK(e.code() == Errc::Unsupported);
    CHECK(e.cause().find("cl_khr_external_memory_opaque_fd") != std::string::npos);
    auto dl = lftest::err(c->interop->import_buffer(buf));  // device-local on a CPU device
    CHECK(dl.code() == Errc::Unsupported);
    CHECK(dl.cause().find("device-local") != std::string::npos);
    auto s = lftest::err(c->interop->import_semaphore(std::move(ex.fd)));
    CHECK(s.code() == Errc::Unsupported);
  } else {
    auto d = ex.descriptor;
    d.device_uuid[1] ^= 0x10;
    CHECK(lftest::err(c->interop->import_buffer(d, std::move(ex.fd))).code() == Errc::DeviceMismatch);
    // A memory file smaller than the descriptor says: refused before OpenCL maps it.
    UniqueFd small(::memfd_create("short", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(::ftruncate(small.get(), 16) == 0);
    CHECK(lftest::err(c->interop->import_buffer(ex.descriptor, std::move(small))).code() == Errc::Malformed);
  }
  CHECK(ex.fd.get() == raw);
  CHECK(lftest::fd_is_open(raw));
}

TEST_CASE("a channel consumer hands each received ring buffer to OpenCL once and computes on every message") {
  auto vk = lftest::context_or_skip();
  auto c = open_cl(vk);
  const auto dir = lftest::channel_dir();
  // Device-local rings need external memory; a CPU OpenCL device takes the shared-memory ring.
  const auto transport = c->interop->device().external_memory_fd ? TransportKind::Vulkan : TransportKind::Shm;
  auto prod = lftest::ok(Producer::create(
      "cl-ring", {.slots = 4, .slot_size = 65536, .transport = transport, .vulkan = &vk, .directory = dir}));
  auto con = lftest::ok(Consumer::open("cl-ring", {.host_wait_for_gpu = false, .vulkan = &vk, .directory = dir}));
  cl::ChannelImports imports(*c->interop, *con);
  const std::uint64_t n = 65536;
  auto out = lftest::ok(GpuBuffer::allocate(vk, {.size = n, .memory = memory_for(*c->interop)}));
  auto out_cl = lftest::ok(c->interop->import_buffer(out));
  auto stager = lftest::ok(Stager::create(vk, n));
  std::vector<std::byte> msg(n), seen(n);
  for (std::uint64_t i = 0; i < 40; ++i) {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(10)));
    lftest::fill(msg, i);
    if (auto* g = dynamic_cast<GpuBuffer*>(&loan.buffer()))
      lftest::ok(stager.upload(*g, msg));
    else
      std::memcpy(loan.bytes().data(), msg.data(), n);
    lftest::ok(prod->publish(std::move(loan)));
    auto r = lftest::ok(con->receive(std::chrono::seconds(10)));
    const auto* in = lftest::ok(imports.buffer(r));
    lftest::ok(imports.wait(c->queue, r));
    run_xor(*c, out_cl, *in, 0, n);
    lftest::ok(imports.release(c->queue, r));  // dropped at once: the slot is rewritten after OpenCL
    lftest::ok(download(vk, out, seen));
    REQUIRE(lftest::first_mismatch(seen, i) == -1);
  }
  CHECK(imports.imported() == 4);
  if (imports.gpu_handoff() && con->gpu_release_timeline())
    lftest::ok(con->gpu_release_timeline()->wait(40, std::chrono::seconds(10)));
}

TEST_CASE("binary semaphore ping-pong between Vulkan and OpenCL with a data dependency") {
  auto vk = lftest::context_or_skip();
  auto c = open_cl(vk);
  if (!c->interop->device().external_semaphore_fd)
    lftest::skip("OpenCL device " + c->interop->device().name + " lacks cl_khr_external_semaphore_opaque_fd");
  auto to_cl = GpuSemaphore::create(vk, SemaphoreKind::Binary);
  if (!to_cl) lftest::skip(to_cl.error().message());
  auto to_vk = lftest::ok(GpuSemaphore::create(vk, SemaphoreKind::Binary));
  auto cl_wait = lftest::ok(c->interop->import_semaphore(lftest::ok(to_cl->export_fd())));
  auto cl_signal = lftest::ok(c->interop->import_semaphore(lftest::ok(to_vk.export_fd())));
  const std::uint64_t words = 1 << 18, bytes = words * 4;
  auto a = lftest::ok(GpuBuffer::allocate(vk, {.size = bytes}));
  auto b = lftest::ok(GpuBuffer::allocate(vk, {.size = bytes}));
  std::vector<std::byte> zero(bytes);
  lftest::ok(upload(vk, a, zero));
  auto ma = lftest::ok(c->interop->import_buffer(a));
  auto mb = lftest::ok(c->interop->import_buffer(b));
  const auto& dev = vk.device();
  vk::raii::CommandPool pool(dev, {{}, vk.queue_family()});
  vk::raii::CommandBuffers cbs(dev, {*pool, vk::CommandBufferLevel::ePrimary, 1});
  cbs[0].begin({vk::CommandBufferUsageFlagBits::eSimultaneousUse});  // resubmitted while the last may be pending
  cbs[0].copyBuffer(a.buffer(), b.buffer(), vk::BufferCopy(0, 0, bytes));
  cbs[0].end();
  vk::CommandBuffer raw = *cbs[0];
  vk::Semaphore sig = to_cl->semaphore(), wt = to_vk.semaphore();
  vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eTransfer;
  vk::raii::Fence fence(dev, vk::FenceCreateInfo{});
  const cl::Memory* both[] = {&ma, &mb};
  cl_mem da = ma.get(), db = mb.get();
  cl_ulong n = words;
  REQUIRE(clSetKernelArg(c->add_one, 0, sizeof da, &da) == CL_SUCCESS);
  REQUIRE(clSetKernelArg(c->add_one, 1, sizeof db, &db) == CL_SUCCESS);
  REQUIRE(clSetKernelArg(c->add_one, 2, sizeof n, &n) == CL_SUCCESS);
  const std::size_t global = words;
  const int rounds = 200;
  for (int i = 0; i < rounds; ++i) {
    // Vulkan: b = a (after OpenCL's previous step); OpenCL: a = b + 1 (after this copy).
    vk::SubmitInfo si(i == 0 ? 0u : 1u, &wt, &stage, 1, &raw, 1, &sig);
    vk.queue().submit(si, i + 1 == rounds ? *fence : vk::Fence{});
    lftest::ok(c->interop->wait(c->queue, cl_wait));
    auto access = lftest::ok(c->interop->acquire(c->queue, both));
    REQUIRE(clEnqueueNDRangeKernel(c->queue, c->add_one, 1, nullptr, &global, nullptr, 0, nullptr, nullptr) ==
            CL_SUCCESS);
    lftest::ok(access.release());
    if (i + 1 < rounds) lftest::ok(c->interop->signal(c->queue, cl_signal));
    REQUIRE(clFlush(c->queue) == CL_SUCCESS);
  }
  REQUIRE(clFinish(c->queue) == CL_SUCCESS);
  REQUIRE(dev.waitForFences(*fence, VK_TRUE, 10'000'000'000ull) == vk::Result::eSuccess);
  std::vector<std::uint32_t> out(words);
  lftest::ok(download(vk, a, std::as_writable_bytes(std::span(out))));
  CHECK(std::all_of(out.begin(), out.end(), [&](std::uint32_t v) { return v == rounds; }));
}
