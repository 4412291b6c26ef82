// SPDX-License-Identifier: MIT
// lavaflow-demo's GPU path through Vulkan compute shaders (frame.comp): on any GPU whose driver
// shares timeline semaphores between processes, with or without CUDA.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "gpu.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/vulkan_context.hpp"

namespace lfdemo {

using namespace lavaflow;

namespace {

// frame.comp, compiled by glslc at build time: CHECK=0 writes a frame, CHECK=1 verifies it.
constexpr std::uint32_t kFillSpirv[] =
#include "frame_fill.comp.inc"
    ;
constexpr std::uint32_t kCheckSpirv[] =
#include "frame_check.comp.inc"
    ;

struct Push {
  std::uint32_t seq_lo, seq_hi, bytes, corrupt;
};
constexpr std::uint32_t kNoCorruption = 0xFFFFFFFFu;
constexpr std::uint64_t kLocalSize = 256;
constexpr std::uint64_t kMaxGroups = 65535;  // the shader strides over larger frames
/// Latency samples kept (the first ones when a run has more frames).
constexpr std::size_t kSamples = 1 << 20;

/// The frame shader over a channel's ring: one pipeline, and per ring buffer its descriptor set,
/// command buffer and fence. A ring buffer's command buffer is rerecorded when the ring comes
/// round to it; the fence of its previous dispatch is long signalled by then (the channel did not
/// hand the slot back before that dispatch's GPU work ended), so waiting on it costs nothing.
class FrameProgram {
 public:
  struct Slot {
    vk::raii::DescriptorSet set{nullptr};
    vk::raii::CommandBuffer commands{nullptr};
    vk::raii::Fence fence{nullptr};
  };

  FrameProgram(const VulkanContext& vk, std::span<const std::uint32_t> spirv, std::uint32_t slots,
               const GpuBuffer* counters)
      : vk_(vk), counters_(counters) {
    const auto& dev = vk.device();
    module_ = vk::raii::ShaderModule(dev, vk::ShaderModuleCreateInfo({}, spirv.size_bytes(), spirv.data()));
    const std::uint32_t bindings = counters ? 2 : 1;
    std::vector<vk::DescriptorSetLayoutBinding> b;
    for (std::uint32_t i = 0; i < bindings; ++i)
      b.emplace_back(i, vk::DescriptorType::eStorageBuffer, 1, vk::ShaderStageFlagBits::eCompute);
    set_layout_ = vk::raii::DescriptorSetLayout(dev, vk::DescriptorSetLayoutCreateInfo({}, b));
    vk::PushConstantRange push(vk::ShaderStageFlagBits::eCompute, 0, sizeof(Push));
    vk::DescriptorSetLayout layouts[] = {*set_layout_};
    layout_ = vk::raii::PipelineLayout(dev, vk::PipelineLayoutCreateInfo({}, layouts, push));
    vk::PipelineShaderStageCreateInfo stage({}, vk::ShaderStageFlagBits::eCompute, *module_, "main");
    pipeline_ = vk::raii::Pipeline(dev, nullptr, vk::ComputePipelineCreateInfo({}, stage, *layout_));
    vk::DescriptorPoolSize size(vk::DescriptorType::eStorageBuffer, slots * bindings);
    pool_ = vk::raii::DescriptorPool(dev, vk::DescriptorPoolCreateInfo({}, slots, size));
    commands_ = vk::raii::CommandPool(dev, {vk::CommandPoolCreateFlagBits::eResetCommandBuffer, vk.queue_family()});
  }

  /// Records the shader over `buffer` into the buffer's command buffer, once its previous dispatch
  /// is done; returns the slot to submit.
  Result<Slot*> record(const GpuBuffer& buffer, const Push& push) {
    return detail::vk_call("vkCmdDispatch(frame)", [&]() -> Result<Slot*> {
      Slot& slot = slot_for(buffer);
      if (vk_.device().waitForFences(*slot.fence, VK_TRUE, 10'000'000'000ull) == vk::Result::eTimeout)
        return fail(Errc::Timeout, "vkWaitForFences",
                    "the previous frame in this ring buffer did not finish within 10 s");
      vk_.device().resetFences(*slot.fence);
      const auto& cb = slot.commands;
      cb.reset();
      cb.begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
      cb.bindPipeline(vk::PipelineBindPoint::eCompute, *pipeline_);
      cb.bindDescriptorSets(vk::PipelineBindPoint::eCompute, *layout_, 0, {*slot.set}, {});
      cb.pushConstants<Push>(*layout_, vk::ShaderStageFlagBits::eCompute, 0, push);
      const std::uint64_t groups = std::clamp<std::uint64_t>((push.bytes / 8 + kLocalSize) / kLocalSize, 1, kMaxGroups);
      cb.dispatch(static_cast<std::uint32_t>(groups), 1, 1);
      // The writes reach whoever reads next: another process's GPU, or this host (the counters).
      vk::MemoryBarrier done(vk::AccessFlagBits::eShaderWrite,
                             vk::AccessFlagBits::eMemoryRead | vk::AccessFlagBits::eHostRead);
      cb.pipelineBarrier(vk::PipelineStageFlagBits::eComputeShader,
                         vk::PipelineStageFlagBits::eAllCommands | vk::PipelineStageFlagBits::eHost, {}, done, {}, {});
      cb.end();
      return &slot;
    });
  }

  /// Submits a recorded slot: after `waits`, signalling `signal`.
  Status submit(Slot& slot, std::span<const GpuSync> waits, const GpuSync& signal) {
    return detail::vk_call("vkQueueSubmit(frame)", [&] {
      std::vector<vk::Semaphore> sems;
      std::vector<std::uint64_t> values;
      for (const auto& w : waits) {
        sems.push_back(w.semaphore);
        values.push_back(w.value);
      }
      const std::vector<vk::PipelineStageFlags> stages(sems.size(), vk::PipelineStageFlagBits::eComputeShader);
      vk::TimelineSemaphoreSubmitInfo timeline(values, signal.value);
      vk::CommandBuffer raw = *slot.commands;
      vk::SubmitInfo info(sems, stages, raw, signal.semaphore);
      info.pNext = &timeline;
      vk_.queue().submit(info, *slot.fence);
    });
  }

  /// Waits for every dispatch submitted so far.
  Status finish(Duration timeout) {
    return detail::vk_call("vkWaitForFences(frame)", [&]() -> Status {
      std::vector<vk::Fence> fences;
      for (const auto& [buffer, slot] : slots_) fences.push_back(*slot.fence);
      if (fences.empty()) return {};
      const auto ns = static_cast<std::uint64_t>(std::min<Duration::rep>(timeout.count(), INT64_MAX));
      if (vk_.device().waitForFences(fences, VK_TRUE, ns) == vk::Result::eTimeout)
        return fail(Errc::Timeout, "vkWaitForFences", "the queued GPU work did not finish (is the peer alive?)");
      return {};
    });
  }

 private:
  Slot& slot_for(const GpuBuffer& buffer) {
    auto it = slots_.find(&buffer);
    if (it != slots_.end()) return it->second;
    const auto& dev = vk_.device();
    Slot s;
    vk::DescriptorSetLayout layouts[] = {*set_layout_};
    s.set = std::move(vk::raii::DescriptorSets(dev, vk::DescriptorSetAllocateInfo(*pool_, layouts))[0]);
    vk::DescriptorBufferInfo frame(buffer.buffer(), 0, VK_WHOLE_SIZE);
    std::vector<vk::WriteDescriptorSet> writes{
        vk::WriteDescriptorSet(*s.set, 0, 0, vk::DescriptorType::eStorageBuffer, {}, frame)};
    vk::DescriptorBufferInfo counters(counters_ ? counters_->buffer() : vk::Buffer{}, 0, VK_WHOLE_SIZE);
    if (counters_) writes.emplace_back(*s.set, 1, 0, vk::DescriptorType::eStorageBuffer, nullptr, counters);
    dev.updateDescriptorSets(writes, {});
    s.commands = std::move(vk::raii::CommandBuffers(dev, {*commands_, vk::CommandBufferLevel::ePrimary, 1})[0]);
    s.fence = vk::raii::Fence(dev, vk::FenceCreateInfo(vk::FenceCreateFlagBits::eSignaled));
    return slots_.emplace(&buffer, std::move(s)).first->second;
  }

  const VulkanContext& vk_;
  const GpuBuffer* counters_;
  vk::raii::ShaderModule module_{nullptr};
  vk::raii::DescriptorSetLayout set_layout_{nullptr};
  vk::raii::PipelineLayout layout_{nullptr};
  vk::raii::Pipeline pipeline_{nullptr};
  vk::raii::DescriptorPool pool_{nullptr};
  vk::raii::CommandPool commands_{nullptr};
  std::unordered_map<const GpuBuffer*, Slot> slots_;  // declared last: destroyed before the pools
};

/// The Vulkan device of a channel whose GPU work can be ordered across processes.
Result<const VulkanContext*> device_for(const VulkanContext* vk, std::optional<GpuSyncKind> sync, const char* call) {
  if (!vk) return fail(Errc::Unsupported, call, "the ring is not in Vulkan memory");
  if (sync == GpuSyncKind::Flag)
    return fail(Errc::Unsupported, call, "the channel orders GPU work with flags, which Vulkan queues cannot wait on");
  if (!sync)
    return fail(Errc::Unsupported, call,
                str_format("device {} cannot share a timeline semaphore", vk->capabilities().identity.name));
  return vk;
}

Result<const GpuBuffer*> frame_buffer(const Buffer& buffer, std::uint64_t size, const char* call) {
  const auto* b = dynamic_cast<const GpuBuffer*>(&buffer);
  if (!b) return fail(Errc::InvalidArgument, call, "the ring buffer is not Vulkan memory");
  // The shader touches whole 64-bit words, the tail's included; sizes are 32-bit there.
  if (size > 0xFFFFFFF0u || stamp_offset(size) > b->size())
    return fail(Errc::Malformed, call,
                str_format("a {}-byte frame does not fit its {}-byte ring buffer", size, b->size()));
  return b;
}

class VulkanWriter final : public GpuWriter {
 public:
  VulkanWriter(const VulkanContext& vk, std::uint32_t slots) : vk_(vk), program_(vk, kFillSpirv, slots, nullptr) {}

  Status write(Loan& loan, std::uint64_t seq, std::uint64_t size, std::optional<std::uint64_t> corrupt) override {
    constexpr const char* call = "Vulkan writer";
    LF_TRY(const GpuBuffer* buffer, frame_buffer(loan.buffer(), size, call));
    const auto signal = loan.gpu_signal_point();
    if (!signal) return fail(Errc::Unsupported, call, "the channel has no shared timeline semaphore");
    const Push push{static_cast<std::uint32_t>(seq), static_cast<std::uint32_t>(seq >> 32),
                    static_cast<std::uint32_t>(size),
                    corrupt && *corrupt < size ? static_cast<std::uint32_t>(*corrupt) : kNoCorruption};
    LF_TRY(auto* slot, program_.record(*buffer, push));
    LF_TRY_STATUS(program_.submit(*slot, loan.gpu_waits(), *signal));
    (void)loan.gpu_signal();
    return {};
  }

  Status finish(Duration timeout) override { return program_.finish(timeout); }

  std::string description() const override {
    return str_format("{} (Vulkan compute shader, GPU-ordered hand-off)", vk_.capabilities().identity.name);
  }

 private:
  const VulkanContext& vk_;
  FrameProgram program_;
};

class VulkanVerifier final : public GpuVerifier {
 public:
  VulkanVerifier(const VulkanContext& vk, const GpuSemaphore& released, GpuBuffer counters, std::uint32_t slots)
      : vk_(vk), released_(released), counters_(std::move(counters)), program_(vk, kCheckSpirv, slots, &counters_) {
    const std::uint32_t init[2] = {0, 0xFFFFFFFFu};
    std::memcpy(counters_.bytes().data(), init, sizeof init);
    latency_ns_.reserve(kSamples);
  }

  Status verify(Received& message) override {
    constexpr const char* call = "Vulkan verifier";
    const std::uint64_t seq = message.info().sequence;
    LF_TRY(const GpuBuffer* buffer, frame_buffer(message.buffer(), message.info().size, call));
    LF_TRY(const GpuSync release, message.gpu_release_point());
    const Push push{static_cast<std::uint32_t>(seq), static_cast<std::uint32_t>(seq >> 32),
                    static_cast<std::uint32_t>(message.info().size), kNoCorruption};
    LF_TRY(auto* slot, program_.record(*buffer, push));
    std::vector<GpuSync> waits;
    if (auto w = message.gpu_wait()) waits.push_back(*w);
    LF_TRY_STATUS(program_.submit(*slot, waits, release));
    (void)message.gpu_release();
    ++frames_;
    pending_.push_back({release.value, message.info().timestamp_ns});
    retire();
    return {};
  }

  Result<Report> finish(Duration timeout) override {
    LF_TRY_STATUS(program_.finish(timeout));
    retire();
    std::uint32_t counters[2] = {};
    std::memcpy(counters, counters_.bytes().data(), sizeof counters);
    std::vector<std::uint64_t> lat = latency_ns_;
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double q) {
      return lat.empty() ? 0.0 : double(lat[static_cast<std::size_t>(q * double(lat.size() - 1))]) / 1000;
    };
    return Report{frames_,  counters[0], counters[1] == 0xFFFFFFFFu ? ~0ull : counters[1],
                  pct(0.5), pct(0.99),   "publish -> GPU verified (seen by this CPU)"};
  }

  std::string description() const override {
    return str_format("{} (Vulkan compute shader, every word)", vk_.capabilities().identity.name);
  }

 private:
  /// Latency samples for the checks that have ended: the release timeline says how far the GPU is.
  void retire() {
    if (pending_.empty()) return;
    auto done = released_.value();
    if (!done) return;
    const std::uint64_t now = now_ns();
    while (!pending_.empty() && pending_.front().release <= *done) {
      if (latency_ns_.size() < kSamples && pending_.front().published_ns != 0)
        latency_ns_.push_back(now - pending_.front().published_ns);
      pending_.pop_front();
    }
  }

  struct Pending {
    std::uint64_t release, published_ns;
  };
  const VulkanContext& vk_;
  const GpuSemaphore& released_;
  GpuBuffer counters_;  // [0] wrong words, [1] first bad frame (32-bit)
  FrameProgram program_;
  std::uint64_t frames_ = 0;
  std::deque<Pending> pending_;
  std::vector<std::uint64_t> latency_ns_;
};

}  // namespace

Result<std::unique_ptr<GpuWriter>> make_vulkan_writer(const Producer& producer) {
  constexpr const char* call = "Vulkan writer";
  LF_TRY(const VulkanContext* vk, device_for(producer.vulkan(), producer.gpu_sync(), call));
  return detail::vk_call(call, [&]() -> Result<std::unique_ptr<GpuWriter>> {
    return std::make_unique<VulkanWriter>(*vk, producer.slots());
  });
}

Result<std::unique_ptr<GpuVerifier>> make_vulkan_verifier(const Consumer& consumer) {
  constexpr const char* call = "Vulkan verifier";
  LF_TRY(const VulkanContext* vk, device_for(consumer.vulkan(), consumer.gpu_sync(), call));
  const GpuSemaphore* released = consumer.gpu_release_timeline();
  if (!released) return fail(Errc::Unsupported, call, "the channel gives this consumer no release timeline");
  LF_TRY(auto counters, GpuBuffer::allocate(*vk, {.size = 64, .memory = GpuMemory::HostVisible}));
  return detail::vk_call(call, [&]() -> Result<std::unique_ptr<GpuVerifier>> {
    return std::make_unique<VulkanVerifier>(*vk, *released, std::move(counters), consumer.slots());
  });
}

}  // namespace lfdemo
