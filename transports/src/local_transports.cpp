// SPDX-License-Identifier: MIT
#include <cstdlib>
#include <filesystem>

#include "lavaflow/core/cpu_buffer.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/transports/local.hpp"

namespace lavaflow {
namespace {

Probe local_only(const ProcessLocation& me, const std::optional<ProcessLocation>& peer) {
  if (!peer) return {true, "any consumer on this host"};
  auto scope = detect_scope(me, *peer);
  return {scope.scope == Scope::Local, scope.reason};
}

class ShmTransport final : public Transport {
 public:
  TransportKind kind() const override { return TransportKind::Shm; }
  Probe can_connect(const ProcessLocation& me, const std::optional<ProcessLocation>& peer,
                    const TransportEnv&) const override {
    auto p = local_only(me, peer);
    if (p.ok) p.reason = "CPU shared memory: " + p.reason;
    return p;
  }
  Result<std::unique_ptr<Buffer>> allocate(const TransportEnv&, std::uint64_t size) const override {
    LF_TRY(auto b, CpuBuffer::allocate({.size = size, .strategy = CpuStrategy::SharedMemory}));
    return std::unique_ptr<Buffer>(std::make_unique<CpuBuffer>(std::move(b)));
  }
  Result<std::unique_ptr<Buffer>> import(const TransportEnv&, const ExportDescriptor& d, UniqueFd&& fd) const override {
    LF_TRY(auto b, CpuBuffer::import(d, std::move(fd)));
    return std::unique_ptr<Buffer>(std::make_unique<CpuBuffer>(std::move(b)));
  }
};

class VulkanTransport final : public Transport {
 public:
  TransportKind kind() const override { return TransportKind::Vulkan; }
  Probe can_connect(const ProcessLocation& me, const std::optional<ProcessLocation>& peer,
                    const TransportEnv& env) const override {
    auto local = local_only(me, peer);
    if (!local.ok) return local;
    if (!env.vulkan) {
      // Deciding from the two locations alone (e.g. an MPI communicator's routes): the producer
      // makes its context on the device they share.
      if (!peer) return {false, "no Vulkan context on the producer side"};
      if (auto d = common_device(me, *peer))
        return {true, str_format("Vulkan IPC: {}; both have device {}", local.reason, d->name)};
      return {false, str_format("{}, but no Vulkan device in common", local.reason)};
    }
    const auto& caps = env.vulkan->capabilities();
    if (!caps.memory_fd_export)
      return {false, str_format("device {} cannot export opaque-fd memory", caps.identity.name)};
    if (!peer) return {true, str_format("Vulkan IPC on {}: {}", caps.identity.name, local.reason)};
    for (const auto& d : peer->devices)
      if (d == caps.identity)
        return {true, str_format("Vulkan IPC: {} and the peer share device {}", local.reason, caps.identity.name)};
    return {false, str_format("{}, but the peer has no Vulkan device matching {} (device and driver UUID)",
                              local.reason, caps.identity.name)};
  }
  Result<std::unique_ptr<Buffer>> allocate(const TransportEnv& env, std::uint64_t size) const override {
    if (!env.vulkan) return fail(Errc::Unsupported, "vulkan transport", "no Vulkan context");
    LF_TRY(auto b, GpuBuffer::allocate(*env.vulkan, {.size = size, .memory = GpuMemory::DeviceLocal}));
    return std::unique_ptr<Buffer>(std::make_unique<GpuBuffer>(std::move(b)));
  }
  Result<std::unique_ptr<Buffer>> import(const TransportEnv& env, const ExportDescriptor& d,
                                         UniqueFd&& fd) const override {
    if (!env.vulkan) return fail(Errc::Unsupported, "vulkan transport", "no Vulkan context to import into");
    LF_TRY(auto b, GpuBuffer::import(*env.vulkan, d, std::move(fd)));
    return std::unique_ptr<Buffer>(std::make_unique<GpuBuffer>(std::move(b)));
  }
};

}  // namespace

std::shared_ptr<const Transport> vulkan_transport() { return std::make_shared<VulkanTransport>(); }
std::shared_ptr<const Transport> shm_transport() { return std::make_shared<ShmTransport>(); }
TransportSet local_transports() { return {vulkan_transport(), shm_transport()}; }

// Nobody should have to find the context switch per hand-off by measuring.
std::string gpu_sharing_note(const DeviceCapabilities& caps) {
  if (caps.type == vk::PhysicalDeviceType::eCpu) return {};
  std::string note = str_format(
      "{} time-slices between processes, so a hand-off between two processes' GPU work waits for a context "
      "switch",
      caps.identity.name);
  if (caps.driver_name.find("NVIDIA") == std::string::npos) return note;
  // CUDA clients find the MPS server through this pipe directory.
  const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::filesystem::path control = std::filesystem::path(dir && *dir ? dir : "/tmp/nvidia-mps") / "control";
  std::error_code ec;
  return note + (std::filesystem::exists(control, ec)
                     ? "; CUDA work of processes under the MPS server found at " + control.parent_path().string() +
                           " runs side by side instead"
                     : "; no MPS server: start nvidia-cuda-mps-control -d to run CUDA work of several processes side "
                       "by side");
}

}  // namespace lavaflow
