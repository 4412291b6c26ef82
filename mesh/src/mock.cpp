// SPDX-License-Identifier: MIT
#include "lavaflow/mesh/mock.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "lavaflow/core/detail/format.hpp"
#include "names.hpp"

namespace lavaflow::mesh {

namespace {

using detail::Kind;
using detail::to_string;

/// What one rank brings to a collective.
struct Call {
  Kind kind = Kind::Barrier;
  DType type = DType::U8;
  ReduceOp op = ReduceOp::Sum;
  std::uint32_t root = 0;
  std::span<const std::byte> send;
  std::span<std::byte> recv;
  Duration timeout{};
};

/// One collective of one group: the n-th call of every member.
struct Round {
  std::optional<Call> first;                                     // what the first rank to arrive asked for
  std::vector<std::optional<std::span<const std::byte>>> sends;  // by group rank
  std::uint32_t arrived = 0, collected = 0;
  std::vector<std::byte> result;
  bool ready = false;
  std::optional<Error> failed;
};

struct Group {
  std::vector<std::uint32_t> ranks;  // world ranks by group rank
  std::map<std::uint64_t, Round> rounds;
  std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::deque<std::vector<std::byte>>> mail;
};

}  // namespace

struct MockWorld::Shared {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::string, Group> groups;
};

namespace {

class MockCommunicator final : public Communicator {
 public:
  MockCommunicator(std::shared_ptr<MockWorld::Shared> shared, std::string name, std::uint32_t rank, std::uint32_t size)
      : shared_(std::move(shared)), name_(std::move(name)), rank_(rank), size_(size) {}

  const std::string& group() const override { return name_; }
  std::uint32_t rank() const override { return rank_; }
  std::uint32_t size() const override { return size_; }
  std::string_view backend() const override { return "mock"; }

  Work all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                  CallOptions o) override {
    if (send.size() != recv.size())
      return bad("all_reduce", str_format("send holds {} bytes, recv {}", send.size(), recv.size()));
    return start({Kind::AllReduce, type, op, 0, send, recv, o.timeout});
  }
  Work all_gather(std::span<const std::byte> send, std::span<std::byte> recv, DType type, CallOptions o) override {
    if (recv.size() != send.size() * size_)
      return bad("all_gather", str_format("recv must hold {} × {} bytes, holds {}", size_, send.size(), recv.size()));
    return start({Kind::AllGather, type, ReduceOp::Sum, 0, send, recv, o.timeout});
  }
  Work broadcast(std::span<std::byte> buffer, std::uint32_t root, DType type, CallOptions o) override {
    if (root >= size_) return bad("broadcast", str_format("root {} is not a rank of a group of {}", root, size_));
    return start({Kind::Broadcast, type, ReduceOp::Sum, root, buffer, buffer, o.timeout});
  }
  Work reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                      CallOptions o) override {
    if (send.size() != recv.size() * size_)
      return bad("reduce_scatter",
                 str_format("send must hold {} × recv's {} bytes, holds {}", size_, recv.size(), send.size()));
    return start({Kind::ReduceScatter, type, op, 0, send, recv, o.timeout});
  }
  Work barrier(CallOptions o) override {
    return start({Kind::Barrier, DType::U8, ReduceOp::Sum, 0, {}, {}, o.timeout});
  }

  Work send(std::span<const std::byte> buffer, std::uint32_t peer, std::uint32_t tag, CallOptions) override {
    if (peer >= size_) return bad("send", str_format("peer {} is not a rank of a group of {}", peer, size_));
    {
      std::lock_guard lock(shared_->mutex);
      shared_->groups[name_].mail[{rank_, peer, tag}].emplace_back(buffer.begin(), buffer.end());
    }
    shared_->cv.notify_all();
    return Work::done({});  // delivered eagerly: the buffer may be reused at once
  }

  Work recv(std::span<std::byte> buffer, std::uint32_t peer, std::uint32_t tag, CallOptions o) override {
    if (peer >= size_) return bad("recv", str_format("peer {} is not a rank of a group of {}", peer, size_));
    auto state = std::make_shared<Work::State>();
    std::thread([shared = shared_, state, buffer, peer, tag, o, name = name_, me = rank_] {
      std::unique_lock lock(shared->mutex);
      auto& group = shared->groups[name];
      auto& box = group.mail[{peer, me, tag}];
      const Deadline deadline(o.timeout);
      if (!shared->cv.wait_until(lock, deadline.at(), [&] { return !box.empty(); })) {
        const auto who = detail::ranks_text({peer}, group.ranks);
        lock.unlock();
        state->finish(fail(Errc::Timeout, "mesh::recv",
                           str_format("nothing from {} of group '{}' (tag {}) in time", who, name, tag)));
        return;
      }
      auto msg = std::move(box.front());
      box.pop_front();
      lock.unlock();
      if (msg.size() != buffer.size()) {
        state->finish(fail(Errc::InvalidArgument, "mesh::recv",
                           str_format("rank {} sent {} bytes into a {}-byte buffer", peer, msg.size(), buffer.size())));
        return;
      }
      std::memcpy(buffer.data(), msg.data(), msg.size());
      state->finish({});
    }).detach();
    return Work(std::move(state));
  }

 private:
  Work bad(const char* what, std::string why) {
    return Work::done(fail(Errc::InvalidArgument, str_format("mesh::{}", what), std::move(why)));
  }

  /// Runs the collective on a thread of its own, so that the caller's can overlap it with work.
  Work start(Call call) {
    const std::uint64_t seq = next_++;
    auto state = std::make_shared<Work::State>();
    std::thread([shared = shared_, state, call, seq, name = name_, me = rank_, n = size_] {
      state->finish(run(*shared, name, me, n, seq, call));
    }).detach();
    return Work(std::move(state));
  }

  static Status run(MockWorld::Shared& shared, const std::string& name, std::uint32_t me, std::uint32_t n,
                    std::uint64_t seq, const Call& call) {
    const std::string what = str_format("mesh::{}", to_string(call.kind));
    std::unique_lock lock(shared.mutex);
    Group& group = shared.groups[name];
    Round& round = group.rounds[seq];
    if (round.sends.empty()) round.sends.resize(n);
    // A completed round goes with the last rank out; a failed one stays (without its buffers), so
    // that a member arriving late fails at once instead of waiting for ranks that have left.
    auto leave = [&](Status s) -> Status {
      ++round.collected;
      if (round.failed) {
        round.result.clear();
        round.sends.assign(n, std::nullopt);
      } else if (round.ready && round.collected == n) {
        group.rounds.erase(seq);
      }
      return s;
    };
    if (round.failed) return leave(std::unexpected(*round.failed));
    if (!round.first) {
      round.first = call;
    } else if (const Call& f = *round.first; f.kind != call.kind || f.type != call.type || f.op != call.op ||
                                             f.root != call.root || f.send.size() != call.send.size()) {
      round.failed = Error(
          Errc::InvalidArgument, what,
          str_format("group '{}' call #{}: rank {} asked for {} ({}, {}, {} bytes, root {}) where "
                     "another asked for {} ({}, {}, {} bytes, root {})",
                     name, seq, me, to_string(call.kind), to_string(call.type), to_string(call.op), call.send.size(),
                     call.root, to_string(f.kind), to_string(f.type), to_string(f.op), f.send.size(), f.root));
      shared.cv.notify_all();
      return leave(std::unexpected(*round.failed));
    }
    round.sends[me] = call.send;
    if (++round.arrived == n) {
      if (auto ok = compute(round, n); !ok) round.failed = ok.error();
      round.ready = true;
      shared.cv.notify_all();
    }
    const Deadline deadline(call.timeout);
    if (!shared.cv.wait_until(lock, deadline.at(), [&] { return round.ready || round.failed.has_value(); })) {
      std::vector<std::uint32_t> missing;
      for (std::uint32_t r = 0; r < n; ++r)
        if (!round.sends[r]) missing.push_back(r);
      round.failed = Error(Errc::Timeout, what,
                           str_format("{} of group '{}' did not join call #{} in time",
                                      detail::ranks_text(missing, group.ranks), name, seq));
      round.sends[me].reset();  // our buffers are ours again
      --round.arrived;
      shared.cv.notify_all();
      return leave(std::unexpected(*round.failed));
    }
    if (round.failed) return leave(std::unexpected(*round.failed));
    deliver(round, call, me, n);
    return leave({});
  }

  /// The whole result, computed once by the last rank to arrive (every send is intact then).
  static Status compute(Round& round, std::uint32_t n) {
    const Call& f = *round.first;
    std::vector<std::span<const std::byte>> sends;
    for (const auto& s : round.sends) sends.push_back(*s);
    switch (f.kind) {
      case Kind::AllReduce:
      case Kind::ReduceScatter:
        round.result.resize(f.send.size());
        return reduce(sends, round.result, f.type, f.op);
      case Kind::AllGather:
        for (const auto& s : sends) round.result.insert(round.result.end(), s.begin(), s.end());
        return {};
      case Kind::Broadcast:
        round.result.assign(sends[f.root].begin(), sends[f.root].end());
        return {};
      case Kind::Barrier:
        return {};
    }
    (void)n;
    return {};
  }

  static void deliver(const Round& round, const Call& call, std::uint32_t me, std::uint32_t n) {
    (void)n;
    std::span<const std::byte> part = round.result;
    if (call.kind == Kind::ReduceScatter) part = part.subspan(std::size_t{me} * call.recv.size(), call.recv.size());
    if (!call.recv.empty()) std::memcpy(call.recv.data(), part.data(), call.recv.size());
  }

  std::shared_ptr<MockWorld::Shared> shared_;
  std::string name_;
  std::uint32_t rank_, size_;
  std::uint64_t next_ = 0;
};

}  // namespace

MockWorld::MockWorld(std::uint32_t size) : size_(size), shared_(std::make_shared<Shared>()) {}
MockWorld::~MockWorld() = default;

std::shared_ptr<MockWorld> MockWorld::create(std::uint32_t size) {
  return std::shared_ptr<MockWorld>(new MockWorld(size));
}

Result<std::unique_ptr<Communicator>> MockWorld::communicator(const std::string& name,
                                                              const std::vector<std::uint32_t>& ranks,
                                                              std::uint32_t world_rank) {
  constexpr const char* call = "mesh::MockWorld::communicator";
  if (ranks.empty()) return fail(Errc::InvalidArgument, call, str_format("group '{}' has no ranks", name));
  for (std::uint32_t r : ranks)
    if (r >= size_)
      return fail(Errc::InvalidArgument, call, str_format("group '{}' names rank {} of a world of {}", name, r, size_));
  const auto at = std::find(ranks.begin(), ranks.end(), world_rank);
  if (at == ranks.end())
    return fail(Errc::InvalidArgument, call, str_format("rank {} is not in group '{}'", world_rank, name));
  std::lock_guard lock(shared_->mutex);
  auto& group = shared_->groups[name];
  if (group.ranks.empty()) {
    group.ranks = ranks;
  } else if (group.ranks != ranks) {
    return fail(Errc::InvalidArgument, call, str_format("group '{}' was opened with other ranks", name));
  }
  return std::make_unique<MockCommunicator>(shared_, name, static_cast<std::uint32_t>(at - ranks.begin()),
                                            static_cast<std::uint32_t>(ranks.size()));
}

}  // namespace lavaflow::mesh
