// SPDX-License-Identifier: MIT
#include "vulkan_hierarchical.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hierarchy.hpp"
#include "lavaflow/core/detail/format.hpp"

namespace lavaflow::mesh::vulkan_hierarchy {

namespace {

/// Below these sizes (bytes per rank) a call takes the group's staged path whole: a hierarchical
/// call makes two or three calls of its own, each with its synchronisations, which a small call
/// feels more than it gains from carrying less through host memory (see note 0019).
constexpr std::uint64_t kAllReduceFrom = 256 << 10;
constexpr std::uint64_t kAllGatherFrom = 16 << 10;
constexpr std::uint64_t kReduceScatterFrom = 64 << 10;
constexpr std::uint64_t kBroadcastFrom = 64 << 10;

bool integer(DType t) { return t == DType::I32 || t == DType::I64 || t == DType::U8; }

bool known(DType t, ReduceOp op) {
  return static_cast<std::uint8_t>(t) <= static_cast<std::uint8_t>(DType::U8) &&
         static_cast<std::uint8_t>(op) <= static_cast<std::uint8_t>(ReduceOp::Average);
}

DeviceSpan part(const DeviceSpan& s, std::uint64_t at, std::uint64_t bytes) { return {s.buffer, s.offset + at, bytes}; }

class Hierarchical final : public VulkanCollectives {
 public:
  Hierarchical(const VulkanContext& ctx, Communicator& group, std::unique_ptr<VulkanCollectives> staged,
               std::uint32_t hosts)
      : ctx_(ctx), group_(group), flat_(std::move(staged)), hosts_(hosts) {}

  Status init(const VulkanCollectiveOptions& o) {
    constexpr const char* call = "VulkanCollectives::open";
    n_ = group_.size();
    me_ = group_.rank();
    per_host_ = n_ / hosts_;
    h_ = me_ / per_host_;
    j_ = me_ % per_host_;
    std::vector<std::uint32_t> local, across;
    for (std::uint32_t j = 0; j < per_host_; ++j) local.push_back(h_ * per_host_ + j);
    for (std::uint32_t h = 0; h < hosts_; ++h) across.push_back(h * per_host_ + j_);
    LF_TRY(auto groups, hierarchy::open_subgroups(group_, o.open_group, local, across, {}, o.attach_timeout, call));
    local_group_ = std::move(groups.local);
    across_group_ = std::move(groups.across);
    // Simulated hosts share a /dev/shm: each host's segment gets a key of its own.
    VulkanCollectiveOptions inner;
    inner.key = str_format("{}-host{}", o.key, h_);
    inner.chunk_bytes = o.chunk_bytes;
    inner.attach_timeout = o.attach_timeout;
    inner.segment = o.segment;
    inner.host = o.host;
    auto in_host = VulkanCollectives::open(ctx_, *local_group_, inner);
    inner.key = str_format("{}-index{}", o.key, j_);
    inner.segment = VulkanSegment::Auto;
    auto between = VulkanCollectives::open(ctx_, *across_group_, inner);
    const Status opened = !in_host   ? Status(std::unexpected(in_host.error()))
                          : !between ? Status(std::unexpected(between.error()))
                                     : Status{};
    LF_TRY_STATUS(hierarchy::agree(group_, opened, o.attach_timeout, call));
    local_ = std::move(*in_host);
    across_ = std::move(*between);
    reason_ = str_format(
        "{}; large calls hierarchical over {} hosts of {} ranks: each host's phases over its segment ({}), the "
        "exchange between hosts staged by the ranks of each local index",
        flat_->segment_reason(), hosts_, per_host_, local_->segment_reason());
    return {};
  }

  std::uint32_t rank() const override { return me_; }
  std::uint32_t size() const override { return n_; }
  bool shared_segment() const override { return false; }
  VulkanSegment segment() const override { return local_->segment(); }
  const std::string& segment_reason() const override { return reason_; }

  Status all_reduce(DeviceSpan send, DeviceSpan recv, DType type, ReduceOp op, CallOptions o) override {
    // Integer averages divide the wrapped sum once, which the levels cannot: staged whole.
    if (!known(type, op) || send.size != recv.size || send.size < kAllReduceFrom || send.size % size_of(type) ||
        (send.size / size_of(type)) % per_host_ || (integer(type) && op == ReduceOp::Average))
      return flat(flat_->all_reduce(send, recv, type, op, o));
    return phases([&]() -> Status {
      const std::uint64_t share = send.size / per_host_;
      LF_TRY(const DeviceSpan s, scratch(share));
      LF_TRY_STATUS(local_->reduce_scatter(send, s, type, op, o));
      LF_TRY_STATUS(across_->all_reduce(s, s, type, op, o));
      return local_->all_gather(s, recv, type, o);
    });
  }

  Status all_gather(DeviceSpan send, DeviceSpan recv, DType type, CallOptions o) override {
    if (!known(type, ReduceOp::Sum) || send.size < kAllGatherFrom || send.size % size_of(type) ||
        recv.size / n_ != send.size || recv.size % n_)
      return flat(flat_->all_gather(send, recv, type, o));
    // Each host's blocks side by side, then the hosts' rows in host order: rank order.
    return phases([&]() -> Status {
      LF_TRY(const DeviceSpan row, scratch(send.size * per_host_));
      LF_TRY_STATUS(local_->all_gather(send, row, type, o));
      return across_->all_gather(row, recv, type, o);
    });
  }

  Status reduce_scatter(DeviceSpan send, DeviceSpan recv, DType type, ReduceOp op, CallOptions o) override {
    if (!known(type, op) || recv.size < kReduceScatterFrom || recv.size % size_of(type) ||
        send.size / n_ != recv.size || send.size % n_ || (integer(type) && op == ReduceOp::Average))
      return flat(flat_->reduce_scatter(send, recv, type, op, o));
    // Host h's row of blocks, reduced between hosts, lands on host h; its ranks then take theirs.
    return phases([&]() -> Status {
      LF_TRY(const DeviceSpan row, scratch(recv.size * per_host_));
      LF_TRY_STATUS(across_->reduce_scatter(send, row, type, op, o));
      return local_->reduce_scatter(row, recv, type, op, o);
    });
  }

  Status broadcast(DeviceSpan buffer, std::uint32_t root, DType type, CallOptions o) override {
    if (!known(type, ReduceOp::Sum) || root >= n_ || buffer.size < kBroadcastFrom || buffer.size % size_of(type))
      return flat(flat_->broadcast(buffer, root, type, o));
    return phases([&]() -> Status {
      if (j_ == root % per_host_) LF_TRY_STATUS(across_->broadcast(buffer, root / per_host_, type, o));
      return local_->broadcast(buffer, root % per_host_, type, o);
    });
  }

 private:
  /// A staged call's result; after a failure of any call every later one reports the first.
  Status flat(Status s) {
    if (!failure_) return failure_;
    if (!s && s.error().code() != Errc::InvalidArgument) failure_ = s;
    return s;
  }

  template <class Body>
  Status phases(Body&& body) {
    if (!failure_) return failure_;
    Status s = body();
    if (!s) failure_ = s;
    return s;
  }

  /// Device memory for a call's phases, kept for the next (calls are synchronous).
  Result<DeviceSpan> scratch(std::uint64_t bytes) {
    if (!scratch_ || scratch_->size() < bytes) {
      scratch_.reset();
      LF_TRY(auto b, GpuBuffer::allocate(ctx_, {.size = bytes}));
      scratch_ = std::move(b);
    }
    return part(device_span(*scratch_), 0, bytes);
  }

  const VulkanContext& ctx_;
  Communicator& group_;
  std::unique_ptr<VulkanCollectives> flat_;  ///< the group's staged path, for small calls
  std::uint32_t hosts_;
  std::uint32_t n_ = 0, me_ = 0, per_host_ = 0, h_ = 0, j_ = 0;
  // The subgroups' communicators outlive the collectives over them (members end in reverse).
  std::unique_ptr<Communicator> local_group_, across_group_;
  std::unique_ptr<VulkanCollectives> local_, across_;
  std::optional<GpuBuffer> scratch_;
  Status failure_;
  std::string reason_;
};

}  // namespace

Result<std::unique_ptr<VulkanCollectives>> open_vulkan_hierarchical(const VulkanContext& ctx, Communicator& group,
                                                                    std::unique_ptr<VulkanCollectives> staged,
                                                                    std::uint32_t hosts,
                                                                    VulkanCollectiveOptions options) {
  auto c = std::make_unique<Hierarchical>(ctx, group, std::move(staged), hosts);
  LF_TRY_STATUS(c->init(options));
  return std::unique_ptr<VulkanCollectives>(std::move(c));
}

}  // namespace lavaflow::mesh::vulkan_hierarchy
