// SPDX-License-Identifier: MIT
// The Gloo backend: Gloo's collectives over its TCP transport. Gloo's calls block, so each
// communicator runs them in order on a thread of its own and hands back Work at once. Rendezvous
// goes through Gloo's FileStore in a directory that lives only while the group opens.
#include "gloo.hpp"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "lavaflow/core/detail/format.hpp"

namespace lavaflow::mesh::detail {

namespace {

std::chrono::milliseconds millis(Duration d) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::min(d, Duration(std::chrono::hours(24))));
  return std::max(ms, std::chrono::milliseconds(1));
}

/// Gloo reports failures as exceptions; a timeout says so in its text.
Error from_gloo(const std::exception& e, std::string call, const std::string& group) {
  const std::string what = e.what();
  const bool timeout = what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
  return Error(timeout ? Errc::Timeout : Errc::PeerLost, std::move(call),
               str_format("group '{}': {}{}", group, what,
                          timeout ? " (Gloo cannot tell which rank is missing; the native backend can)" : ""));
}

/// The IPv4 address of the first interface that is up and not loopback.
std::optional<std::string> first_address() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return std::nullopt;
  std::optional<std::string> out;
  for (ifaddrs* i = all; i && !out; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text)) out = text;
  }
  ::freeifaddrs(all);
  return out;
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> ctx, std::string group, std::unique_ptr<Communicator> p2p)
      : ctx_(std::move(ctx)), group_(std::move(group)), p2p_(std::move(p2p)), worker_([this] { run(); }) {}
  ~GlooCommunicator() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  const std::string& group() const override { return group_; }
  std::uint32_t rank() const override { return static_cast<std::uint32_t>(ctx_->rank); }
  std::uint32_t size() const override { return static_cast<std::uint32_t>(ctx_->size); }
  std::string_view backend() const override { return "gloo"; }

  Work all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                  CallOptions o) override {
    if (send.size() != recv.size())
      return bad("all_reduce", str_format("send holds {} bytes, recv {}", send.size(), recv.size()));
    if (send.size() % size_of(type) != 0) return bad("all_reduce", "not a whole number of elements");
    return queue("all_reduce", [=, this] { return reduce_all(send, recv, type, op, o.timeout); });
  }
  Work all_gather(std::span<const std::byte> send, std::span<std::byte> recv, DType, CallOptions o) override {
    if (recv.size() != send.size() * size())
      return bad("all_gather", str_format("recv must hold {} × {} bytes, holds {}", size(), send.size(), recv.size()));
    return queue("all_gather", [=, this]() -> Status {
      if (send.empty()) return {};
      gloo::AllgatherOptions opts(ctx_);
      if (send.data() != recv.data() + rank() * send.size())
        opts.setInput(const_cast<std::uint8_t*>(reinterpret_cast<const std::uint8_t*>(send.data())), send.size());
      opts.setOutput(reinterpret_cast<std::uint8_t*>(recv.data()), recv.size());
      opts.setTag(tag());
      opts.setTimeout(millis(o.timeout));
      gloo::allgather(opts);
      return {};
    });
  }
  Work broadcast(std::span<std::byte> buffer, std::uint32_t root, DType, CallOptions o) override {
    if (root >= size()) return bad("broadcast", str_format("root {} is not a rank of a group of {}", root, size()));
    return queue("broadcast", [=, this]() -> Status {
      if (buffer.empty()) return {};
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(reinterpret_cast<std::uint8_t*>(buffer.data()), buffer.size());
      opts.setRoot(static_cast<int>(root));
      opts.setTag(tag());
      opts.setTimeout(millis(o.timeout));
      gloo::broadcast(opts);
      return {};
    });
  }
  Work reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                      CallOptions o) override {
    if (send.size() != recv.size() * size())
      return bad("reduce_scatter",
                 str_format("send must hold {} × recv's {} bytes, holds {}", size(), recv.size(), send.size()));
    if (send.size() % size_of(type) != 0) return bad("reduce_scatter", "not a whole number of elements");
    // Gloo has no general reduce-scatter: the whole all_reduce, of which this rank keeps its block.
    return queue("reduce_scatter", [=, this]() -> Status {
      std::vector<std::byte> all(send.size());
      LF_TRY_STATUS(reduce_all(send, all, type, op, o.timeout));
      std::memcpy(recv.data(), all.data() + rank() * recv.size(), recv.size());
      return {};
    });
  }
  Work barrier(CallOptions o) override {
    return queue("barrier", [=, this]() -> Status {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(tag());
      opts.setTimeout(millis(o.timeout));
      gloo::barrier(opts);
      return {};
    });
  }
  // Point to point goes through the group's MPI communicator: Debian's libgloo (0.5) leaves the
  // pairs of a context connected by connectFullMesh out of reach of unbound buffers, whose send
  // then dereferences a null pair.
  Work send(std::span<const std::byte> buffer, std::uint32_t peer, std::uint32_t tag_, CallOptions o) override {
    return p2p_->send(buffer, peer, tag_, o);
  }
  Work recv(std::span<std::byte> buffer, std::uint32_t peer, std::uint32_t tag_, CallOptions o) override {
    return p2p_->recv(buffer, peer, tag_, o);
  }

 private:
  static Work bad(const char* what, std::string why) {
    return Work::done(fail(Errc::InvalidArgument, str_format("mesh::{}", what), std::move(why)));
  }
  // Collectives take tags in call order.
  std::uint32_t tag() { return static_cast<std::uint32_t>(calls_++ & 0x7FFFFFFF); }

  Status reduce_all(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                    Duration timeout) {
    if (send.empty()) return {};
    const ReduceOp step = op == ReduceOp::Average ? ReduceOp::Sum : op;
    gloo::AllreduceOptions opts(ctx_);
    opts.setTag(tag());
    opts.setTimeout(millis(timeout));
    if (type == DType::F16 || type == DType::BF16) {
      // Accumulated in f32 and rounded once, as the other backends do.
      const std::size_t count = send.size() / 2;
      std::vector<float> acc = widen(send, type);
      opts.setOutput(acc.data(), count);
      opts.setReduceFunction(combiner(DType::F32, step));
      gloo::allreduce(opts);
      narrow(acc, recv, type, op == ReduceOp::Average ? static_cast<float>(size()) : 1.0f);
      return {};
    }
    auto* in = const_cast<std::uint8_t*>(reinterpret_cast<const std::uint8_t*>(send.data()));
    auto* out = reinterpret_cast<std::uint8_t*>(recv.data());
    const std::size_t es = size_of(type);
    // Gloo sizes elements by the template type: one of the element's width.
    switch (es) {
      case 1:
        if (in != out) opts.setInput(in, send.size());
        opts.setOutput(out, recv.size());
        break;
      case 4:
        if (in != out) opts.setInput(reinterpret_cast<std::uint32_t*>(in), send.size() / 4);
        opts.setOutput(reinterpret_cast<std::uint32_t*>(out), recv.size() / 4);
        break;
      default:
        if (in != out) opts.setInput(reinterpret_cast<std::uint64_t*>(in), send.size() / 8);
        opts.setOutput(reinterpret_cast<std::uint64_t*>(out), recv.size() / 8);
        break;
    }
    opts.setReduceFunction(combiner(type, step));
    gloo::allreduce(opts);
    return op == ReduceOp::Average ? divide(recv, type, size()) : Status{};
  }

  static gloo::AllreduceOptions::Func combiner(DType type, ReduceOp op) {
    return [type, op](void* c, const void* a, const void* b, std::size_t n) {
      const std::size_t bytes = n * size_of(type);
      const std::span<const std::byte> ins[] = {{static_cast<const std::byte*>(a), bytes},
                                                {static_cast<const std::byte*>(b), bytes}};
      (void)reduce(ins, {static_cast<std::byte*>(c), bytes}, type, op);
    };
  }

  Work queue(const char* what, std::function<Status()> body) {
    auto state = std::make_shared<Work::State>();
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back({what, std::move(body), state});
    }
    cv_.notify_all();
    return Work(std::move(state));
  }

  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      Status s;
      if (broken_) {
        s = std::unexpected(*broken_);
      } else {
        try {
          s = job.body();
        } catch (const std::exception& e) {
          s = std::unexpected(from_gloo(e, str_format("mesh::{}", job.what), group_));
          broken_ = s.error();  // Gloo's context is unusable after a failed collective
        }
      }
      job.state->finish(std::move(s));
    }
  }

  struct Job {
    const char* what = "";
    std::function<Status()> body;
    std::shared_ptr<Work::State> state;
  };
  std::shared_ptr<gloo::Context> ctx_;
  std::string group_;
  std::unique_ptr<Communicator> p2p_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::optional<Error> broken_;
  std::uint64_t calls_ = 0;
  std::thread worker_;  // last: starts once the rest is built
};

/// Blocks SIGPIPE in this thread while it lives. Gloo writes to TCP sockets whose peer may have
/// closed them (a rank that timed out); the threads it starts here — Gloo's device loop and the
/// communicator's worker — inherit the mask, so such a write fails with EPIPE instead of killing
/// the process. The caller's mask comes back afterwards.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~SigpipeBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t old_{};
};

}  // namespace

Result<std::unique_ptr<Communicator>> open_gloo(GlooOpen o) {
  constexpr const char* call = "mesh::open_gloo";
  const SigpipeBlocked quiet;
  try {
    // Where Gloo listens: loopback for a group on one host; else this host's name where it
    // resolves (a cluster), else the first address of an interface that is up (hosts without
    // names: containers, network namespaces).
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    if (!o.one_host) {
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      addrinfo* found = nullptr;
      if (::getaddrinfo(host, nullptr, nullptr, &found) == 0) {
        attr.hostname = host;
        ::freeaddrinfo(found);
      } else if (auto ip = first_address()) {
        attr.hostname = *ip;
      }
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(o.directory);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(o.rank), static_cast<int>(o.size));
    ctx->setTimeout(millis(o.timeout));
    ctx->connectFullMesh(store, device);
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(std::move(ctx), o.group, std::move(o.point_to_point)));
  } catch (const std::exception& e) {
    return std::unexpected(from_gloo(e, call, o.group));
  }
}

}  // namespace lavaflow::mesh::detail
