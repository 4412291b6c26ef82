// SPDX-License-Identifier: MIT
// The native backend's engine: one shared segment per group and host, barriers on per-rank epoch
// counters in it, and every call a small state machine that advances without blocking.
#include "lavaflow/mesh/native.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/detail/wait.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "names.hpp"

namespace lavaflow::mesh {

namespace {

constexpr std::uint64_t kMagic = 0x3148534d464c0a00ull;
// An all_reduce of up to this many bytes per rank on one host is one step in which every rank
// reduces all the staging buffers itself (one barrier); larger ones are a reduce-scatter and an
// all-gather through the staging buffers (two barriers per step, every byte reduced once).
constexpr std::uint64_t kFlatLimit = 8 << 10;
constexpr std::uint64_t kMailBytes = 64 << 10;  // one piece of a point-to-point message
constexpr std::uint32_t kMaxLocal = 1024;

using detail::Kind;
using detail::ranks_text;
using detail::to_string;

struct alignas(64) RankSlot {
  std::atomic<std::uint64_t> arrive;  // the last barrier epoch this rank has reached
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> attached;
  // The call this rank makes, by call parity: a mismatch is seen at the call's first barrier.
  std::uint64_t call_no[2];
  std::uint64_t call_bytes[2];
  std::uint32_t call_what[2];  // kind | type << 8 | op << 16
  std::uint32_t call_root[2];
  std::uint64_t call_arena[2];  // 1 + the offset of the call's send in this rank's arena; 0: staged
};
static_assert(sizeof(RankSlot) == 128);

struct alignas(64) Mailbox {  // from one local rank to another: one piece at a time
  std::atomic<std::uint64_t> posted, taken;
  std::uint64_t total, length;
  std::uint32_t tag;
};

struct Header {
  std::atomic<std::uint64_t> magic;  // stored last by the creator
  std::uint32_t local;
  std::uint64_t chunk, bytes;
  alignas(64) std::atomic<std::uint32_t> failed;  // 0; 1 while the reason is written; 2 once it is
  std::uint32_t failed_code;
  std::uint64_t failed_call;  // the call number it holds from
  char failed_why[472];
};

struct Layout {
  std::uint64_t slots, boxes, mail, stage, area, arena, bytes;
  Layout(std::uint32_t local, std::uint64_t chunk, std::uint64_t arena_bytes) {
    auto up = [](std::uint64_t v) { return (v + 4095) & ~std::uint64_t{4095}; };
    slots = up(sizeof(Header));
    boxes = up(slots + local * sizeof(RankSlot));
    mail = up(boxes + std::uint64_t{local} * local * sizeof(Mailbox));
    stage = up(mail + std::uint64_t{local} * local * kMailBytes);
    area = stage + 2ull * local * chunk;
    arena = area + 2 * chunk;
    bytes = arena + local * arena_bytes;
  }
};

struct Op {
  std::shared_ptr<Work::State> state;
  // Started at the first look rather than at the call (a call that ends at once never reads the
  // clock).
  LazyDeadline deadline;
  bool expired() { return deadline.passed(); }
  Op() = default;
  Op(Op&&) = default;
  Op& operator=(Op&&) = default;
  virtual ~Op() = default;
};

class Engine;

struct Collective : Op {
  Collective(Kind kind_, std::span<const std::byte> send_, std::span<std::byte> recv_, std::uint64_t unit_, DType type_,
             ReduceOp op_, std::uint32_t root_, std::uint64_t call_no_, Duration timeout)
      : kind(kind_), type(type_), op(op_), root(root_), send(send_), recv(recv_), unit(unit_), call_no(call_no_) {
    deadline = LazyDeadline(timeout);
  }
  Kind kind = Kind::Barrier;
  DType type = DType::U8;
  ReduceOp op = ReduceOp::Sum;
  std::uint32_t root = 0;
  std::span<const std::byte> send;
  std::span<std::byte> recv;
  std::uint64_t unit = 0;  // bytes per rank the steps go through
  std::uint64_t call_no = 0;
  std::uint64_t done = 0, m = 0, wait_for = 0;
  int phase = 0;
  bool posted = false, checked = false;
  std::vector<float> wide;      // f16/bf16 across hosts: the partials in f32
  std::vector<std::byte> temp;  // reduce_scatter across hosts: the whole reduction …
  std::span<std::byte> keep;    // … of which this block goes to the caller
  std::uint64_t keep_from = 0;
  std::vector<std::uint64_t> counts, offsets;
  std::uint64_t arena_src = 0;      // 1 + offset of this rank's send in its arena; 0: staged
  std::vector<std::uint64_t> srcs;  // the same for every local rank (all_reduce), once checked
};

struct PointToPoint : Op {
  bool sending = false;
  std::uint32_t peer = 0, tag = 0;  // group rank
  std::span<const std::byte> out;
  std::span<std::byte> in;
  std::uint64_t moved = 0;
  bool started = false;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  std::string group;
  std::vector<std::uint32_t> world, hosts;
  std::uint32_t rank = 0, n = 0, nhosts = 1, my_host = 0;
  std::vector<std::uint32_t> local;      // local index → group rank
  std::vector<std::uint32_t> local_of;   // group rank → local index on its host
  std::vector<std::uint64_t> host_base;  // host → group ranks on hosts before it
  std::vector<std::uint32_t> host_size;
  std::uint32_t me = 0, nlocal = 0;
  bool leader = false;
  std::unique_ptr<HostLink> link;
  std::unique_ptr<Communicator> remote;  // point to point with ranks on other hosts
  std::uint64_t chunk = 0, arena_bytes = 0, arena_used = 0;
  std::byte* base = nullptr;
  std::uint64_t mapped = 0;
  std::vector<UniqueFd> watch;  // local index → pidfd of that rank's process (empty for this one)
  std::string shm_name;

  std::mutex mutex;
  std::deque<std::unique_ptr<Collective>> queue;
  std::deque<std::unique_ptr<PointToPoint>> p2p;
  std::uint64_t epoch = 0, step = 0, calls = 0, polls = 0;
  std::vector<std::vector<float>> abandoned_partials;  // timed-out exchanges' f32 buffers
  std::uint64_t current_call = 0;  // the call being advanced (what a failure recorded now holds from)
  std::optional<Error> broken;
  std::vector<std::span<const std::byte>> scratch;  // the inputs of a reduction

  ~Engine() {
    close();
    if (base) ::munmap(base, mapped);
  }

  Header& header() const { return *reinterpret_cast<Header*>(base); }
  RankSlot& slot(std::uint32_t j) const {
    return reinterpret_cast<RankSlot*>(base + Layout(nlocal, chunk, arena_bytes).slots)[j];
  }
  Mailbox& box(std::uint32_t from, std::uint32_t to) const {
    return reinterpret_cast<Mailbox*>(base + Layout(nlocal, chunk, arena_bytes).boxes)[from * nlocal + to];
  }
  std::byte* mail(std::uint32_t from, std::uint32_t to) const {
    return base + Layout(nlocal, chunk, arena_bytes).mail + (std::uint64_t{from} * nlocal + to) * kMailBytes;
  }
  std::byte* stage(std::uint64_t parity, std::uint32_t j) const {
    return base + Layout(nlocal, chunk, arena_bytes).stage + (parity * nlocal + j) * chunk;
  }
  std::byte* area(std::uint64_t parity) const {
    return base + Layout(nlocal, chunk, arena_bytes).area + parity * chunk;
  }
  /// The area as f32 partials (f16/bf16 across hosts).
  float* wide_area(std::uint64_t parity) const { return reinterpret_cast<float*>(area(parity)); }
  std::byte* arena(std::uint32_t j) const { return base + Layout(nlocal, chunk, arena_bytes).arena + j * arena_bytes; }
  /// Where local rank j's input of the current step is: its arena (a send allocated there, read
  /// where it is) or its staging buffer.
  const std::byte* source(const Collective& c, std::uint64_t parity, std::uint32_t j) const {
    return c.srcs.empty() || c.srcs[j] == 0 ? stage(parity, j) : arena(j) + (c.srcs[j] - 1) + c.done;
  }

  std::uint64_t arrive() {
    slot(me).arrive.store(++epoch, std::memory_order_release);
    return epoch;
  }

  /// Records a failure for every rank of this host (the first one wins) and breaks this engine.
  /// It holds for the call being advanced and every later one: a rank still finishing an earlier
  /// call whose barriers all ranks reached may finish it.
  Error break_with(Error e) {
    std::uint32_t expected = 0;
    Header& h = header();
    if (h.failed.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      const std::string text = e.cause();
      h.failed_code = static_cast<std::uint32_t>(e.code());
      h.failed_call = current_call;
      const std::size_t len = std::min(text.size(), sizeof h.failed_why - 1);
      std::memcpy(h.failed_why, text.data(), len);
      h.failed_why[len] = '\0';
      h.failed.store(2, std::memory_order_release);
    }
    broken = e;
    return e;
  }

  /// A failure another rank of this host recorded for this call or an earlier one (`any`: for any
  /// call), if any.
  std::optional<Error> peer_failure(std::string_view what, bool any = false) const {
    const Header& h = header();
    if (h.failed.load(std::memory_order_acquire) != 2) return std::nullopt;
    if (!any && h.failed_call > current_call) return std::nullopt;
    char why[sizeof h.failed_why];
    std::memcpy(why, h.failed_why, sizeof why);
    why[sizeof why - 1] = '\0';
    const auto code =
        h.failed_code <= static_cast<std::uint32_t>(Errc::Internal) ? static_cast<Errc>(h.failed_code) : Errc::Internal;
    return Error(code, str_format("mesh::{}", what), why);
  }

  /// The local ranks whose processes have ended before reaching epoch `e` (one that has reached
  /// it left what this barrier needs in the segment, which outlives it).
  std::vector<std::uint32_t> dead_ranks(std::uint64_t e) const {
    std::vector<std::uint32_t> dead;
    for (std::uint32_t j = 0; j < nlocal; ++j) {
      if (!watch[j] || slot(j).arrive.load(std::memory_order_acquire) >= e) continue;
      pollfd p{watch[j].get(), POLLIN, 0};
      if (::poll(&p, 1, 0) == 1) dead.push_back(j);
    }
    return dead;
  }

  /// Whether every local rank has reached `e`; an error when one is lost, another rank failed,
  /// or the call's deadline has passed.
  Result<bool> reached(std::uint64_t e, Collective& c) {
    const std::string_view what = to_string(c.kind);
    // A failure first: ranks that gave up on a call may have reached its barrier before they did.
    if (header().failed.load(std::memory_order_acquire) != 0)
      if (auto f = peer_failure(what)) return std::unexpected(*(broken = *f));
    bool all = true;
    for (std::uint32_t j = 0; j < nlocal && all; ++j) all = slot(j).arrive.load(std::memory_order_acquire) >= e;
    if (all) return true;
    // The clock and the peers' processes are looked at now and then: both cost system calls.
    if ((++polls & 63) != 0) return false;
    if ((polls & 255) == 0) {
      if (auto dead = dead_ranks(e); !dead.empty()) {
        std::vector<std::uint32_t> group_ranks;
        std::string pids;
        for (auto j : dead) {
          group_ranks.push_back(local[j]);
          pids += str_format("{}{}", pids.empty() ? "" : ", ", slot(j).pid.load());
        }
        return std::unexpected(
            break_with(Error(Errc::PeerLost, str_format("mesh::{}", what),
                             str_format("{} of group '{}' lost: the process (pid {}) ended during call #{}",
                                        ranks_text(group_ranks, world), group, pids, c.call_no))));
      }
    }
    if (c.expired()) {
      std::vector<std::uint32_t> missing;
      for (std::uint32_t j = 0; j < nlocal; ++j)
        if (slot(j).arrive.load(std::memory_order_acquire) < e) missing.push_back(local[j]);
      std::sort(missing.begin(), missing.end());
      std::string who = ranks_text(missing, world);
      if (missing.size() == 1 && missing[0] == local[0] && nhosts > 1)
        who += ", the host's leader, which waits on the other hosts";
      return std::unexpected(break_with(
          Error(Errc::Timeout, str_format("mesh::{}", what),
                str_format("{} of group '{}' did not join call #{} ({}) in time", who, group, c.call_no, what))));
    }
    return false;
  }

  /// This rank's call, written where the others compare it at the first barrier.
  void post_call(const Collective& c) {
    RankSlot& s = slot(me);
    const auto p = c.call_no & 1;
    s.call_no[p] = c.call_no;
    s.call_bytes[p] = c.unit;
    s.call_what[p] = static_cast<std::uint32_t>(c.kind) | static_cast<std::uint32_t>(c.type) << 8 |
                     static_cast<std::uint32_t>(c.op) << 16;
    s.call_root[p] = c.root;
    s.call_arena[p] = c.arena_src;
  }

  Status check_call(Collective& c) {
    const auto p = c.call_no & 1;
    const RankSlot& mine = slot(me);
    for (std::uint32_t j = 0; j < nlocal; ++j) {
      const RankSlot& s = slot(j);
      if (s.call_no[p] == mine.call_no[p] && s.call_bytes[p] == mine.call_bytes[p] &&
          s.call_what[p] == mine.call_what[p] && s.call_root[p] == mine.call_root[p]) {
        // Peers whose send lies in their arena: where, checked against the arena's size.
        const std::uint64_t at = s.call_arena[p];
        if (at != 0 && (at - 1 > arena_bytes || c.unit > arena_bytes - (at - 1)))
          return std::unexpected(
              break_with(Error(Errc::Malformed, str_format("mesh::{}", to_string(c.kind)),
                               str_format("group '{}': {} says its {}-byte input is at offset {} of a {}-byte arena",
                                          group, ranks_text({local[j]}, world), c.unit, at - 1, arena_bytes))));
        if (at != 0) {
          if (c.srcs.empty()) c.srcs.assign(nlocal, 0);
          c.srcs[j] = at;
        }
        continue;
      }
      auto describe = [](const RankSlot& r, std::uint64_t par) {
        const auto kind = static_cast<Kind>(r.call_what[par] & 0xFF);
        const auto type = static_cast<DType>((r.call_what[par] >> 8) & 0xFF);
        const auto op = static_cast<ReduceOp>((r.call_what[par] >> 16) & 0xFF);
        return str_format("call #{}: {} ({}, {}, {} bytes, root {})", r.call_no[par], to_string(kind),
                          type <= DType::U8 ? to_string(type) : "?", op <= ReduceOp::Average ? to_string(op) : "?",
                          r.call_bytes[par], r.call_root[par]);
      };
      return std::unexpected(
          break_with(Error(Errc::InvalidArgument, str_format("mesh::{}", to_string(c.kind)),
                           str_format("group '{}': {} made {} where rank {} made {}", group,
                                      ranks_text({local[j]}, world), describe(s, p), rank, describe(mine, p)))));
    }
    return {};
  }

  Result<bool> link_done(Collective& c) {
    auto t = link->test();
    if (!t) return std::unexpected(break_with(t.error()));
    if (*t) return true;
    if ((++polls & 63) != 0) return false;  // the clock now and then: a read costs as much as a test
    if (c.expired()) {
      // Whom the exchange still waits for, named by the ranks on those hosts.
      const auto silent = link->silent_hosts();
      std::vector<std::uint32_t> ranks;
      for (std::uint32_t r = 0; r < n; ++r)
        if (std::ranges::find(silent, hosts[r]) != silent.end()) ranks.push_back(r);
      link->abandon();  // no late peer's message lands in the caller's buffers after this
      // An exchange MPI cannot cancel may still write into (or read) the call's f32 partials:
      // they stay allocated for the communicator's life, never freed under it.
      if (!c.wide.empty()) abandoned_partials.push_back(std::move(c.wide));
      return std::unexpected(break_with(
          Error(Errc::Timeout, str_format("mesh::{}", to_string(c.kind)),
                str_format("the exchange between the {} hosts of group '{}' did not end in time (call #{}){}", nhosts,
                           group, c.call_no,
                           ranks.empty() ? std::string()
                                         : str_format(": nothing came from the host{} of {}",
                                                      silent.size() == 1 ? "" : "s", ranks_text(ranks, world))))));
    }
    return false;
  }

  std::pair<std::uint64_t, std::uint64_t> part(std::uint64_t bytes, std::uint32_t j, std::size_t es) const {
    const std::uint64_t count = bytes / es;
    return {count * j / nlocal * es, count * (j + 1) / nlocal * es};
  }

  /// One rank on every host: nothing to share in memory, so the leaders' exchange runs on the
  /// callers' buffers, the whole call at once (every host takes this path, or none does).
  [[nodiscard]] bool one_per_host(Kind kind) const { return nhosts == n && nhosts > 1 && kind != Kind::Barrier; }
  /// The phase of such a call once its exchange is posted.
  static constexpr int kDirectPosted = 1;

  /// An f16/bf16 all_reduce across hosts carries the hosts' partials in f32 and rounds once at
  /// the end, as on one host: partials in the type's own width would round at every exchange,
  /// and a sum could leave the type's range where the average does not.
  /// Min and Max are exact in the type (and keep the mesh's NaN rule only there): not widened.
  [[nodiscard]] bool widens(Kind kind, DType type, ReduceOp op) const {
    return nhosts > 1 && kind == Kind::AllReduce && (type == DType::F16 || type == DType::BF16) &&
           op != ReduceOp::Min && op != ReduceOp::Max;
  }

  /// Posts the exchange of a call with one rank per host (one that does not widen).
  Status post_direct(Kind kind, std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                     std::uint32_t root) {
    switch (kind) {
      case Kind::AllReduce:  // Average sums here and divides at the end
        return link->start_direct_all_reduce(send, recv, type, op == ReduceOp::Average ? ReduceOp::Sum : op);
      case Kind::ReduceScatter:
        return link->start_direct_reduce_scatter(send, recv, type, op);  // it averages
      case Kind::AllGather:
        return link->start_direct_all_gather(send, recv);
      default:
        return link->start_broadcast(recv, hosts[root]);
    }
  }
  /// What a call with one rank per host does once its exchange has ended (one that does not widen).
  Status end_direct(Kind kind, std::span<std::byte> recv, DType type, ReduceOp op) const {
    if (kind == Kind::AllReduce && op == ReduceOp::Average) return divide(recv, type, n);
    return {};
  }

  // Every case below either moves to a later phase or returns false (waiting); `true` once the
  // whole call is done. Each step ends in a barrier that every local rank reaches only after its
  // last read of that step's buffers, so the step after next may reuse them (double buffering).
  Result<bool> advance(Collective& c) {
    current_call = c.call_no;
    const std::size_t es = size_of(c.type);
    const bool multi = nhosts > 1;
    const ReduceOp local_op = multi && c.op == ReduceOp::Average ? ReduceOp::Sum : c.op;
    const bool wide = widens(c.kind, c.type, c.op);
    const float divisor = c.op == ReduceOp::Average ? static_cast<float>(n) : 1.0f;
    for (;;) {
      const std::uint64_t p = step & 1;
      auto next_step = [&]() -> bool {
        c.done += c.m;
        ++step;
        c.phase = 0;
        return c.done >= c.unit;
      };
      if (one_per_host(c.kind)) {
        if (c.phase == 0) {
          if (wide) {
            c.wide = widen(c.send, c.type);
            const auto values = std::as_writable_bytes(std::span(c.wide));
            LF_TRY_STATUS(link->start_direct_all_reduce(values, values, DType::F32, local_op));
          } else {
            LF_TRY_STATUS(post_direct(c.kind, c.send, c.recv, c.type, c.op, c.root));
          }
          c.phase = kDirectPosted;
        }
        auto r = link_done(c);
        if (!r || !*r) return r;
        if (wide)
          narrow(c.wide, c.recv, c.type, divisor);
        else
          LF_TRY_STATUS(end_direct(c.kind, c.recv, c.type, c.op));
        return true;
      }
      switch (c.phase) {
        case 0: {  // the step begins: this rank's part goes into its staging buffer
          if (!c.posted) {
            post_call(c);
            c.posted = true;
          }
          const std::uint64_t left = c.unit - c.done;
          std::uint64_t cap = chunk;
          if (c.kind == Kind::ReduceScatter || (c.kind == Kind::AllGather && multi)) cap = chunk / n / es * es;
          if (wide) cap = chunk / 2 / es * es;  // the area holds the step's partials in f32
          c.m = std::min(left, cap);
          switch (c.kind) {
            case Kind::AllReduce:
              if (c.arena_src == 0) std::memcpy(stage(p, me), c.send.data() + c.done, c.m);
              break;
            case Kind::AllGather:
              std::memcpy(stage(p, me), c.send.data() + c.done, c.m);
              break;
            case Kind::Broadcast:
              if (rank == c.root) std::memcpy(stage(p, me), c.recv.data() + c.done, c.m);
              break;
            case Kind::ReduceScatter:
              for (std::uint32_t j = 0; j < n; ++j)
                std::memcpy(stage(p, me) + j * c.m, c.send.data() + j * c.unit + c.done, c.m);
              break;
            case Kind::Barrier:
              break;
          }
          c.wait_for = arrive();
          c.phase = 1;
          break;
        }
        case 1: {
          auto r = reached(c.wait_for, c);
          if (!r) return std::unexpected(r.error());
          if (!*r) return false;
          if (!c.checked) {
            LF_TRY_STATUS(check_call(c));
            c.checked = true;
          }
          if (c.kind == Kind::Barrier) {
            if (!multi) return true;
            if (leader) {
              LF_TRY_STATUS(link->start_barrier());
              c.phase = 4;
            } else {
              c.wait_for = arrive();
              c.phase = 5;
            }
            break;
          }
          if (c.kind == Kind::AllReduce) {
            auto& ins = scratch;
            ins.clear();
            if (!multi && c.unit <= kFlatLimit) {
              for (std::uint32_t j = 0; j < nlocal; ++j) ins.emplace_back(source(c, p, j), c.m);
              LF_TRY_STATUS(reduce(ins, {c.recv.data() + c.done, c.m}, c.type, c.op));
              if (next_step()) return true;
              break;
            }
            const auto [a, b] = part(c.m, me, es);
            if (b > a) {
              for (std::uint32_t j = 0; j < nlocal; ++j) ins.emplace_back(source(c, p, j) + a, b - a);
              if (wide) {
                LF_TRY_STATUS(reduce_wide(ins, {wide_area(p) + a / es, (b - a) / es}, c.type, local_op));
              } else {
                LF_TRY_STATUS(reduce(ins, {stage(p, me) + a, b - a}, c.type, local_op));
                std::memcpy((multi ? area(p) : c.recv.data() + c.done) + a, stage(p, me) + a, b - a);
              }
            }
            c.wait_for = arrive();
            if (!multi) {
              c.phase = 2;
            } else if (leader) {
              c.phase = 3;
            } else {
              c.wait_for = arrive();
              c.phase = 5;
            }
            break;
          }
          if (c.kind == Kind::ReduceScatter) {  // one host: group rank = local index
            auto& ins = scratch;
            ins.clear();
            for (std::uint32_t j = 0; j < nlocal; ++j) ins.emplace_back(stage(p, j) + rank * c.m, c.m);
            LF_TRY_STATUS(reduce(ins, {c.recv.data() + c.done, c.m}, c.type, c.op));
            if (next_step()) return true;
            break;
          }
          if (c.kind == Kind::AllGather && !multi) {
            for (std::uint32_t j = 0; j < nlocal; ++j)
              std::memcpy(c.recv.data() + std::uint64_t{local[j]} * c.unit + c.done, stage(p, j), c.m);
            if (next_step()) return true;
            break;
          }
          if (c.kind == Kind::Broadcast && !multi) {
            if (rank != c.root) std::memcpy(c.recv.data() + c.done, stage(p, local_of[c.root]), c.m);
            if (next_step()) return true;
            break;
          }
          // Across hosts: the leader hands the host's part to the other leaders.
          if (!leader) {
            c.wait_for = arrive();
            c.phase = 5;
            break;
          }
          if (c.kind == Kind::AllGather) {
            c.counts.assign(nhosts, 0);
            c.offsets.assign(nhosts, 0);
            for (std::uint32_t h = 0; h < nhosts; ++h) {
              c.counts[h] = host_size[h] * c.m;
              c.offsets[h] = host_base[h] * c.m;
            }
            for (std::uint32_t j = 0; j < nlocal; ++j)
              std::memcpy(area(p) + (host_base[my_host] + j) * c.m, stage(p, j), c.m);
            LF_TRY_STATUS(link->start_all_gather({area(p), n * c.m}, c.counts, c.offsets));
          } else {  // broadcast
            if (hosts[c.root] == my_host) std::memcpy(area(p), stage(p, local_of[c.root]), c.m);
            LF_TRY_STATUS(link->start_broadcast({area(p), c.m}, hosts[c.root]));
          }
          c.phase = 4;
          break;
        }
        case 2: {  // one host, all_reduce: every rank copies the other ranks' reduced parts
          auto r = reached(c.wait_for, c);
          if (!r) return std::unexpected(r.error());
          if (!*r) return false;
          for (std::uint32_t j = 0; j < nlocal; ++j) {
            if (j == me) continue;
            const auto [a, b] = part(c.m, j, es);
            std::memcpy(c.recv.data() + c.done + a, stage(p, j) + a, b - a);
          }
          if (next_step()) return true;
          break;
        }
        case 3: {  // leader, all_reduce across hosts: the host's reduction is whole in the area
          auto r = reached(c.wait_for, c);
          if (!r) return std::unexpected(r.error());
          if (!*r) return false;
          if (wide)
            LF_TRY_STATUS(link->start_all_reduce(std::as_writable_bytes(std::span(wide_area(p), c.m / es)), DType::F32,
                                                 local_op));
          else
            LF_TRY_STATUS(link->start_all_reduce({area(p), c.m}, c.type, local_op));
          c.phase = 4;
          break;
        }
        case 4: {  // leader: the exchange between hosts
          auto r = link_done(c);
          if (!r) return std::unexpected(r.error());
          if (!*r) return false;
          if (wide) {
            // narrow() reads its values as const while it writes the area: through a copy.
            c.wide.assign(wide_area(p), wide_area(p) + c.m / es);
            narrow(c.wide, {area(p), c.m}, c.type, divisor);
          } else if (c.kind == Kind::AllReduce && c.op == ReduceOp::Average) {
            LF_TRY_STATUS(divide({area(p), c.m}, c.type, n));
          }
          c.wait_for = arrive();
          c.phase = 5;
          break;
        }
        case 5: {  // across hosts: the result fans out from the area
          auto r = reached(c.wait_for, c);
          if (!r) return std::unexpected(r.error());
          if (!*r) return false;
          switch (c.kind) {
            case Kind::AllReduce:
              std::memcpy(c.recv.data() + c.done, area(p), c.m);
              break;
            case Kind::AllGather:
              for (std::uint32_t g = 0; g < n; ++g)
                std::memcpy(c.recv.data() + std::uint64_t{g} * c.unit + c.done,
                            area(p) + (host_base[hosts[g]] + local_of[g]) * c.m, c.m);
              break;
            case Kind::Broadcast:
              if (rank != c.root) std::memcpy(c.recv.data() + c.done, area(p), c.m);
              break;
            case Kind::ReduceScatter:
            case Kind::Barrier:
              return true;
          }
          if (next_step()) return true;
          break;
        }
        default:
          return fail(Errc::Internal, "mesh::native", "unknown phase");
      }
    }
  }

  /// Whether an earlier point-to-point call in the same direction with the same peer is pending.
  bool blocked(const PointToPoint& x) const {
    for (const auto& o : p2p) {
      if (o.get() == &x) return false;
      if (o->sending == x.sending && o->peer == x.peer) return true;
    }
    return false;
  }

  Result<bool> advance(PointToPoint& x) {
    current_call = 0;  // a point-to-point failure breaks every call
    if (blocked(x)) return false;
    const std::string what = x.sending ? "send" : "recv";
    const std::uint32_t peer_local = local_of[x.peer];
    for (;;) {
      if (x.sending) {
        Mailbox& b = box(me, peer_local);
        if (x.started && x.moved >= x.out.size()) return true;
        if (b.posted.load(std::memory_order_acquire) != b.taken.load(std::memory_order_acquire)) break;
        const std::uint64_t piece = std::min<std::uint64_t>(kMailBytes, x.out.size() - x.moved);
        std::memcpy(mail(me, peer_local), x.out.data() + x.moved, piece);
        b.total = x.out.size();
        b.length = piece;
        b.tag = x.tag;
        b.posted.fetch_add(1, std::memory_order_release);
        x.moved += piece;
        x.started = true;
      } else {
        Mailbox& b = box(peer_local, me);
        if (x.started && x.moved >= x.in.size()) return true;
        if (b.posted.load(std::memory_order_acquire) == b.taken.load(std::memory_order_acquire)) break;
        const std::uint64_t total = b.total, piece = b.length;
        const std::uint32_t tag = b.tag;
        if (!x.started && (tag != x.tag || total != x.in.size()))
          return fail(Errc::InvalidArgument, "mesh::recv",
                      str_format("the next message from {} of group '{}' has tag {} and {} bytes; this recv takes tag "
                                 "{} and {} bytes",
                                 ranks_text({x.peer}, world), group, tag, total, x.tag, x.in.size()));
        if (total != x.in.size() || piece > kMailBytes || piece > x.in.size() - x.moved)
          return std::unexpected(break_with(
              Error(Errc::Malformed, "mesh::recv",
                    str_format("{} of group '{}' wrote a {}-byte piece of a {}-byte message into the mailbox",
                               ranks_text({x.peer}, world), group, piece, total))));
        std::memcpy(x.in.data() + x.moved, mail(peer_local, me), piece);
        b.taken.fetch_add(1, std::memory_order_release);
        x.moved += piece;
        x.started = true;
      }
    }
    if (auto f = peer_failure(what, true)) return std::unexpected(*(broken = *f));
    if ((++polls & 255) == 0 && watch[peer_local]) {
      pollfd p{watch[peer_local].get(), POLLIN, 0};
      if (::poll(&p, 1, 0) == 1)
        return fail(Errc::PeerLost, str_format("mesh::{}", what),
                    str_format("{} of group '{}' is lost: its process ended", ranks_text({x.peer}, world), group));
    }
    if (x.expired())
      return fail(Errc::Timeout, str_format("mesh::{}", what),
                  str_format("{} {} of group '{}' (tag {}) did not take part in time",
                             x.sending ? "sending to" : "receiving from", ranks_text({x.peer}, world), group, x.tag));
    return false;
  }

  /// What an ended collective returns.
  Status conclude(Collective& c, const Result<bool>& r) {
    if (r && !c.keep.empty()) std::memcpy(c.keep.data(), c.temp.data() + c.keep_from, c.keep.size());
    if (r) return {};
    // The other ranks wait on this one: a collective that fails here fails for all of them.
    current_call = c.call_no;
    if (!broken) break_with(r.error());
    return std::unexpected(r.error());
  }

  /// Advances every call in flight: collectives in order, point-to-point calls independently.
  void poll() {
    std::vector<std::pair<std::shared_ptr<Work::State>, Status>> ended;
    {
      std::lock_guard lock(mutex);
      while (!queue.empty()) {
        Collective& c = *queue.front();
        Result<bool> r = broken ? Result<bool>(std::unexpected(*broken)) : advance(c);
        if (r && !*r) break;
        ended.emplace_back(c.state, conclude(c, r));
        queue.pop_front();
      }
      for (auto it = p2p.begin(); it != p2p.end();) {
        Result<bool> r = broken ? Result<bool>(std::unexpected(*broken)) : advance(**it);
        if (r && !*r) {
          ++it;
          continue;
        }
        ended.emplace_back((*it)->state, r ? Status{} : Status(std::unexpected(r.error())));
        it = p2p.erase(it);
      }
    }
    for (auto& [state, status] : ended) state->finish(std::move(status));
  }

  void close() {
    std::vector<std::shared_ptr<Work::State>> left;
    {
      std::lock_guard lock(mutex);
      for (auto& c : queue) left.push_back(c->state);
      for (auto& x : p2p) left.push_back(x->state);
      queue.clear();
      p2p.clear();
    }
    for (auto& s : left)
      s->finish(fail(Errc::InvalidArgument, "mesh::Communicator",
                     str_format("group '{}' was closed with this call in flight", group)));
  }

  /// Runs `test` for a few microseconds (a small collective of ranks that are all present ends
  /// in that time): its result once it is an error or true, nullopt if it was still false.
  /// The clock is read every 8 tests, which keeps the spin's limits in time when a test is an
  /// MPI_Test (between hosts) as well as a shared-memory load. Past a few microseconds (longer
  /// than a small exchange with peers that are all there) the core goes to whoever else waits for
  /// it between tests: a peer on the same core would otherwise wait out the whole spin. A yield is
  /// a system call, so yielding sooner would delay most small calls.
  template <class Test>
  static std::optional<Result<bool>> spin(Test&& test) {
    std::optional<Clock::time_point> began;
    for (std::uint32_t i = 1;; ++i) {
      Result<bool> r = test();
      if (!r || *r) return r;
      if ((i & 7) != 0) continue;
      const auto now = Clock::now();
      if (!began) began = now;
      if (now - *began >= std::chrono::microseconds(20)) return std::nullopt;
      if (now - *began >= std::chrono::microseconds(5)) std::this_thread::yield();
    }
  }

  /// A collective: with nothing else in flight it runs here for a few microseconds on the
  /// caller's stack, and only then becomes a Work to wait on.
  Work start(Collective&& c) {
    {
      std::unique_lock lock(mutex);
      if (queue.empty() && p2p.empty()) {
        auto r = spin([&] { return broken ? Result<bool>(std::unexpected(*broken)) : advance(c); });
        if (r) return Work::done(conclude(c, *r));
      }
    }
    // Nothing holds the call's address (only its buffers'), so it may move.
    return enqueue(std::make_unique<Collective>(std::move(c)), true);
  }

  /// A call with one rank per host (one_per_host, not widening) when nothing else is in flight:
  /// posted and spun on here with no Collective of its own — building and dropping one is a
  /// noticeable share of a small exchange between hosts. A call still under way after the spin
  /// becomes a Collective past its posting, queued like any other. nullopt: `start` takes it
  /// (calls in flight, or the engine broken).
  std::optional<Work> start_direct(Kind kind, std::span<const std::byte> send, std::span<std::byte> recv,
                                   std::uint64_t unit, DType type, ReduceOp op, std::uint32_t root,
                                   const CallOptions& o) {
    std::uint64_t call_no = 0;
    {
      std::unique_lock lock(mutex);
      if (!queue.empty() || !p2p.empty() || broken) return std::nullopt;
      call_no = current_call = calls++;
      if (Status posted = post_direct(kind, send, recv, type, op, root); !posted)
        return Work::done(std::unexpected(break_with(posted.error())));
      auto r = spin([&]() -> Result<bool> {
        auto t = link->test();
        if (!t) return std::unexpected(break_with(t.error()));
        return *t;
      });
      if (r) {
        if (!*r) return Work::done(std::unexpected(r->error()));
        Status ended = end_direct(kind, recv, type, op);
        if (!ended) return Work::done(std::unexpected(break_with(ended.error())));
        return Work::done({});
      }
    }
    auto c = std::make_unique<Collective>(kind, send, recv, unit, type, op, root, call_no, o.timeout);
    c->phase = kDirectPosted;
    return enqueue(std::move(c), true);
  }

  Work enqueue(std::unique_ptr<Op> op, bool collective) {
    auto state = std::make_shared<Work::State>();
    op->state = state;
    state->progress = [weak = weak_from_this()] {
      if (auto e = weak.lock()) e->poll();
    };
    {
      std::lock_guard lock(mutex);
      if (collective) {
        queue.emplace_back(static_cast<Collective*>(op.release()));
      } else {
        p2p.emplace_back(static_cast<PointToPoint*>(op.release()));
      }
    }
    poll();  // this rank's part goes out now
    return Work(std::move(state));
  }
};

/// A setup wait for what other ranks do to the group's segment (nothing wakes the waiter): tests
/// in short naps until `deadline`.
template <class Ready, class OnTimeout>
Status poll_setup(Ready&& ready, const Deadline& deadline, OnTimeout&& on_timeout) {
  return lavaflow::detail::wait_for(ready, lavaflow::detail::never_stop,
                                    lavaflow::detail::Nap{std::chrono::microseconds(200)}, WaitMode::Block,
                                    deadline.left(), {}, on_timeout);
}

Status attach(Engine& e, Duration timeout) {
  constexpr const char* call = "mesh::open_native";
  const Layout layout(e.nlocal, e.chunk, e.arena_bytes);
  const Deadline deadline(timeout);
  const char* name = e.shm_name.c_str();
  UniqueFd fd;
  if (e.me == 0) {
    fd = UniqueFd(::shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
    if (!fd)
      return std::unexpected(from_errno(errno, call,
                                        str_format("creating /dev/shm{} for group '{}' (a segment of that name exists: "
                                                   "another group or job with the same key)",
                                                   name, e.group)));
    if (::ftruncate(fd.get(), static_cast<off_t>(layout.bytes)) != 0) {
      const int err = errno;
      ::shm_unlink(name);
      return std::unexpected(from_errno(err, call, str_format("sizing /dev/shm{}", name)));
    }
  } else {
    // The leader creates the segment, then sizes it; nothing wakes the others when it has.
    LF_TRY_STATUS(poll_setup(
        [&]() -> Result<bool> {
          if ((fd = UniqueFd(::shm_open(name, O_RDWR | O_CLOEXEC, 0)))) return true;
          if (errno != ENOENT) return std::unexpected(from_errno(errno, call, str_format("opening /dev/shm{}", name)));
          return false;
        },
        deadline,
        [&] {
          return Error(Errc::Timeout, call,
                       str_format("{} of group '{}', this host's leader, did not create the group's segment in time",
                                  ranks_text({e.local[0]}, e.world), e.group));
        }));
    LF_TRY_STATUS(poll_setup(
        [&]() -> Result<bool> {
          struct stat st {};
          if (::fstat(fd.get(), &st) != 0)
            return std::unexpected(from_errno(errno, call, "fstat of the group's segment"));
          if (static_cast<std::uint64_t>(st.st_size) == layout.bytes) return true;
          if (st.st_size != 0)
            return fail(Errc::Malformed, call,
                        str_format("/dev/shm{} holds {} bytes where group '{}' needs {}: another job's segment, or "
                                   "ranks that disagree on the group",
                                   name, st.st_size, e.group, layout.bytes));
          return false;
        },
        deadline, [&] { return Error(Errc::Timeout, call, str_format("/dev/shm{} was never sized", name)); }));
  }
  void* p = ::mmap(nullptr, layout.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    if (e.me == 0) ::shm_unlink(name);
    return std::unexpected(from_errno(err, call, str_format("mapping {} bytes of /dev/shm{}", layout.bytes, name)));
  }
  e.base = static_cast<std::byte*>(p);
  e.mapped = layout.bytes;
  Header& h = e.header();
  if (e.me == 0) {
    h.local = e.nlocal;
    h.chunk = e.chunk;
    h.bytes = layout.bytes;
    h.magic.store(kMagic, std::memory_order_release);
  } else {
    LF_TRY_STATUS(
        poll_setup([&] { return h.magic.load(std::memory_order_acquire) == kMagic; }, deadline,
                   [&] { return Error(Errc::Timeout, call, str_format("/dev/shm{} was never initialised", name)); }));
    if (h.local != e.nlocal || h.chunk != e.chunk || h.bytes != layout.bytes)
      return fail(Errc::Malformed, call,
                  str_format("/dev/shm{} is laid out for {} ranks and {}-byte chunks, this rank expects {} and {}",
                             name, h.local, h.chunk, e.nlocal, e.chunk));
  }
  e.slot(e.me).pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
  e.slot(e.me).attached.store(1, std::memory_order_release);
  // Everyone attached: the name goes (whoever gets there first), so no crash can leave it behind.
  std::vector<std::uint32_t> missing;
  (void)poll_setup(
      [&] {
        missing.clear();
        for (std::uint32_t j = 0; j < e.nlocal; ++j)
          if (e.slot(j).attached.load(std::memory_order_acquire) == 0) missing.push_back(e.local[j]);
        return missing.empty();
      },
      deadline, [] { return Error(Errc::Timeout, "", ""); });  // reported below, after the unlink
  ::shm_unlink(name);
  if (!missing.empty())
    return fail(Errc::Timeout, call,
                str_format("{} of group '{}' did not attach to this host's segment in time",
                           ranks_text(missing, e.world), e.group));
  e.watch.resize(e.nlocal);
  for (std::uint32_t j = 0; j < e.nlocal; ++j) {
    if (j == e.me) continue;
    const int fdp = static_cast<int>(::syscall(SYS_pidfd_open, e.slot(j).pid.load(), 0));
    if (fdp < 0) {
      if (errno == ESRCH)
        return fail(
            Errc::PeerLost, call,
            str_format("{} of group '{}' ended while the group opened", ranks_text({e.local[j]}, e.world), e.group));
      continue;  // no pidfds here (old kernel): a lost rank is then a timeout
    }
    e.watch[j] = UniqueFd(fdp);
  }
  return {};
}

/// Whether a call's input and output share any byte.
bool overlap(std::span<const std::byte> send, std::span<const std::byte> recv) {
  return send.data() < recv.data() + recv.size() && recv.data() < send.data() + send.size();
}

class NativeCommunicator final : public Communicator {
 public:
  explicit NativeCommunicator(std::shared_ptr<Engine> e) : e_(std::move(e)) {}
  ~NativeCommunicator() override { e_->close(); }

  const std::string& group() const override { return e_->group; }
  std::uint32_t rank() const override { return e_->rank; }
  std::uint32_t size() const override { return e_->n; }
  std::string_view backend() const override { return "native"; }

  Work all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                  CallOptions o) override {
    if (send.size() != recv.size())
      return bad("all_reduce", str_format("send holds {} bytes, recv {}", send.size(), recv.size()));
    if (send.data() != recv.data() && overlap(send, recv))
      return bad("all_reduce", "send and recv overlap without being the same bytes (in place is send == recv)");
    if (auto w = direct(Kind::AllReduce, send, recv, send.size(), type, op, 0, o)) return std::move(*w);
    auto c = make(Kind::AllReduce, send, recv, send.size(), type, op, 0, o);
    if (!c) return Work::done(std::unexpected(c.error()));
    if (send.empty()) return Work::done({});
    // A send in this rank's arena is read where it is — except in place on the flat path, where
    // peers read it while this rank writes its result.
    const std::byte* mine = e_->arena(e_->me);
    const bool in_arena = send.data() >= mine && send.data() + send.size() <= mine + e_->arena_bytes;
    const bool flat = e_->nhosts == 1 && send.size() <= kFlatLimit;
    if (in_arena && !(flat && overlap(send, recv))) c->arena_src = 1 + static_cast<std::uint64_t>(send.data() - mine);
    return e_->start(std::move(*c));
  }
  Work all_gather(std::span<const std::byte> send, std::span<std::byte> recv, DType type, CallOptions o) override {
    if (recv.size() != send.size() * e_->n)
      return bad("all_gather", str_format("recv must hold {} × {} bytes, holds {}", e_->n, send.size(), recv.size()));
    return collective(Kind::AllGather, send, recv, send.size(), type, ReduceOp::Sum, 0, o);
  }
  Work broadcast(std::span<std::byte> buffer, std::uint32_t root, DType type, CallOptions o) override {
    if (root >= e_->n) return bad("broadcast", str_format("root {} is not a rank of a group of {}", root, e_->n));
    return collective(Kind::Broadcast, buffer, buffer, buffer.size(), type, ReduceOp::Sum, root, o);
  }
  Work reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                      CallOptions o) override {
    if (send.size() != recv.size() * e_->n)
      return bad("reduce_scatter",
                 str_format("send must hold {} × recv's {} bytes, holds {}", e_->n, recv.size(), send.size()));
    if (overlap(send, recv) && recv.data() != send.data() + std::uint64_t{e_->rank} * recv.size())
      return bad("reduce_scatter",
                 "recv overlaps send other than in place (in place is recv == send + rank × recv's length)");
    // On one host through the shared segment; with one rank per host, pairwise between the hosts.
    if (e_->nhosts == 1 || e_->nhosts == e_->n)
      return collective(Kind::ReduceScatter, send, recv, recv.size(), type, op, 0, o);
    // Across hosts with several ranks on some: the whole all_reduce, of which this rank keeps its
    // block.
    auto c = make(Kind::AllReduce, send, {}, send.size(), type, op, 0, o);
    if (!c) return Work::done(std::unexpected(c.error()));
    c->temp.resize(send.size());
    c->recv = c->temp;  // the vector's bytes stay where they are when the call moves
    c->keep = recv;
    c->keep_from = std::uint64_t{e_->rank} * recv.size();
    return e_->start(std::move(*c));
  }
  Work barrier(CallOptions o) override { return collective(Kind::Barrier, {}, {}, 0, DType::U8, ReduceOp::Sum, 0, o); }

  Result<std::span<std::byte>> allocate(std::size_t bytes) override {
    std::lock_guard lock(e_->mutex);
    const std::uint64_t at = (e_->arena_used + 63) & ~std::uint64_t{63};
    if (bytes == 0 || bytes > e_->arena_bytes || at > e_->arena_bytes - bytes)
      return fail(Errc::OutOfMemory, "mesh::Communicator::allocate",
                  str_format("{} bytes do not fit in what is left of this rank's {}-byte arena in group '{}' ({} used; "
                             "NativeOptions::arena_bytes sets its size)",
                             bytes, e_->arena_bytes, e_->group, e_->arena_used));
    e_->arena_used = at + bytes;
    return std::span<std::byte>(e_->arena(e_->me) + at, bytes);
  }

  Work send(std::span<const std::byte> buffer, std::uint32_t peer, std::uint32_t tag, CallOptions o) override {
    if (peer >= e_->n) return bad("send", str_format("peer {} is not a rank of a group of {}", peer, e_->n));
    if (e_->hosts[peer] != e_->my_host)
      return e_->remote ? e_->remote->send(buffer, peer, tag, o) : no_remote("send", peer);
    auto x = std::make_unique<PointToPoint>();
    x->sending = true;
    x->peer = peer;
    x->tag = tag;
    x->out = buffer;
    x->deadline = LazyDeadline(o.timeout);
    return e_->enqueue(std::move(x), false);
  }
  Work recv(std::span<std::byte> buffer, std::uint32_t peer, std::uint32_t tag, CallOptions o) override {
    if (peer >= e_->n) return bad("recv", str_format("peer {} is not a rank of a group of {}", peer, e_->n));
    if (e_->hosts[peer] != e_->my_host)
      return e_->remote ? e_->remote->recv(buffer, peer, tag, o) : no_remote("recv", peer);
    auto x = std::make_unique<PointToPoint>();
    x->peer = peer;
    x->tag = tag;
    x->in = buffer;
    x->deadline = LazyDeadline(o.timeout);
    return e_->enqueue(std::move(x), false);
  }

 private:
  Work no_remote(const char* what, std::uint32_t peer) const {
    return Work::done(fail(Errc::Unreachable, str_format("mesh::{}", what),
                           str_format("rank {} of group '{}' is on another host, and the group was opened without a "
                                      "communicator for point-to-point calls between hosts",
                                      peer, e_->group)));
  }
  static Work bad(const char* what, std::string why) {
    return Work::done(fail(Errc::InvalidArgument, str_format("mesh::{}", what), std::move(why)));
  }

  static Status valid(Kind kind, std::uint64_t unit, DType type, ReduceOp op) {
    if (type > DType::U8 || op > ReduceOp::Average)
      return fail(Errc::InvalidArgument, str_format("mesh::{}", to_string(kind)), "unknown element type or reduce op");
    if ((unit & (size_of(type) - 1)) != 0)  // element sizes are powers of two
      return fail(Errc::InvalidArgument, str_format("mesh::{}", to_string(kind)),
                  str_format("{} bytes are not a whole number of {} elements", unit, to_string(type)));
    return {};
  }

  Result<Collective> make(Kind kind, std::span<const std::byte> send, std::span<std::byte> recv, std::uint64_t unit,
                          DType type, ReduceOp op, std::uint32_t root, const CallOptions& o) {
    LF_TRY_STATUS(valid(kind, unit, type, op));
    return Result<Collective>(std::in_place, kind, send, recv, unit, type, op, root, e_->calls++, o.timeout);
  }

  /// A call that goes straight between the hosts (Engine::start_direct); nullopt: the general path.
  std::optional<Work> direct(Kind kind, std::span<const std::byte> send, std::span<std::byte> recv, std::uint64_t unit,
                             DType type, ReduceOp op, std::uint32_t root, const CallOptions& o) {
    if (unit == 0 || !e_->one_per_host(kind)) return std::nullopt;
    if (Status ok = valid(kind, unit, type, op); !ok) return Work::done(std::unexpected(ok.error()));
    if (e_->widens(kind, type, op)) return std::nullopt;
    return e_->start_direct(kind, send, recv, unit, type, op, root, o);
  }

  Work collective(Kind kind, std::span<const std::byte> send, std::span<std::byte> recv, std::uint64_t unit, DType type,
                  ReduceOp op, std::uint32_t root, const CallOptions& o) {
    if (auto w = direct(kind, send, recv, unit, type, op, root, o)) return std::move(*w);
    auto c = make(kind, send, recv, unit, type, op, root, o);
    if (!c) return Work::done(std::unexpected(c.error()));
    if (unit == 0 && kind != Kind::Barrier) return Work::done({});  // nothing to move, on every rank alike
    return e_->start(std::move(*c));
  }

  std::shared_ptr<Engine> e_;
};

}  // namespace

std::uint64_t name_hash(std::string_view name) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

Result<std::unique_ptr<Communicator>> open_native(NativeOptions o) {
  constexpr const char* call = "mesh::open_native";
  const auto n = static_cast<std::uint32_t>(o.world_ranks.size());
  if (n == 0 || o.hosts.size() != n || o.rank >= n)
    return fail(Errc::InvalidArgument, call,
                str_format("group '{}': {} ranks, {} host entries, rank {}", o.group, n, o.hosts.size(), o.rank));
  if (o.chunk_bytes < 4096 || o.chunk_bytes > (64u << 20) || (o.chunk_bytes & (o.chunk_bytes - 1)) != 0)
    return fail(Errc::InvalidArgument, call,
                str_format("chunk_bytes {} is not a power of two from 4 KiB to 64 MiB", o.chunk_bytes));
  if (o.chunk_bytes / n < 8)
    return fail(Errc::InvalidArgument, call, str_format("{}-byte chunks are too small for {} ranks", o.chunk_bytes, n));
  if (o.key.empty() || o.key.size() > 200 ||
      o.key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                              "0123456789-_.") != std::string::npos)
    return fail(Errc::InvalidArgument, call,
                str_format("key '{}' is not 1 to 200 letters, digits, '-', '_' or '.'", o.key));
  auto e = std::make_shared<Engine>();
  e->group = o.group;
  e->world = o.world_ranks;
  e->hosts = o.hosts;
  e->rank = o.rank;
  e->n = n;
  e->chunk = o.chunk_bytes;
  if (o.arena_bytes % 4096 != 0 || o.arena_bytes > (16ull << 30))
    return fail(Errc::InvalidArgument, call,
                str_format("arena_bytes {} is not a multiple of 4 KiB up to 16 GiB", o.arena_bytes));
  e->arena_bytes = o.arena_bytes;
  e->nhosts = *std::max_element(o.hosts.begin(), o.hosts.end()) + 1;
  e->host_size.assign(e->nhosts, 0);
  e->local_of.assign(n, 0);
  for (std::uint32_t g = 0; g < n; ++g) e->local_of[g] = e->host_size[o.hosts[g]]++;
  for (std::uint32_t h = 0; h < e->nhosts; ++h)
    if (e->host_size[h] == 0)
      return fail(Errc::InvalidArgument, call, str_format("group '{}': host {} has no ranks", o.group, h));
  e->host_base.assign(e->nhosts, 0);
  for (std::uint32_t h = 1; h < e->nhosts; ++h) e->host_base[h] = e->host_base[h - 1] + e->host_size[h - 1];
  e->my_host = o.hosts[o.rank];
  for (std::uint32_t g = 0; g < n; ++g)
    if (o.hosts[g] == e->my_host) e->local.push_back(g);
  e->nlocal = static_cast<std::uint32_t>(e->local.size());
  if (e->nlocal > kMaxLocal)
    return fail(Errc::InvalidArgument, call, str_format("{} ranks on one host (at most {})", e->nlocal, kMaxLocal));
  e->me = e->local_of[o.rank];
  e->leader = e->me == 0;
  if (e->nhosts > 1 && e->leader) {
    if (!o.link || o.link->hosts() != e->nhosts || o.link->host() != e->my_host)
      return fail(Errc::InvalidArgument, call,
                  str_format("group '{}' spans {} hosts: its leaders need a link between them", o.group, e->nhosts));
    e->link = std::move(o.link);
  }
  e->remote = std::move(o.remote);
  // Per host: hosts that share a /dev/shm (containers, simulated hosts) must not share a segment.
  e->shm_name = str_format("/lavaflow-mesh-{}-h{}", o.key, e->my_host);
  LF_TRY_STATUS(attach(*e, o.attach_timeout));
  return std::unique_ptr<Communicator>(std::make_unique<NativeCommunicator>(std::move(e)));
}

}  // namespace lavaflow::mesh
