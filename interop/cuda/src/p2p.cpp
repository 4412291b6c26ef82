// SPDX-License-Identifier: MIT
// Peer links between the CUDA devices of one host: CUDA says whether a pair has peer access and
// how it ranks; NVML (the driver's management library, loaded at run time like the driver entry
// points) says whether the pair talks over NVLink; sysfs says where their PCIe routes meet.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/cuda/cuda.hpp"
#include "pci.hpp"
#include "runtime.hpp"

namespace lavaflow::cuda {

std::string_view to_string(PeerPath p) {
  switch (p) {
    case PeerPath::PCIe:
      return "PCIe";
    case PeerPath::NVLink:
      return "NVLink";
    default:
      return "none";
  }
}

namespace {

/// The part of NVML's C interface used here. NVML's header does not ship with the CUDA toolkit;
/// these declarations follow its stable ABI (enumerators by value).
struct Nvml {
  using Device = struct nvmlDevice_st*;
  using Init = int (*)();
  using Shutdown = int (*)();
  using ByPciBusId = int (*)(const char*, Device*);
  using P2PStatus = int (*)(Device, Device, int, int*);
  static constexpr int kSuccess = 0;
  static constexpr int kCapsIndexNvlink = 2;  // NVML_P2P_CAPS_INDEX_NVLINK
  static constexpr int kP2PStatusOk = 0;      // NVML_P2P_STATUS_OK

  Nvml() {
    lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) return;
    auto init = reinterpret_cast<Init>(::dlsym(lib_, "nvmlInit_v2"));
    shutdown_ = reinterpret_cast<Shutdown>(::dlsym(lib_, "nvmlShutdown"));
    by_bus_ = reinterpret_cast<ByPciBusId>(::dlsym(lib_, "nvmlDeviceGetHandleByPciBusId_v2"));
    p2p_ = reinterpret_cast<P2PStatus>(::dlsym(lib_, "nvmlDeviceGetP2PStatus"));
    ready_ = init && shutdown_ && by_bus_ && p2p_ && init() == kSuccess;
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
  ~Nvml() {
    if (ready_) shutdown_();
    if (lib_) ::dlclose(lib_);
  }

  /// Whether NVML reports an NVLink path between the GPUs at these PCI addresses; nullopt when
  /// NVML cannot say.
  [[nodiscard]] std::optional<bool> nvlink(const std::string& a, const std::string& b) const {
    if (!ready_ || a.empty() || b.empty()) return std::nullopt;
    Device da = nullptr, db = nullptr;
    int status = -1;
    if (by_bus_(a.c_str(), &da) != kSuccess || by_bus_(b.c_str(), &db) != kSuccess ||
        p2p_(da, db, kCapsIndexNvlink, &status) != kSuccess)
      return std::nullopt;
    return status == kP2PStatusOk;
  }

 private:
  void* lib_ = nullptr;
  Shutdown shutdown_ = nullptr;
  ByPciBusId by_bus_ = nullptr;
  P2PStatus p2p_ = nullptr;
  bool ready_ = false;
};

/// The sysfs device path of a PCI address as components below /sys/devices ("pci0000:00",
/// "0000:00:01.0", …, the device itself last); empty when sysfs does not have it.
std::vector<std::string> pci_route(const std::string& address) {
  if (address.empty()) return {};
  std::error_code ec;
  const auto real = std::filesystem::canonical("/sys/bus/pci/devices/" + address, ec);
  if (ec) return {};
  std::vector<std::string> parts;
  bool below_devices = false;
  for (const auto& part : real) {
    if (below_devices) parts.push_back(part.string());
    if (part == "devices") below_devices = true;
  }
  return parts;
}

std::string pcie_meet(const std::string& a, const std::string& b) {
  const auto ra = pci_route(a), rb = pci_route(b);
  if (ra.empty() || rb.empty()) return {};
  std::size_t common = 0;
  // The devices themselves (the last components) are never shared.
  while (common + 1 < ra.size() && common + 1 < rb.size() && ra[common] == rb[common]) ++common;
  if (common == 0) return "different root complexes";
  if (common == 1) return "root complex " + ra[0].substr(3);  // "pci0000:00" → "0000:00"
  return "switch " + ra[common - 1];
}

}  // namespace

Result<std::vector<PeerLink>> peer_links() {
  LF_TRY(const int n, detail::device_count());
  std::vector<std::string> pci(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) pci[static_cast<std::size_t>(i)] = detail::pci_address(i);
  const Nvml nvml;
  std::vector<PeerLink> links;
  for (int from = 0; from < n; ++from)
    for (int to = 0; to < n; ++to) {
      if (from == to) continue;
      PeerLink l{.from = from, .to = to};
      int v = 0;
      LF_TRY_STATUS(check(cudaDeviceCanAccessPeer(&v, from, to), "cudaDeviceCanAccessPeer"));
      l.access = v != 0;
      if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, from, to) == cudaSuccess)
        l.native_atomics = v != 0;
      if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrPerformanceRank, from, to) == cudaSuccess) l.performance_rank = v;
      (void)cudaGetLastError();
      const auto& a = pci[static_cast<std::size_t>(from)];
      const auto& b = pci[static_cast<std::size_t>(to)];
      l.pcie_meet = pcie_meet(a, b);
      if (l.access) l.path = nvml.nvlink(a, b).value_or(false) ? PeerPath::NVLink : PeerPath::PCIe;
      links.push_back(std::move(l));
    }
  return links;
}

Status enable_peer_access(int device, int peer) {
  constexpr const char* call = "cuda::enable_peer_access";
  int can = 0;
  LF_TRY_STATUS(check(cudaDeviceCanAccessPeer(&can, device, peer), "cudaDeviceCanAccessPeer"));
  if (!can)
    return fail(Errc::Unsupported, call, str_format("CUDA device {} has no peer access to device {}", device, peer));
  LF_TRY_STATUS(check(cudaSetDevice(device), "cudaSetDevice"));
  const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return {};
  }
  return check(e, "cudaDeviceEnablePeerAccess");
}

// Everything is checked before the first operation is queued; after it, an error leaves the
// message unreleased on the GPU, and the caller finishes the stream's work before dropping it (as
// with release()).
Status ChannelImports::copy_to_peer(cudaStream_t stream, Received& message, void* dst, std::uint64_t dst_bytes,
                                    int dst_device, cudaStream_t dst_stream) {
  constexpr const char* call = "cuda::ChannelImports::copy_to_peer";
  const int home = cuda_->device().ordinal;
  const std::uint64_t size = message.info().size;
  if (dst == nullptr) return fail(Errc::InvalidArgument, call, "the destination is null");
  if (size > dst_bytes)
    return fail(Errc::InvalidArgument, call,
                str_format("the message holds {} bytes; the destination {}", size, dst_bytes));
  LF_TRY(const auto release, message.gpu_release_point());
  const detail::KeepCurrentDevice keep;
  LF_TRY_STATUS(detail::stream_of(dst_stream, dst_device, "the destination", call));
  LF_TRY_STATUS(detail::stream_of(stream, home, "the channel's ring", call));
  LF_TRY(const auto* src, buffer(message));
  if (size > src->size())
    return fail(Errc::Malformed, call, str_format("the message holds {} bytes; its ring buffer {}", size, src->size()));
  if (!copied_) {
    cudaEvent_t e = nullptr;
    LF_TRY_STATUS(detail::cuda_step(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", call));
    copied_.reset(e);
  }
  LF_TRY_STATUS(wait(stream, message));
  LF_TRY_STATUS(detail::cuda_step(cudaMemcpyPeerAsync(dst, dst_device, src->data(), home, size, stream),
                                  "cudaMemcpyPeerAsync", call));
  LF_TRY_STATUS(detail::cuda_step(cudaEventRecord(copied_.get(), stream), "cudaEventRecord", call));
  LF_TRY_STATUS(signal(stream, release));
  (void)message.gpu_release();
  // Current, because a null dst_stream means that device's default stream.
  LF_TRY_STATUS(detail::cuda_step(cudaSetDevice(dst_device), "cudaSetDevice", call));
  return detail::cuda_step(cudaStreamWaitEvent(dst_stream, copied_.get(), 0), "cudaStreamWaitEvent", call);
}

}  // namespace lavaflow::cuda
