// SPDX-License-Identifier: MIT
#include "lavaflow/core/gpu_semaphore.hpp"

#include "external_memory.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/vk_call.hpp"
#include "vulkan_state.hpp"

namespace lavaflow {

namespace {
constexpr auto kSemFd = vk::ExternalSemaphoreHandleTypeFlagBits::eOpaqueFd;
}

std::string_view to_string(SemaphoreKind k) noexcept {
  return k == SemaphoreKind::Timeline ? "timeline" : k == SemaphoreKind::Binary ? "binary" : "unknown";
}

struct GpuSemaphore::Impl {
  std::shared_ptr<const detail::VulkanState> state;
  vk::raii::Semaphore semaphore{nullptr};
  SemaphoreKind kind = SemaphoreKind::Binary;
  UniqueFd imported_from;

  [[nodiscard]] const vk::raii::Device& device() const { return detail::get(state->device); }
  Status require_timeline(const char* call) const {
    if (kind != SemaphoreKind::Timeline)
      return fail(Errc::InvalidArgument, call, "a binary semaphore has no host-visible value");
    return {};
  }
};

Status GpuSemaphore::supported(const VulkanContext& ctx, SemaphoreKind kind, bool import) {
  constexpr const char* call = "GpuSemaphore";
  const auto& c = ctx.capabilities();
  if (kind != SemaphoreKind::Binary && kind != SemaphoreKind::Timeline)
    return fail(Errc::InvalidArgument, call, "unknown semaphore kind");
  if (!ctx.has_extension(VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME))
    return fail(Errc::Unsupported, call,
                str_format("device {} lacks {}", c.identity.name, VK_KHR_EXTERNAL_SEMAPHORE_FD_EXTENSION_NAME));
  if (kind == SemaphoreKind::Timeline) {
    if (!c.timeline_semaphore)
      return fail(Errc::Unsupported, call, str_format("device {} has no timeline semaphores", c.identity.name));
    if (import ? !c.semaphore_fd_import : !c.timeline_fd_export)
      return fail(Errc::Unsupported, call,
                  str_format("device {} cannot share timeline semaphores as opaque fds", c.identity.name));
    return {};
  }
  if (import ? !c.semaphore_fd_import : !c.semaphore_fd_export)
    return fail(Errc::Unsupported, call,
                str_format("device {} cannot {} binary semaphores as opaque fds", c.identity.name,
                           import ? "import" : "export"));
  return {};
}

namespace {

Result<vk::raii::Semaphore> make_semaphore(const VulkanContext& ctx, SemaphoreKind kind, std::uint64_t initial,
                                           bool exportable) {
  return detail::vk_call("vkCreateSemaphore", [&] {
    vk::SemaphoreTypeCreateInfo type(
        kind == SemaphoreKind::Timeline ? vk::SemaphoreType::eTimeline : vk::SemaphoreType::eBinary,
        kind == SemaphoreKind::Timeline ? initial : 0);
    vk::ExportSemaphoreCreateInfo exp(kSemFd, &type);
    vk::SemaphoreCreateInfo info({}, exportable ? static_cast<const void*>(&exp) : static_cast<const void*>(&type));
    return vk::raii::Semaphore(ctx.device(), info);
  });
}

}  // namespace

GpuSemaphore::GpuSemaphore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuSemaphore::GpuSemaphore(GpuSemaphore&&) noexcept = default;
GpuSemaphore& GpuSemaphore::operator=(GpuSemaphore&&) noexcept = default;
GpuSemaphore::~GpuSemaphore() = default;

Result<GpuSemaphore> GpuSemaphore::create(const VulkanContext& ctx, SemaphoreKind kind, std::uint64_t initial) {
  constexpr const char* call = "GpuSemaphore::create";
  if (auto ok = supported(ctx, kind, false); !ok) return std::unexpected(ok.error().within(call));
  auto impl = std::make_unique<Impl>();
  impl->state = detail::state_of(ctx);
  impl->kind = kind;
  LF_TRY(impl->semaphore, make_semaphore(ctx, kind, initial, true));
  return GpuSemaphore(std::move(impl));
}

Result<GpuSemaphore> GpuSemaphore::import(const VulkanContext& ctx, SemaphoreKind kind, UniqueFd&& fd) {
  constexpr const char* call = "GpuSemaphore::import";
  if (auto ok = supported(ctx, kind, true); !ok) return std::unexpected(ok.error().within(call));
  LF_TRY_STATUS(check_handle_fd(fd, call));
  auto impl = std::make_unique<Impl>();
  impl->state = detail::state_of(ctx);
  impl->kind = kind;
  LF_TRY(impl->semaphore, make_semaphore(ctx, kind, 0, false));
  LF_TRY(UniqueFd copy, fd.dup());  // the driver takes it on success only
  LF_TRY_STATUS(detail::vk_call("vkImportSemaphoreFdKHR", [&] {
    ctx.device().importSemaphoreFdKHR({*impl->semaphore, {}, kSemFd, copy.get()});
  }));
  (void)copy.release();
  impl->imported_from = std::move(fd);
  return GpuSemaphore(std::move(impl));
}

Result<UniqueFd> GpuSemaphore::export_fd() const {
  if (impl_->imported_from.valid()) return impl_->imported_from.dup();
  LF_TRY(int raw, detail::vk_call("vkGetSemaphoreFdKHR", [&] {
           return impl_->device().getSemaphoreFdKHR({*impl_->semaphore, kSemFd});
         }));
  UniqueFd fd(raw);
  LF_TRY_STATUS(fd.set_cloexec());
  return fd;
}

vk::Semaphore GpuSemaphore::semaphore() const { return *impl_->semaphore; }
SemaphoreKind GpuSemaphore::kind() const { return impl_->kind; }

Status GpuSemaphore::wait(std::uint64_t value, Duration timeout) const {
  constexpr const char* call = "vkWaitSemaphores";
  LF_TRY_STATUS(impl_->require_timeline(call));
  return detail::vk_call(call, [&]() -> Status {
    vk::SemaphoreWaitInfo wi({}, *impl_->semaphore, value);
    const auto ns = timeout == kForever ? UINT64_MAX : static_cast<std::uint64_t>(timeout.count());
    if (impl_->device().waitSemaphores(wi, ns) == vk::Result::eTimeout)
      return fail(Errc::Timeout, call, str_format("GPU work did not reach timeline value {} in time", value));
    return {};
  });
}

Status GpuSemaphore::signal(std::uint64_t value) const {
  constexpr const char* call = "vkSignalSemaphore";
  LF_TRY_STATUS(impl_->require_timeline(call));
  return detail::vk_call(call, [&] { impl_->device().signalSemaphore({*impl_->semaphore, value}); });
}

Result<std::uint64_t> GpuSemaphore::value() const {
  constexpr const char* call = "vkGetSemaphoreCounterValue";
  LF_TRY_STATUS(impl_->require_timeline(call));
  return detail::vk_call(call, [&] { return impl_->semaphore.getCounterValue(); });
}

}  // namespace lavaflow
