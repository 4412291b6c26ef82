// SPDX-License-Identifier: MIT
#include "frame_writer.hpp"

#include <unordered_map>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "pattern.h"

namespace lfviewer {

using namespace lavaflow;

namespace {

// pattern.comp, compiled by glslc at build time.
constexpr std::uint32_t kPatternSpirv[] =
#include "pattern.comp.inc"
    ;

struct PushConstants {
  std::uint32_t width, height, frame;
};

template <class F>
auto vk_guard(const char* call, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const vk::SystemError& e) {
    return fail(Errc::Driver, call, e.what());
  }
}

class VulkanWriter final : public FrameWriter {
 public:
  explicit VulkanWriter(const VulkanContext& vk) : vk_(vk) {
    const auto& dev = vk.device();
    module_ = vk::raii::ShaderModule(dev, vk::ShaderModuleCreateInfo({}, sizeof kPatternSpirv, kPatternSpirv));
    vk::DescriptorSetLayoutBinding binding(0, vk::DescriptorType::eStorageBuffer, 1, vk::ShaderStageFlagBits::eCompute);
    set_layout_ = vk::raii::DescriptorSetLayout(dev, vk::DescriptorSetLayoutCreateInfo({}, binding));
    vk::PushConstantRange push(vk::ShaderStageFlagBits::eCompute, 0, sizeof(PushConstants));
    vk::DescriptorSetLayout layouts[] = {*set_layout_};
    layout_ = vk::raii::PipelineLayout(dev, vk::PipelineLayoutCreateInfo({}, layouts, push));
    vk::PipelineShaderStageCreateInfo stage({}, vk::ShaderStageFlagBits::eCompute, *module_, "main");
    pipeline_ = vk::raii::Pipeline(dev, nullptr, vk::ComputePipelineCreateInfo({}, stage, *layout_));
    vk::DescriptorPoolSize size(vk::DescriptorType::eStorageBuffer, 64);
    pool_ = vk::raii::DescriptorPool(
        dev, vk::DescriptorPoolCreateInfo(vk::DescriptorPoolCreateFlagBits::eFreeDescriptorSet, 64, size));
    commands_ = vk::raii::CommandPool(dev, {vk::CommandPoolCreateFlagBits::eResetCommandBuffer, vk.queue_family()});
  }

  std::string description() const override {
    return str_format("Vulkan compute shader on {}", vk_.capabilities().identity.name);
  }

  Status write_and_publish(Producer& p, Loan&& loan, const FrameShape& f, MessageInfo info) override {
    auto* buffer = dynamic_cast<GpuBuffer*>(&loan.buffer());
    if (!buffer) return fail(Errc::InvalidArgument, "VulkanWriter", "the ring buffer is not Vulkan memory");
    const std::uint64_t need = std::uint64_t{f.width} * f.height * 4;
    if (need > buffer->size())
      return fail(
          Errc::InvalidArgument, "VulkanWriter",
          str_format("a {}x{} frame needs {} bytes; ring buffers hold {}", f.width, f.height, need, buffer->size()));
    return vk_guard("VulkanWriter", [&]() -> Status {
      auto& slot = slot_for(*buffer);
      const auto& dev = vk_.device();
      if (dev.waitForFences(*slot.fence, VK_TRUE, 10'000'000'000ull) == vk::Result::eTimeout)
        return fail(Errc::Timeout, "vkWaitForFences",
                    "the previous frame in this ring buffer did not finish within 10 s");
      dev.resetFences(*slot.fence);
      const auto& cb = slot.commands;
      cb.reset();
      cb.begin({vk::CommandBufferUsageFlagBits::eOneTimeSubmit});
      cb.bindPipeline(vk::PipelineBindPoint::eCompute, *pipeline_);
      cb.bindDescriptorSets(vk::PipelineBindPoint::eCompute, *layout_, 0, {*slot.set}, {});
      const PushConstants pc{f.width, f.height, f.frame};
      cb.pushConstants<PushConstants>(*layout_, vk::ShaderStageFlagBits::eCompute, 0, pc);
      cb.dispatch((f.width + 15) / 16, (f.height + 15) / 16, 1);
      // Make the writes available to whoever reads next: another API, another process, the host.
      vk::MemoryBarrier done(vk::AccessFlagBits::eShaderWrite,
                             vk::AccessFlagBits::eMemoryRead | vk::AccessFlagBits::eHostRead);
      cb.pipelineBarrier(vk::PipelineStageFlagBits::eComputeShader,
                         vk::PipelineStageFlagBits::eAllCommands | vk::PipelineStageFlagBits::eHost, {}, done, {}, {});
      cb.end();
      vk::CommandBuffer raw = *cb;
      if (auto sync = loan.gpu_signal()) {
        // The channel's shared timeline: consumers wait on the GPU (or the host) for this value;
        // the write itself waits on the GPU for the consumers' releases of the slot.
        std::vector<vk::Semaphore> waits;
        std::vector<std::uint64_t> wait_values;
        for (const auto& w : loan.gpu_waits()) {
          waits.push_back(w.semaphore);
          wait_values.push_back(w.value);
        }
        const std::vector<vk::PipelineStageFlags> stages(waits.size(), vk::PipelineStageFlagBits::eComputeShader);
        vk::TimelineSemaphoreSubmitInfo timeline(wait_values, sync->value);
        vk::SubmitInfo submit(waits, stages, raw, sync->semaphore);
        submit.pNext = &timeline;
        vk_.queue().submit(submit, *slot.fence);
        LF_TRY_STATUS(p.publish(std::move(loan), info));
      } else {
        vk_.queue().submit(vk::SubmitInfo({}, {}, raw), *slot.fence);
        LF_TRY_STATUS(p.publish(std::move(loan), *slot.fence, info));  // CPU-waits the fence (lavapipe)
      }
      return {};
    });
  }

 private:
  struct Slot {
    vk::raii::DescriptorSet set{nullptr};
    vk::raii::CommandBuffer commands{nullptr};
    vk::raii::Fence fence{nullptr};
  };

  Slot& slot_for(const GpuBuffer& buffer) {
    auto it = slots_.find(&buffer);
    if (it != slots_.end()) return it->second;
    const auto& dev = vk_.device();
    Slot s;
    vk::DescriptorSetLayout layouts[] = {*set_layout_};
    s.set = std::move(vk::raii::DescriptorSets(dev, vk::DescriptorSetAllocateInfo(*pool_, layouts))[0]);
    vk::DescriptorBufferInfo info(buffer.buffer(), 0, VK_WHOLE_SIZE);
    dev.updateDescriptorSets(vk::WriteDescriptorSet(*s.set, 0, 0, vk::DescriptorType::eStorageBuffer, {}, info), {});
    s.commands = std::move(vk::raii::CommandBuffers(dev, {*commands_, vk::CommandBufferLevel::ePrimary, 1})[0]);
    s.fence = vk::raii::Fence(dev, vk::FenceCreateInfo(vk::FenceCreateFlagBits::eSignaled));
    return slots_.emplace(&buffer, std::move(s)).first->second;
  }

  const VulkanContext& vk_;
  vk::raii::ShaderModule module_{nullptr};
  vk::raii::DescriptorSetLayout set_layout_{nullptr};
  vk::raii::PipelineLayout layout_{nullptr};
  vk::raii::Pipeline pipeline_{nullptr};
  vk::raii::DescriptorPool pool_{nullptr};
  vk::raii::CommandPool commands_{nullptr};
  std::unordered_map<const GpuBuffer*, Slot> slots_;  // declared last: destroyed before the pools
};

class CpuWriter final : public FrameWriter {
 public:
  std::string description() const override { return "CPU (the ring is host memory)"; }
  Status write_and_publish(Producer& p, Loan&& loan, const FrameShape& f, MessageInfo info) override {
    auto bytes = loan.bytes();
    if (bytes.size() < std::uint64_t{f.width} * f.height * 4)
      return fail(Errc::InvalidArgument, "CpuWriter",
                  str_format("the ring buffer is not host-visible or smaller than a {}x{} frame", f.width, f.height));
    auto* px = reinterpret_cast<std::uint32_t*>(bytes.data());
    for (std::uint32_t y = 0; y < f.height; ++y)
      for (std::uint32_t x = 0; x < f.width; ++x)
        px[std::size_t{y} * f.width + x] = lf_pattern(x, y, f.width, f.height, f.frame);
    LF_TRY_STATUS(p.publish(std::move(loan), info));
    return {};
  }
};

}  // namespace

Result<std::unique_ptr<FrameWriter>> make_vulkan_writer(const VulkanContext& vk) {
  return vk_guard("make_vulkan_writer",
                  [&]() -> Result<std::unique_ptr<FrameWriter>> { return std::make_unique<VulkanWriter>(vk); });
}

Result<std::unique_ptr<FrameWriter>> make_cpu_writer() { return std::make_unique<CpuWriter>(); }

#if !LAVAFLOW_VIEWER_CUDA
Result<std::unique_ptr<FrameWriter>> make_cuda_writer(const Producer&) {
  return fail(Errc::Unsupported, "lavaflow-viewer --cuda", "this build has no CUDA (LAVAFLOW_WITH_CUDA)");
}
#endif

}  // namespace lfviewer
