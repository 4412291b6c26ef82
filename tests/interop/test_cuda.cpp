// SPDX-License-Identifier: MIT
// lavaflow::cuda on a real NVIDIA GPU (GPU tier); on machines without one every test is a visible
// skip naming what CUDA said. Vk→CUDA and CUDA→Vk, buffers and images, odd sizes and offsets,
// timeline and binary semaphore ping-pong with a data dependency, fd accounting, refusals.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_kernels.hpp"
#include "lavaflow/core/unix_socket.hpp"
#include "lavaflow/cuda/cuda.hpp"
#include "support.hpp"

using namespace lavaflow;

namespace {

struct Fixture {
  VulkanContext vk;
  cuda::Interop cu;
};

Fixture setup() {
  auto devs = cuda::devices();
  if (!devs) lftest::skip("no CUDA device: " + devs.error().message());
  if (devs->empty()) lftest::skip("CUDA reports no device");
  auto vk = lftest::context_or_skip({.device = devs->front().uuid});
  auto cu = cuda::Interop::create(vk);
  if (!cu) lftest::skip("the Vulkan device has no CUDA device: " + cu.error().message());
  return Fixture{std::move(vk), std::move(*cu)};
}

#define CU_OK(expr) REQUIRE((expr) == cudaSuccess)

/// A writer's and a reader's stream, and a device word the reader's checks count wrong words in.
struct TwoStreams {
  cudaStream_t writer = nullptr, reader = nullptr;
  unsigned long long* errors = nullptr;
  TwoStreams() {
    CU_OK(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking));
    CU_OK(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
    CU_OK(cudaMalloc(reinterpret_cast<void**>(&errors), sizeof *errors));
    // Each kernel runs once first: modules load lazily, and loading one while a stream of the
    // process waits for a signal not queued yet can deadlock.
    CU_OK(lf_kernel_fill_frame(errors, sizeof *errors, 0, writer));
    CU_OK(lf_kernel_check_frame(errors, sizeof *errors, 0, 0, errors, nullptr, nullptr, writer));
    CU_OK(cudaStreamSynchronize(writer));  // a non-blocking stream: the memset does not wait for it
    CU_OK(cudaMemset(errors, 0, sizeof *errors));
    CU_OK(cudaDeviceSynchronize());
  }
  TwoStreams(const TwoStreams&) = delete;
  TwoStreams& operator=(const TwoStreams&) = delete;
  ~TwoStreams() {
    cudaFree(errors);
    cudaStreamDestroy(writer);
    cudaStreamDestroy(reader);
  }
  /// Words found wrong, once both streams are done.
  unsigned long long wrong() const {
    unsigned long long bad = ~0ull;
    if (cudaStreamSynchronize(writer) != cudaSuccess || cudaStreamSynchronize(reader) != cudaSuccess) return bad;
    (void)cudaMemcpy(&bad, errors, sizeof bad, cudaMemcpyDeviceToHost);
    return bad;
  }
};

/// A producer whose GPU waits for its consumers' GPU releases itself (no host wait), ordered by
/// `kind`; a visible skip where the device cannot order GPU work that way.
std::unique_ptr<Producer> gpu_ordered_producer(const Fixture& f, const std::string& name, std::uint32_t slots,
                                               std::uint64_t bytes, GpuSyncKind kind,
                                               const std::filesystem::path& dir) {
  auto prod = lftest::ok(Producer::create(name, {.slots = slots,
                                                 .slot_size = bytes,
                                                 .host_wait_for_gpu_release = false,
                                                 .gpu_sync = kind,
                                                 .transport = TransportKind::Vulkan,
                                                 .vulkan = &f.vk,
                                                 .directory = dir}));
  if (prod->gpu_sync() != kind) lftest::skip("the channel cannot order GPU work with timelines on this device");
  return prod;
}

}  // namespace

TEST_CASE("Vulkan to CUDA and CUDA to Vulkan buffers are byte-exact, odd sizes and non-zero offsets") {
  auto f = setup();
  for (std::uint64_t size : {std::uint64_t{1}, std::uint64_t{4093}, (std::uint64_t{64} << 20) + 3}) {
    INFO("size " << size);
    auto buf = lftest::ok(GpuBuffer::allocate(f.vk, {.size = size}));
    CHECK(lftest::gpu_fill(f.vk, buf, size) == "");
    auto ext = lftest::ok(f.cu.import_buffer(buf));
    std::vector<std::byte> seen(size);
    CU_OK(cudaMemcpy(seen.data(), ext.data(), size, cudaMemcpyDeviceToHost));
    CHECK(lftest::first_mismatch(seen, size) == -1);
    CU_OK(lf_kernel_xor(ext.data(), ext.data(), 0xa5, size, nullptr));
    CU_OK(cudaDeviceSynchronize());
    std::vector<std::byte> back(size), want = lftest::pattern(size, size);
    for (auto& b : want) b ^= std::byte{0xa5};
    lftest::ok(download(f.vk, buf, back));
    CHECK(back == want);
  }
  // A sub-range at a non-zero offset.
  const std::uint64_t size = 1 << 20, offset = 65536 + 512, len = 100001;
  auto buf = lftest::ok(GpuBuffer::allocate(f.vk, {.size = size}));
  CHECK(lftest::gpu_fill(f.vk, buf, 9) == "");
  auto ex = lftest::ok(buf.export_handle());
  ex.descriptor.offset = offset;
  ex.descriptor.size = len;
  auto ext = lftest::ok(f.cu.import_buffer(ex.descriptor, std::move(ex.fd)));
  CHECK_FALSE(ex.fd.valid());
  std::vector<std::byte> seen(len);
  CU_OK(cudaMemcpy(seen.data(), ext.data(), len, cudaMemcpyDeviceToHost));
  const auto all = lftest::pattern(size, 9);
  CHECK(std::equal(seen.begin(), seen.end(), all.begin() + static_cast<std::ptrdiff_t>(offset)));
}

TEST_CASE("memory allocated by CUDA (cuMemCreate) is imported by Vulkan, both directions") {
  auto f = setup();
  const std::uint64_t size = (8 << 20) + 13;
  auto alloc = f.cu.allocate_exportable(size);
  if (!alloc) lftest::skip("no POSIX-fd CUDA allocations: " + alloc.error().message());
  const auto px = lftest::pattern(size, 77);
  CU_OK(cudaMemcpy(alloc->data(), px.data(), size, cudaMemcpyHostToDevice));
  auto ex = lftest::ok(alloc->export_for(f.vk));
  auto vkbuf = lftest::ok(GpuBuffer::import(f.vk, ex.descriptor, std::move(ex.fd)));
  CHECK(lftest::gpu_check(f.vk, vkbuf, 77) == "");
  CHECK(lftest::gpu_fill(f.vk, vkbuf, 78) == "");
  std::vector<std::byte> seen(size);
  CU_OK(cudaMemcpy(seen.data(), alloc->data(), size, cudaMemcpyDeviceToHost));
  CHECK(lftest::first_mismatch(seen, 78) == -1);
}

TEST_CASE("Vulkan images are CUDA mipmapped arrays: pixels both ways") {
  auto f = setup();
  for (auto [w, h] : {std::pair{333u, 77u}, std::pair{1920u, 1080u}}) {
    INFO(w << "x" << h);
    auto img = lftest::ok(GpuImage::allocate(f.vk, {.width = w, .height = h, .format = PixelFormat::Rgba8}));
    auto px = lftest::pattern(img.descriptor().packed_size(), w);
    lftest::ok(upload_image(f.vk, img, px));
    auto arr = lftest::ok(f.cu.import_image(img));
    std::vector<std::byte> seen(px.size());
    CU_OK(cudaMemcpy2DFromArray(seen.data(), w * 4, arr.level0(), 0, 0, w * 4, h, cudaMemcpyDeviceToHost));
    CHECK(seen == px);
    std::reverse(px.begin(), px.end());
    CU_OK(cudaMemcpy2DToArray(arr.level0(), 0, 0, px.data(), w * 4, w * 4, h, cudaMemcpyHostToDevice));
    CU_OK(cudaDeviceSynchronize());
    std::vector<std::byte> back(px.size());
    lftest::ok(download_image(f.vk, img, back));
    CHECK(back == px);
  }
}

TEST_CASE("timeline semaphore ping-pong between Vulkan and CUDA, no CPU waits in the loop") {
  auto f = setup();
  auto sem = GpuSemaphore::create(f.vk, SemaphoreKind::Timeline);
  if (!sem) lftest::skip(sem.error().message());
  auto csem = lftest::ok(f.cu.import_semaphore(*sem));
  const std::uint64_t words = 1 << 20, bytes = words * 4;
  auto a = lftest::ok(GpuBuffer::allocate(f.vk, {.size = bytes}));
  auto b = lftest::ok(GpuBuffer::allocate(f.vk, {.size = bytes}));
  std::vector<std::byte> zero(bytes);
  lftest::ok(upload(f.vk, a, zero));
  auto ca = lftest::ok(f.cu.import_buffer(a));
  auto cb = lftest::ok(f.cu.import_buffer(b));
  cudaStream_t stream;
  CU_OK(cudaStreamCreate(&stream));
  const std::uint64_t rounds = 500;
  std::vector<lftest::PendingCopy> pending;
  for (std::uint64_t i = 0; i < rounds; ++i) {
    // Vulkan: b = a, after CUDA's step i-1; signals 2i+1. CUDA: a = b + 1 after it; signals 2i+2.
    pending.push_back(lftest::submit_copy(f.vk, a.buffer(), 0, b.buffer(), 0, bytes, GpuSync{sem->semaphore(), 2 * i},
                                          GpuSync{sem->semaphore(), 2 * i + 1}));
    lftest::ok(csem.wait(stream, 2 * i + 1));
    CU_OK(lf_kernel_add_one(ca.data(), cb.data(), words, stream));
    lftest::ok(csem.signal(stream, 2 * i + 2));
  }
  lftest::ok(sem->wait(2 * rounds, std::chrono::seconds(30)));
  std::vector<std::uint32_t> out(words);
  lftest::ok(download(f.vk, a, std::as_writable_bytes(std::span(out))));
  CHECK(std::all_of(out.begin(), out.end(), [&](std::uint32_t v) { return v == rounds; }));
  CU_OK(cudaStreamDestroy(stream));
}

TEST_CASE("binary semaphore ping-pong between Vulkan and CUDA") {
  auto f = setup();
  auto to_cuda = GpuSemaphore::create(f.vk, SemaphoreKind::Binary);
  if (!to_cuda) lftest::skip(to_cuda.error().message());
  auto to_vk = lftest::ok(GpuSemaphore::create(f.vk, SemaphoreKind::Binary));
  auto c_wait = lftest::ok(f.cu.import_semaphore(*to_cuda));
  auto c_signal = lftest::ok(f.cu.import_semaphore(to_vk));
  const std::uint64_t words = 1 << 18, bytes = words * 4;
  auto a = lftest::ok(GpuBuffer::allocate(f.vk, {.size = bytes}));
  auto b = lftest::ok(GpuBuffer::allocate(f.vk, {.size = bytes}));
  std::vector<std::byte> zero(bytes);
  lftest::ok(upload(f.vk, a, zero));
  auto ca = lftest::ok(f.cu.import_buffer(a));
  auto cb = lftest::ok(f.cu.import_buffer(b));
  cudaStream_t stream;
  CU_OK(cudaStreamCreate(&stream));
  const auto& dev = f.vk.device();
  vk::raii::CommandPool pool(dev, {vk::CommandPoolCreateFlagBits::eResetCommandBuffer, f.vk.queue_family()});
  vk::raii::CommandBuffers cbs(dev, {*pool, vk::CommandBufferLevel::ePrimary, 1});
  cbs[0].begin({vk::CommandBufferUsageFlagBits::eSimultaneousUse});  // resubmitted while the last may be pending
  cbs[0].copyBuffer(a.buffer(), b.buffer(), vk::BufferCopy(0, 0, bytes));
  cbs[0].end();
  vk::CommandBuffer raw = *cbs[0];
  vk::Semaphore sig = to_cuda->semaphore(), wt = to_vk.semaphore();
  vk::PipelineStageFlags stage = vk::PipelineStageFlagBits::eTransfer;
  const int rounds = 300;
  vk::raii::Fence fence(dev, vk::FenceCreateInfo{});
  for (int i = 0; i < rounds; ++i) {
    vk::SubmitInfo si(i == 0 ? 0u : 1u, &wt, &stage, 1, &raw, 1, &sig);
    f.vk.queue().submit(si, i + 1 == rounds ? *fence : vk::Fence{});
    lftest::ok(c_wait.wait(stream));
    CU_OK(lf_kernel_add_one(ca.data(), cb.data(), words, stream));
    if (i + 1 < rounds) lftest::ok(c_signal.signal(stream));
    // A command buffer may be resubmitted once its previous submission is done: the semaphore
    // chain orders that on the GPU (the next copy waits for CUDA, which waited for this copy).
  }
  CU_OK(cudaStreamSynchronize(stream));
  REQUIRE(dev.waitForFences(*fence, VK_TRUE, 10'000'000'000ull) == vk::Result::eSuccess);
  std::vector<std::uint32_t> out(words);
  lftest::ok(download(f.vk, a, std::as_writable_bytes(std::span(out))));
  CHECK(std::all_of(out.begin(), out.end(), [&](std::uint32_t v) { return v == rounds; }));
  CU_OK(cudaStreamDestroy(stream));
}

TEST_CASE("CUDA refuses another device's memory and keeps the fd, and 10,000 import cycles keep the fd count") {
  auto f = setup();
  auto buf = lftest::ok(GpuBuffer::allocate(f.vk, {.size = 1 << 20}));
  auto ex = lftest::ok(buf.export_handle());
  const int raw = ex.fd.get();
  auto d = ex.descriptor;
  d.device_uuid[2] ^= 0x40;
  auto e = lftest::err(f.cu.import_buffer(d, std::move(ex.fd)));
  CHECK(e.code() == Errc::DeviceMismatch);
  CHECK(lftest::fd_is_open(raw));
  // A memory file smaller than the descriptor says: refused before CUDA maps it.
  UniqueFd small(::memfd_create("short", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(::ftruncate(small.get(), 16) == 0);
  CHECK(lftest::err(f.cu.import_buffer(ex.descriptor, std::move(small))).code() == Errc::Malformed);
  Uuid bogus{};
  bogus[0] = 0x42;
  CHECK(lftest::err(cuda::Interop::create(bogus)).cause().find("CUDA sees") != std::string::npos);
  { auto warm = lftest::ok(f.cu.import_buffer(buf)); }
  const int before = lftest::steady_fds();
  for (int i = 0; i < 10000; ++i) auto m = lftest::ok(f.cu.import_buffer(buf));
  CHECK(lftest::fds_settled(before) <= before);
}

TEST_CASE("a CUDA stream waits on a channel's timeline and reads each received ring buffer, imported once") {
  auto f = setup();
  const auto dir = lftest::channel_dir();
  auto prod = lftest::ok(Producer::create(
      "cuda-ring",
      {.slots = 4, .slot_size = 1 << 20, .transport = TransportKind::Vulkan, .vulkan = &f.vk, .directory = dir}));
  if (!prod->has_gpu_timeline()) lftest::skip("the channel has no shared timeline semaphore on this device");
  auto con = lftest::ok(Consumer::open("cuda-ring", {.host_wait_for_gpu = false, .vulkan = &f.vk, .directory = dir}));
  cuda::ChannelImports imports(f.cu);
  const std::uint64_t n = 1 << 20;
  auto staging = lftest::ok(GpuBuffer::allocate(f.vk, {.size = n, .memory = GpuMemory::HostVisible}));
  cudaStream_t stream;
  CU_OK(cudaStreamCreate(&stream));
  std::vector<std::byte> seen(n);
  for (std::uint64_t i = 0; i < 64; ++i) {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(10)));
    lftest::fill(staging.bytes(), i);
    auto sig = loan.gpu_signal();
    auto copy = lftest::submit_copy(f.vk, staging.buffer(), 0, static_cast<GpuBuffer&>(loan.buffer()).buffer(), 0, n,
                                    std::nullopt, sig);
    lftest::ok(prod->publish(std::move(loan)));  // no CPU wait: the timeline orders the GPU work
    auto r = lftest::ok(con->receive(std::chrono::seconds(10)));
    const auto* in = lftest::ok(imports.buffer(r));
    lftest::ok(imports.wait(stream, r));
    CU_OK(cudaMemcpyAsync(seen.data(), in->data(), n, cudaMemcpyDeviceToHost, stream));
    CU_OK(cudaStreamSynchronize(stream));
    REQUIRE(lftest::first_mismatch(seen, i) == -1);
    REQUIRE(f.vk.device().waitForFences(*copy.fence, VK_TRUE, 10'000'000'000ull) == vk::Result::eSuccess);
  }
  CHECK(imports.imported() == 4);
  CU_OK(cudaStreamDestroy(stream));
}

TEST_CASE("a consumer process reads every channel message with CUDA, ordered by the timeline or GPU flags") {
  auto f = setup();
  const auto kind = GENERATE(GpuSyncKind::Semaphore, GpuSyncKind::Flag);
  const auto dir = lftest::channel_dir();
  auto prod = lftest::ok(Producer::create("cuda-proc", {.slots = 4,
                                                        .slot_size = 1 << 20,
                                                        .gpu_sync = kind,
                                                        .transport = TransportKind::Vulkan,
                                                        .vulkan = &f.vk,
                                                        .directory = dir}));
  const std::uint64_t count = 200;
  const pid_t pid = lftest::run({LAVAFLOW_CUDA_PEER, "consume", dir.string(), "cuda-proc", std::to_string(count)});
  lftest::ok(prod->wait_for_consumers(1, std::chrono::seconds(30)));
  std::vector<GpuBuffer> staging;
  for (int k = 0; k < 8; ++k)
    staging.push_back(lftest::ok(GpuBuffer::allocate(f.vk, {.size = 1 << 20, .memory = GpuMemory::HostVisible})));
  // Destroyed, not move-assigned, before reuse: a PendingCopy must free its command buffers
  // before its pool.
  std::vector<std::optional<lftest::PendingCopy>> pending(8);
  for (std::uint64_t i = 0; i < count; ++i) {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(20)));
    auto& st = staging[i % 8];
    auto& slot = pending[i % 8];
    if (slot)  // staging reuse: its last copy must be done
      REQUIRE(f.vk.device().waitForFences(*slot->fence, VK_TRUE, 10'000'000'000ull) == vk::Result::eSuccess);
    slot.reset();
    const std::uint64_t n = 1000 + (i * 7919) % 1000000;
    lftest::fill(st.bytes().first(n), i);
    auto sig = loan.gpu_signal();
    // A Vulkan queue signals a timeline; a GPU flag is raised here once the copy is done (on a
    // flag channel the consumer's CUDA stream still waits for it on the GPU).
    const bool queue_signals = sig && sig->kind() == GpuSyncKind::Semaphore;
    slot.emplace(lftest::submit_copy(f.vk, st.buffer(), 0, static_cast<GpuBuffer&>(loan.buffer()).buffer(), 0, n,
                                     std::nullopt, queue_signals ? sig : std::nullopt));
    if (!queue_signals) {
      REQUIRE(f.vk.device().waitForFences(*slot->fence, VK_TRUE, 10'000'000'000ull) == vk::Result::eSuccess);
      if (sig) lftest::ok(signal_on_host(*sig));
    }
    lftest::ok(prod->publish(std::move(loan), {.size = n}));
  }
  CHECK(lftest::wait_exit(pid) == 0);
}

TEST_CASE("CUDA writes and reads every message ordered on the GPU both ways: a slot is rewritten only after the read") {
  auto f = setup();
  const auto dir = lftest::channel_dir();
  constexpr std::uint32_t kSlots = 2;
  constexpr std::uint64_t kBytes = 1 << 20;
  const auto kind = GENERATE(GpuSyncKind::Semaphore, GpuSyncKind::Flag);
  auto prod = gpu_ordered_producer(f, "cuda-both", kSlots, kBytes, kind, dir);
  auto con = lftest::ok(Consumer::open("cuda-both", {.host_wait_for_gpu = false, .vulkan = &f.vk, .directory = dir}));
  REQUIRE(con->gpu_sync() == kind);
  TwoStreams t;  // before the imports, which may still queue on the streams as they go
  cuda::ChannelImports out(f.cu), in(f.cu);
  cudaStream_t ps = t.writer, cs = t.reader;
  unsigned long long* errors = t.errors;
  // The reader sleeps before reading, so a writer that did not wait for its release would
  // overwrite the slot under it; nothing on the host waits for either stream in the loop.
  constexpr std::uint64_t kCount = 300;
  std::uint64_t loans_with_waits = 0;
  for (std::uint64_t i = 0; i < kCount; ++i) {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(20)));
    loans_with_waits += !loan.gpu_waits().empty();
    const auto* dst = lftest::ok(out.buffer(loan));
    lftest::ok(out.wait(ps, loan));
    CU_OK(lf_kernel_fill_frame(dst->data(), kBytes, i, ps));
    lftest::ok(out.signal(ps, loan));
    lftest::ok(prod->publish(std::move(loan)));
    auto r = lftest::ok(con->receive(std::chrono::seconds(20)));
    REQUIRE(r.info().sequence == i);
    REQUIRE(r.gpu_wait().has_value());
    const auto* src = lftest::ok(in.buffer(r));
    lftest::ok(in.wait(cs, r));
    CU_OK(lf_kernel_check_frame(src->data(), kBytes, i, 20'000, errors, nullptr, nullptr, cs));
    lftest::ok(in.release(cs, r));
  }
  CHECK(t.wrong() == 0);
  // Every reuse of a slot waits for the GPU read, on the GPU, unless that read was already done
  // when the slot was loaned (then there is nothing to wait on); the sleeping reader keeps most
  // reads in flight.
  CHECK(loans_with_waits > 0);
  CHECK(loans_with_waits <= kCount - kSlots);
  // The ring buffers, and on a flag channel the flag block (written counter) and the consumer's
  // release block.
  const std::size_t flags = kind == GpuSyncKind::Flag ? 2 : 0;
  CHECK(in.imported() == kSlots + flags);
  CHECK(out.imported() == kSlots + flags);
}

TEST_CASE(
    "CUDA streams order a channel in batches: one wait per batch, the other signals deferred into the batch's last") {
  auto f = setup();
  const auto dir = lftest::channel_dir();
  constexpr std::uint32_t kSlots = 8;
  constexpr std::uint64_t kBytes = 1 << 20, kBatch = 3, kCount = 300;
  using Queue = cuda::ChannelImports::Queue;
  const auto kind = GENERATE(GpuSyncKind::Semaphore, GpuSyncKind::Flag);
  auto prod = gpu_ordered_producer(f, "cuda-batch", kSlots, kBytes, kind, dir);
  auto con = lftest::ok(Consumer::open("cuda-batch", {.host_wait_for_gpu = false, .vulkan = &f.vk, .directory = dir}));
  TwoStreams t;  // before the imports, which may still queue on the streams as they go
  cuda::ChannelImports out(f.cu), in(f.cu);
  cudaStream_t ps = t.writer, cs = t.reader;
  unsigned long long* errors = t.errors;
  // The reader sleeps before each read, so a writer that rewrote a slot before its (deferred)
  // release would be caught; no host thread waits for either stream in the loop.
  std::uint64_t waits_ahead = 0;
  for (std::uint64_t b = 0; b < kCount; b += kBatch) {
    // The consumer's stream waits for the batch's last message before any of it is written.
    const auto last = lftest::ok(con->upcoming(b + kBatch - 1));
    lftest::ok(in.wait(cs, last));
    for (std::uint64_t i = b; i < b + kBatch; ++i) {
      auto loan = lftest::ok(prod->loan(std::chrono::seconds(20)));
      for (const auto& w : loan.gpu_waits()) waits_ahead += w.ahead > w.value;
      const auto* dst = lftest::ok(out.buffer(loan));
      lftest::ok(out.wait(ps, loan));
      CU_OK(lf_kernel_fill_frame(dst->data(), kBytes, i, ps));
      const bool end = i + 1 == b + kBatch;
      lftest::ok(out.signal(ps, loan, end ? Queue::Now : Queue::Deferred));
      CHECK(out.deferred() == (end ? 0u : 1u));
      lftest::ok(prod->publish(std::move(loan)));
    }
    for (std::uint64_t i = b; i < b + kBatch; ++i) {
      auto r = lftest::ok(con->receive(std::chrono::seconds(20)));
      REQUIRE(r.info().sequence == i);
      const auto* src = lftest::ok(in.buffer(r));
      lftest::ok(in.wait(cs, r));  // covered by the batch's wait
      CU_OK(lf_kernel_check_frame(src->data(), kBytes, i, 20'000, errors, nullptr, nullptr, cs));
      const bool end = i + 1 == b + kBatch;
      lftest::ok(in.release(cs, r, end ? Queue::Now : Queue::Deferred));
      CHECK(in.deferred() == (end ? 0u : 1u));
    }
  }
  CHECK(t.wrong() == 0);
  // Some slots were loaned while their reads were in flight, and a later promised release
  // covered the waits of the loans after them; the reader's stream queued one wait per batch.
  CHECK(waits_ahead > 0);
  CHECK(in.waits_skipped() >= kCount);
  // A deferred release is queued when its ChannelImports goes: nothing is left promised and never
  // signalled.
  {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(20)));
    const auto* dst = lftest::ok(out.buffer(loan));
    lftest::ok(out.wait(ps, loan));
    CU_OK(lf_kernel_fill_frame(dst->data(), kBytes, kCount, ps));
    lftest::ok(out.signal(ps, loan));
    lftest::ok(prod->publish(std::move(loan)));
    auto r = lftest::ok(con->receive(std::chrono::seconds(20)));
    const auto point = lftest::ok(r.gpu_release_point());
    lftest::ok(in.wait(cs, r));
    lftest::ok(in.release(cs, r, Queue::Deferred));
    CHECK(in.deferred() == 1);
    CU_OK(cudaStreamSynchronize(cs));
    CHECK(lftest::ok(gpu_sync_value(point)) < point.value);
    { auto gone = std::move(in); }
    CHECK(in.deferred() == 0);
    lftest::ok(wait_on_host(point, std::chrono::seconds(10)));
  }
}

TEST_CASE("unified buffer: CUDA works on the device side through the adapter, ordered by the buffer's timeline") {
  auto f = setup();
  constexpr std::uint64_t size = (4 << 20) + 12;
  auto u = lftest::ok(UnifiedBytes::create(f.vk, size));
  if (!u.shareable_timeline()) lftest::skip("the Vulkan driver cannot export a timeline semaphore for CUDA to wait on");
  auto mem = lftest::ok(f.cu.import_buffer(u.device_buffer()));
  auto timeline = lftest::ok(f.cu.import_semaphore(*u.shareable_timeline()));
  for (int round = 1; round <= 3; ++round) {
    INFO("round " << round);
    auto h = lftest::ok(u.host(Access::Write));
    std::memset(h.data(), round, size);
    // The upload (where the sides are apart) is queued on Vulkan; CUDA waits for it on its stream,
    // changes every byte in place and signals; the host's next read downloads after that signal.
    const auto a = lftest::ok(u.device(Access::ReadWrite));
    lftest::ok(timeline.wait(nullptr, a.wait.value));
    CU_OK(lf_kernel_xor(mem.data(), mem.data(), 0xa5, size, nullptr));
    lftest::ok(timeline.signal(nullptr, a.signal.value));
    const auto back = lftest::ok(u.host(Access::Read));
    const auto want = static_cast<std::byte>(round ^ 0xa5);
    CHECK(std::all_of(back.begin(), back.end(), [&](std::byte b) { return b == want; }));
  }
  if (!u.shared()) CHECK((u.uploads() == 3 && u.downloads() == 3));
  lftest::ok(u.synchronize());
}

// ----- peer links and peer-to-peer transfers (two GPUs; a visible skip with one)

namespace {

/// The two GPUs of the peer tests: ordinals 0 and 1, with peer access both ways.
void require_two_peers() {
  auto links = cuda::peer_links();
  if (!links) lftest::skip("no CUDA device: " + links.error().message());
  if (links->empty()) lftest::skip("one CUDA device: peer-to-peer needs two");
  for (const auto& l : *links)
    if ((l.from == 0 && l.to == 1) || (l.from == 1 && l.to == 0))
      if (!l.access) lftest::skip("CUDA devices 0 and 1 have no peer access");
}

}  // namespace

TEST_CASE("peer links describe every ordered pair of CUDA devices") {
  auto devs = cuda::devices();
  if (!devs) lftest::skip("no CUDA device: " + devs.error().message());
  const auto links = lftest::ok(cuda::peer_links());
  const std::size_t n = devs->size();
  REQUIRE(links.size() == n * (n - 1));
  for (const auto& l : links) {
    std::printf("peer link %d -> %d: %s, access %d, atomics %d, rank %d, PCIe: %s\n", l.from, l.to,
                std::string(cuda::to_string(l.path)).c_str(), l.access, l.native_atomics, l.performance_rank,
                l.pcie_meet.c_str());
    CHECK(l.from != l.to);
    CHECK((l.path == cuda::PeerPath::None) == !l.access);
  }
  if (n < 2) lftest::skip("one CUDA device: no pair to describe");
}

TEST_CASE("a consumer process on GPU 1 receives from a producer on GPU 0 and copies each message over the peer link") {
  require_two_peers();
  auto f = setup();  // GPU 0
  const auto dir = lftest::channel_dir();
  auto prod = lftest::ok(Producer::create(
      "cuda-p2p",
      {.slots = 4, .slot_size = 1 << 20, .transport = TransportKind::Vulkan, .vulkan = &f.vk, .directory = dir}));
  const std::uint64_t count = 100;
  const pid_t pid = lftest::run({LAVAFLOW_CUDA_PEER, "consume-peer", dir.string(), "cuda-p2p", std::to_string(count)});
  lftest::ok(prod->wait_for_consumers(1, std::chrono::seconds(30)));
  cuda::ChannelImports imports(f.cu);
  std::vector<std::byte> bytes(1 << 20);
  for (std::uint64_t i = 0; i < count; ++i) {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(20)));
    const std::uint64_t n = 1000 + (i * 7919) % 1000000;
    lftest::fill(std::span(bytes).first(n), i);
    const auto* dst = lftest::ok(imports.buffer(loan));
    CU_OK(cudaMemcpy(dst->data(), bytes.data(), n, cudaMemcpyHostToDevice));
    CU_OK(cudaDeviceSynchronize());
    lftest::ok(prod->publish(std::move(loan), {.size = n}));
  }
  CHECK(lftest::wait_exit(pid) == 0);
}

TEST_CASE("a consumer process on GPU 1 gets each message over the peer link ordered on the GPUs, no host waiting") {
  require_two_peers();
  auto f = setup();  // GPU 0
  const auto kind = GENERATE(GpuSyncKind::Semaphore, GpuSyncKind::Flag);
  const auto dir = lftest::channel_dir();
  constexpr std::uint64_t kBytes = 1 << 20;
  // Two slots: the producer's GPU rewrites a slot only after the consumer's copy out of it, which
  // it learns on the GPU (the release travels back through the channel's counters).
  auto prod = gpu_ordered_producer(f, "cuda-p2p-gpu", 2, kBytes, kind, dir);
  const std::uint64_t count = 300;
  const pid_t pid =
      lftest::run({LAVAFLOW_CUDA_PEER, "consume-peer-gpu", dir.string(), "cuda-p2p-gpu", std::to_string(count)});
  lftest::ok(prod->wait_for_consumers(1, std::chrono::seconds(30)));
  cuda::ChannelImports imports(f.cu);
  cudaStream_t s;
  CU_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::uint64_t loans_with_waits = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    auto loan = lftest::ok(prod->loan(std::chrono::seconds(20)));
    loans_with_waits += !loan.gpu_waits().empty();
    const std::uint64_t n = 1000 + (i * 7919) % (kBytes - 1000);
    const auto* dst = lftest::ok(imports.buffer(loan));
    lftest::ok(imports.wait(s, loan));
    CU_OK(lf_kernel_fill_frame(dst->data(), n, i, s));
    lftest::ok(imports.signal(s, loan));
    lftest::ok(prod->publish(std::move(loan), {.size = n}));
  }
  CHECK(lftest::wait_exit(pid) == 0);
  CU_OK(cudaStreamSynchronize(s));
  CU_OK(cudaStreamDestroy(s));
  CHECK(loans_with_waits > 0);
}

TEST_CASE("CUDA memory exported by one process is mapped by another, where kernels on a second GPU use it") {
  auto f = setup();
  int devices = 0;
  CU_OK(cudaGetDeviceCount(&devices));
  // With one GPU the other process still maps it (same device); the peer path needs two.
  const int peer_device = devices > 1 ? 1 : 0;
  if (peer_device == 1) require_two_peers();
  const std::uint64_t size = (3 << 20) + 24;
  auto alloc = f.cu.allocate_exportable(size);
  if (!alloc) lftest::skip("no POSIX-fd CUDA allocations: " + alloc.error().message());
  cudaStream_t s = nullptr;
  CU_OK(cudaStreamCreate(&s));
  CU_OK(lf_kernel_fill_frame(alloc->data(), size, 7, s));
  CU_OK(cudaStreamSynchronize(s));
  auto fd = lftest::ok(alloc->export_fd());
  auto [mine, theirs] = lftest::ok(socket_pair());
  const pid_t pid = lftest::spawn(LAVAFLOW_CUDA_PEER,
                                  {"import-allocation", std::to_string(alloc->allocation_size()), std::to_string(size),
                                   std::to_string(peer_device)},
                                  theirs.get());
  theirs.reset();
  const int fds[] = {fd.get()};
  lftest::ok(send_message(mine.get(), {}, fds));
  CHECK(lftest::wait_exit(pid) == 0);
  // The other process's kernel (on the second GPU when there is one) wrote message 8.
  unsigned long long* errors = nullptr;
  CU_OK(cudaMalloc(reinterpret_cast<void**>(&errors), sizeof *errors));
  CU_OK(cudaMemset(errors, 0, sizeof *errors));
  CU_OK(lf_kernel_check_frame(alloc->data(), size, 8, 0, errors, nullptr, nullptr, s));
  unsigned long long bad = 1;
  CU_OK(cudaMemcpy(&bad, errors, sizeof bad, cudaMemcpyDeviceToHost));
  CHECK(bad == 0);
  CU_OK(cudaFree(errors));
  CU_OK(cudaStreamDestroy(s));
}

TEST_CASE(
    "unified buffer: a side on the second GPU is pulled over the peer link when stale and pushed back after a write") {
  require_two_peers();
  auto f = setup();  // the buffer's GPU: CUDA device 0
  constexpr std::uint64_t size = (8 << 20) + 20;
  auto u = lftest::ok(UnifiedBytes::create(f.vk, size));
  if (!u.shareable_timeline()) lftest::skip("the Vulkan driver cannot export a timeline semaphore for CUDA");
  CHECK(lftest::err(cuda::PeerSide::create(f.cu, u, 0)).code() == Errc::InvalidArgument);  // its own GPU
  CHECK(lftest::err(cuda::PeerSide::create(f.cu, u, 1000)).code() == Errc::InvalidArgument);
  auto side = lftest::ok(cuda::PeerSide::create(f.cu, u, 1));
  CHECK(side.direct());
  CHECK(side.size() == size);
  CU_OK(cudaSetDevice(1));
  cudaStream_t s1 = nullptr;
  CU_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  // The kernel's module is loaded on GPU 1 before a stream there waits on anything.
  void* scratch = nullptr;
  CU_OK(cudaMalloc(&scratch, 64));
  CU_OK(lf_kernel_xor(scratch, scratch, 1, 64, s1));
  CU_OK(cudaStreamSynchronize(s1));
  CU_OK(cudaFree(scratch));
  CHECK(lftest::err(side.release(s1)).code() == Errc::InvalidArgument);  // nothing acquired
  cudaStream_t s0 = nullptr;
  CU_OK(cudaSetDevice(0));
  CU_OK(cudaStreamCreate(&s0));
  const auto wrong = lftest::err(side.acquire(s0, Access::Read));  // a stream of the buffer's own GPU
  CHECK(wrong.code() == Errc::InvalidArgument);
  CHECK_THAT(wrong.message(), Catch::Contains("belongs to CUDA device 0"));
  CU_OK(cudaStreamDestroy(s0));

  for (int round = 1; round <= 3; ++round) {
    INFO("round " << round);
    std::memset(lftest::ok(u.host(Access::Write)).data(), round, size);
    // Pulled (the host wrote), changed in place by a kernel on GPU 1, pushed back after it; the
    // host's read downloads after the push, with no host wait on either GPU in between.
    void* p = lftest::ok(side.acquire(s1, Access::ReadWrite));
    CHECK(lftest::err(side.acquire(s1, Access::Read)).code() == Errc::InvalidArgument);  // one at a time
    CU_OK(cudaSetDevice(1));
    CU_OK(lf_kernel_xor(p, p, 0xa5, size, s1));
    lftest::ok(side.release(s1));
    const auto back = lftest::ok(u.host(Access::Read));
    const auto want = static_cast<std::byte>(round ^ 0xa5);
    CHECK(std::all_of(back.begin(), back.end(), [&](std::byte b) { return b == want; }));
  }
  CHECK((side.pulls() == 3 && side.pushes() == 3));
  // Nothing changed since the last push: reading on GPU 1 moves nothing.
  void* p = lftest::ok(side.acquire(s1, Access::Read));
  std::vector<std::byte> seen(size);
  CU_OK(cudaMemcpyAsync(seen.data(), p, size, cudaMemcpyDeviceToHost, s1));
  CU_OK(cudaStreamSynchronize(s1));
  lftest::ok(side.release(s1));
  CHECK(seen[size - 1] == static_cast<std::byte>(3 ^ 0xa5));
  CHECK((side.pulls() == 3 && side.pushes() == 3));
  // A write on the buffer's own GPU (here a host write uploaded there) makes the copy stale.
  lftest::ok(u.host(Access::Write))[size - 1] = std::byte{0x42};
  p = lftest::ok(side.acquire(s1, Access::Read));
  CU_OK(cudaMemcpyAsync(seen.data(), p, size, cudaMemcpyDeviceToHost, s1));
  CU_OK(cudaStreamSynchronize(s1));
  lftest::ok(side.release(s1));
  CHECK(seen[size - 1] == std::byte{0x42});
  CHECK(seen[0] == static_cast<std::byte>(3 ^ 0xa5));
  CHECK((side.pulls() == 4 && side.pushes() == 3));
  // The null stream is the peer's default stream, whichever device is current.
  lftest::ok(u.host(Access::Write))[0] = std::byte{0x17};
  CU_OK(cudaSetDevice(0));
  p = lftest::ok(side.acquire(nullptr, Access::ReadWrite));
  CU_OK(cudaSetDevice(1));
  CU_OK(lf_kernel_xor(p, p, 0x01, size, nullptr));
  CU_OK(cudaSetDevice(0));
  lftest::ok(side.release(nullptr));
  CHECK(lftest::ok(u.host(Access::Read))[0] == std::byte{0x16});
  CHECK((side.pulls() == 5 && side.pushes() == 4));
  auto moved = std::move(side);
  CHECK(lftest::err(side.acquire(s1, Access::Read)).code() == Errc::InvalidArgument);  // NOLINT: moved from on purpose
  CHECK(moved.pulls() == 5);
  lftest::ok(u.synchronize());
  CU_OK(cudaSetDevice(1));
  CU_OK(cudaStreamDestroy(s1));
}

TEST_CASE(
    "a CUDA pool rents device memory from cuMemCreate segments, reuses it, and a pooled buffer crosses processes") {
  auto f = setup();
  auto pool = lftest::ok(cuda::make_pool(f.cu, {.vulkan = f.vk}));
  // A thousand small buffers: distinct, aligned device addresses in a few allocations.
  std::vector<PooledBuffer> small;
  std::vector<std::uintptr_t> addresses;
  for (int i = 0; i < 1000; ++i) {
    auto b = pool.rent(4096, BufferKind::GpuDeviceLocal);
    if (!b && i == 0) lftest::skip("no POSIX-fd CUDA allocations: " + b.error().message());
    REQUIRE(b);
    REQUIRE(cuda::device_pointer(*b) != nullptr);
    CHECK(b->host_ptr() == nullptr);
    addresses.push_back(reinterpret_cast<std::uintptr_t>(cuda::device_pointer(*b)));
    small.push_back(std::move(*b));
  }
  std::sort(addresses.begin(), addresses.end());
  for (std::size_t i = 1; i < addresses.size(); ++i) CHECK(addresses[i] - addresses[i - 1] >= 4096);
  for (auto a : addresses) CHECK(a % MemoryPool::kAlignment == 0);
  auto s = pool.stats();
  // The segments are carved to the end of their granules (a 2 MiB small segment's allocation,
  // padded past 2 MiB, holds two): 1000 buffers fit one or two.
  CHECK(s.num_device_alloc <= 2);
  CHECK((s.all.reserved_bytes.current + static_cast<std::int64_t>(kGpuTailPadding) * s.all.segment.current) %
            (1 << 20) ==
        0);
  CHECK(s.open_fds == 0);  // CUDA segments hold no fd until exported
  // Every buffer holds its own bytes: message i in buffer i, checked after all were written.
  cudaStream_t st = nullptr;
  CU_OK(cudaStreamCreate(&st));
  for (std::size_t i = 0; i < small.size(); i += 97)
    CU_OK(lf_kernel_fill_frame(cuda::device_pointer(small[i]), 4096, i, st));
  unsigned long long* errors = nullptr;
  CU_OK(cudaMalloc(reinterpret_cast<void**>(&errors), sizeof *errors));
  CU_OK(cudaMemset(errors, 0, sizeof *errors));
  for (std::size_t i = 0; i < small.size(); i += 97)
    CU_OK(lf_kernel_check_frame(cuda::device_pointer(small[i]), 4096, i, 0, errors, nullptr, nullptr, st));
  unsigned long long bad = 1;
  CU_OK(cudaMemcpy(&bad, errors, sizeof bad, cudaMemcpyDeviceToHost));
  CHECK(bad == 0);
  // Returned and rented again: the same memory, no new allocation.
  void* first = cuda::device_pointer(small.back());
  small.pop_back();
  const auto before = pool.stats();
  auto again = lftest::ok(pool.rent(4096, BufferKind::GpuDeviceLocal));
  CHECK(cuda::device_pointer(again) == first);
  CHECK(pool.stats().num_device_alloc == before.num_device_alloc);
  CHECK(pool.stats().num_hits == before.num_hits + 1);
  small.clear();

  // A buffer inside a shared segment goes to another process (on the second GPU where there is
  // one), which reads its bytes and writes new ones there, and nothing around them.
  int devices = 0;
  CU_OK(cudaGetDeviceCount(&devices));
  const int peer_device = devices > 1 ? 1 : 0;
  if (peer_device == 1) require_two_peers();
  auto before_it = lftest::ok(pool.rent(3 << 20, BufferKind::GpuDeviceLocal));
  auto mine = lftest::ok(pool.rent((3 << 20) + 24, BufferKind::GpuDeviceLocal));
  auto after_it = lftest::ok(pool.rent(3 << 20, BufferKind::GpuDeviceLocal));
  CU_OK(lf_kernel_fill_frame(cuda::device_pointer(before_it), before_it.size(), 5, st));
  CU_OK(lf_kernel_fill_frame(cuda::device_pointer(mine), mine.size(), 7, st));
  CU_OK(lf_kernel_fill_frame(cuda::device_pointer(after_it), after_it.size(), 9, st));
  CU_OK(cudaStreamSynchronize(st));
  auto ex = lftest::ok(cuda::export_pooled(mine));
  CHECK(ex.size == mine.size());
  CHECK(ex.offset == mine.offset());
  CHECK(ex.offset + ex.size <= ex.segment_size);
  auto [here, there] = lftest::ok(socket_pair());
  const pid_t pid =
      lftest::spawn(LAVAFLOW_CUDA_PEER,
                    {"import-allocation", std::to_string(ex.allocation_size), std::to_string(ex.segment_size),
                     std::to_string(peer_device), std::to_string(ex.offset), std::to_string(ex.size)},
                    there.get());
  there.reset();
  const int fds[] = {ex.fd.get()};
  lftest::ok(send_message(here.get(), {}, fds));
  CHECK(lftest::wait_exit(pid) == 0);
  CU_OK(cudaMemset(errors, 0, sizeof *errors));
  CU_OK(lf_kernel_check_frame(cuda::device_pointer(mine), mine.size(), 8, 0, errors, nullptr, nullptr, st));
  CU_OK(lf_kernel_check_frame(cuda::device_pointer(before_it), before_it.size(), 5, 0, errors, nullptr, nullptr, st));
  CU_OK(lf_kernel_check_frame(cuda::device_pointer(after_it), after_it.size(), 9, 0, errors, nullptr, nullptr, st));
  CU_OK(cudaMemcpy(&bad, errors, sizeof bad, cudaMemcpyDeviceToHost));
  CHECK(bad == 0);

  // Vulkan on the same GPU imports a pooled CUDA buffer's bytes through its export.
  auto vex = lftest::ok(mine.export_handle());
  CHECK(vex.descriptor.size == mine.size());
  auto imported = lftest::ok(GpuBuffer::import(f.vk, vex.descriptor, std::move(vex.fd)));
  std::vector<std::byte> seen(mine.size()), want(mine.size());
  lftest::ok(download(f.vk, imported, seen));
  CU_OK(cudaMemcpy(want.data(), cuda::device_pointer(mine), want.size(), cudaMemcpyDeviceToHost));
  CHECK(seen == want);

  // Not a CUDA buffer, or one already returned: refused with the cause.
  auto host = lftest::ok(pool.rent(4096));
  CHECK(cuda::device_pointer(host) == nullptr);
  CHECK(cuda::export_pooled(host).error().code() == Errc::InvalidArgument);
  mine.reset();
  CHECK(cuda::export_pooled(mine).error().code() == Errc::InvalidArgument);
  CU_OK(cudaFree(errors));
  CU_OK(cudaStreamDestroy(st));
}
