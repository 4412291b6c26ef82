// SPDX-License-Identifier: MIT
#include "lavaflow/mesh_mpi/mesh_mpi.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <random>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/mesh/native.hpp"
#if LAVAFLOW_MESH_GLOO
#include <sys/stat.h>

#include <filesystem>

#include "gloo.hpp"
#endif

namespace lavaflow::mesh {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F16:
    case DType::BF16:
      return MPI_UINT16_T;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
      return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Average:
      return MPI_SUM;
    case ReduceOp::Product:
      return MPI_PROD;
    case ReduceOp::Min:
      return MPI_MIN;
    case ReduceOp::Max:
      return MPI_MAX;
  }
  return MPI_SUM;
}

// Reductions MPI's built-in operations would get wrong: f16 and bf16, which MPI has no types for
// (combined in f32, rounding once per combination), and min/max of floats, where MPI's compare
// drops a NaN that the mesh's rule keeps (NaN wins, as on one host and in the CUDA and Vulkan
// collectives; NCCL's own min/max are NCCL's).
template <DType T, ReduceOp Op>
void combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const std::size_t bytes = static_cast<std::size_t>(*len) * size_of(T);
  const std::span<const std::byte> ins[] = {{static_cast<const std::byte*>(inout), bytes},
                                            {static_cast<const std::byte*>(in), bytes}};
  (void)reduce(ins, {static_cast<std::byte*>(inout), bytes}, T, Op);
}

template <DType T>
MPI_User_function* combine_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::Product:
      return &combine<T, ReduceOp::Product>;
    case ReduceOp::Min:
      return &combine<T, ReduceOp::Min>;
    case ReduceOp::Max:
      return &combine<T, ReduceOp::Max>;
    default:
      return &combine<T, ReduceOp::Sum>;
  }
}

[[gnu::cold, gnu::noinline]] Status failed(int code, const char* call) {
  return std::unexpected(mpi::to_error(code, call));
}
/// Every MPI call of a small exchange goes through here: the success path stays in the caller.
[[gnu::always_inline]] inline Status check(int code, const char* call) {
  if (code == MPI_SUCCESS) [[likely]]
    return {};
  return failed(code, call);
}

/// The MPI operation for `type` and `op` (Average: its sum): MPI's own where it is exact, else
/// one of ours, made once per owner and freed with it.
class Ops {
 public:
  Ops() = default;
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;
  ~Ops() {
    for (auto& op : made_)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  }
  Result<MPI_Op> get(DType type, ReduceOp op) {
    const bool half = type == DType::F16 || type == DType::BF16;
    const bool float_pick = type == DType::F32 && (op == ReduceOp::Min || op == ReduceOp::Max);
    if (!half && !float_pick) return mpi_op(op);
    const ReduceOp base = op == ReduceOp::Average ? ReduceOp::Sum : op;
    MPI_Op& made = made_[(type == DType::F32 ? 0 : type == DType::F16 ? 1 : 2) * 5 + static_cast<int>(base)];
    if (made == MPI_OP_NULL) {
      MPI_User_function* f = type == DType::F32   ? combine_for<DType::F32>(base)
                             : type == DType::F16 ? combine_for<DType::F16>(base)
                                                  : combine_for<DType::BF16>(base);
      LF_TRY_STATUS(check(MPI_Op_create(f, 1, &made), "MPI_Op_create"));
    }
    return made;
  }

 private:
  MPI_Op made_[15] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL,
                      MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL,
                      MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

std::string ranks_text(std::uint32_t group_rank, std::uint32_t world_rank) {
  return str_format("rank {} (world {})", group_rank, world_rank);
}

/// The leaders' exchange of the native backend: one exchange at a time, point to point with up to
/// kDirectHosts hosts (all_reduce by Doubling, then split; all_gather at any size; broadcast and
/// barrier up to kPointToPointMax), else one non-blocking MPI collective, whose schedule costs
/// more per call and pays off only with many hosts or large broadcasts.
class MpiHostLink final : public HostLink {
 public:
  MpiHostLink(MPI_Comm comm, std::uint32_t hosts, std::uint32_t host) : comm_(comm), hosts_(hosts), host_(host) {}
  ~MpiHostLink() override {
    doubling_.abandon();  // their receives write into memory that goes with them
    direct_.abandon();
    if (request_ == MPI_REQUEST_NULL) MPI_Comm_free(&comm_);  // else in flight: left to MPI
  }
  std::uint32_t hosts() const override { return hosts_; }
  std::uint32_t host() const override { return host_; }

  Status start_all_reduce(std::span<std::byte> data, DType type, ReduceOp op) override {
    const auto count = data.size() / size_of(type);
    if (count > INT_MAX) return fail(Errc::InvalidArgument, "MPI_Iallreduce", "more than INT_MAX elements");
    if (data.size() <= kDoublingMax) return doubling_.start(comm_, hosts_, host_, data, data, type, op);
    if (splits(data.size())) return start_split_all_reduce(data, data, type, op);
    LF_TRY(MPI_Op o, op_for(type, op));
    return check(
        MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), mpi_type(type), o, comm_, &request_),
        "MPI_Iallreduce");
  }
  Status start_all_gather(std::span<std::byte> all, std::span<const std::uint64_t> counts,
                          std::span<const std::uint64_t> offsets) override {
    if (gathers_directly(*std::ranges::max_element(counts)))
      return start_gather(all.data(), [&](std::uint32_t h) { return std::pair{offsets[h], counts[h]}; });
    counts_.assign(counts.size(), 0);
    offsets_.assign(offsets.size(), 0);
    for (std::size_t h = 0; h < counts.size(); ++h) {
      if (offsets[h] + counts[h] > INT_MAX)
        return fail(Errc::InvalidArgument, "MPI_Iallgatherv", "blocks beyond INT_MAX bytes");
      counts_[h] = static_cast<int>(counts[h]);
      offsets_[h] = static_cast<int>(offsets[h]);
    }
    return check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.data(), counts_.data(), offsets_.data(),
                                 MPI_BYTE, comm_, &request_),
                 "MPI_Iallgatherv");
  }
  Status start_broadcast(std::span<std::byte> data, std::uint32_t root_host) override {
    if (direct(data.size()))
      return start_direct([&]() -> Status {
        if (host_ != root_host) return direct_.receive(data.data(), data.size(), root_host);
        for (std::uint32_t h = 0; h < hosts_; ++h)
          if (h != host_) LF_TRY_STATUS(direct_.send(data.data(), data.size(), h));
        return {};
      });
    if (data.size() > INT_MAX) return fail(Errc::InvalidArgument, "MPI_Ibcast", "more than INT_MAX bytes");
    return check(
        MPI_Ibcast(data.data(), static_cast<int>(data.size()), MPI_BYTE, static_cast<int>(root_host), comm_, &request_),
        "MPI_Ibcast");
  }
  Status start_barrier() override {
    if (direct(0))  // an empty message from every host to every other
      return start_direct([&]() -> Status {
        for (std::uint32_t h = 0; h < hosts_; ++h)
          if (h != host_) LF_TRY_STATUS(direct_.receive(nullptr, 0, h));
        for (std::uint32_t h = 0; h < hosts_; ++h)
          if (h != host_) LF_TRY_STATUS(direct_.send(nullptr, 0, h));
        return {};
      });
    return check(MPI_Ibarrier(comm_, &request_), "MPI_Ibarrier");
  }
  Status start_direct_all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, DType type,
                                 ReduceOp op) override {
    const auto count = recv.size() / size_of(type);
    if (count > INT_MAX) return fail(Errc::InvalidArgument, "MPI_Iallreduce", "more than INT_MAX elements");
    if (recv.size() <= kDoublingMax) return doubling_.start(comm_, hosts_, host_, send, recv, type, op);
    if (splits(recv.size())) return start_split_all_reduce(send, recv, type, op);
    LF_TRY(MPI_Op o, op_for(type, op));
    const void* s = send.data() == recv.data() ? MPI_IN_PLACE : send.data();
    return check(MPI_Iallreduce(s, recv.data(), static_cast<int>(count), mpi_type(type), o, comm_, &request_),
                 "MPI_Iallreduce");
  }
  Status start_direct_all_gather(std::span<const std::byte> send, std::span<std::byte> recv) override {
    if (gathers_directly(send.size())) {
      // Our own block is copied while the messages are under way (no receive writes there) —
      // unless the input overlaps the output, which receives and that copy write: then it is
      // copied first and the sends read it there.
      std::byte* mine = recv.data() + std::uint64_t{host_} * send.size();
      const bool overlaps =
          mine != send.data() && send.data() < recv.data() + recv.size() && recv.data() < send.data() + send.size();
      if (overlaps) std::memmove(mine, send.data(), send.size());
      const std::byte* from = overlaps ? mine : send.data();
      // A small block's sends go first: the peers' receives of them are what every host waits
      // for, and posting ours first would delay them by a receive's posting. A large one's
      // receives go first, ready for the peers' requests to send (MPI's rendezvous).
      const bool sends_first = send.size() <= kPointToPointMax;
      Status posted = start_direct([&]() -> Status {
        for (int pass = 0; pass < 2; ++pass)
          for (std::uint32_t h = 0; h < hosts_; ++h) {
            if (h == host_) continue;
            if ((pass == 0) == sends_first)
              LF_TRY_STATUS(direct_.send(from, send.size(), h));
            else
              LF_TRY_STATUS(direct_.receive(recv.data() + std::uint64_t{h} * send.size(), send.size(), h));
          }
        return {};
      });
      if (posted && mine != from) std::memcpy(mine, send.data(), send.size());
      return posted;
    }
    if (recv.size() > INT_MAX) return fail(Errc::InvalidArgument, "MPI_Iallgather", "more than INT_MAX bytes");
    const void* s = send.data() == recv.data() + host_ * send.size() ? MPI_IN_PLACE : send.data();
    return check(MPI_Iallgather(s, static_cast<int>(send.size()), MPI_BYTE, recv.data(), static_cast<int>(send.size()),
                                MPI_BYTE, comm_, &request_),
                 "MPI_Iallgather");
  }
  Status start_direct_reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType type,
                                     ReduceOp op) override {
    const std::uint64_t block = recv.size();
    if (block > INT_MAX)
      return fail(Errc::InvalidArgument, "mesh::reduce_scatter", "a block of more than INT_MAX bytes");
    // Pairwise: host h's block goes to h, which combines what it receives with its own. Each
    // host sends and receives (hosts − 1) blocks, as a ring would. A piece of the result is
    // written once that piece of every block has gone, so a result in place (at this host's
    // block of the input, the only overlap the call takes) overwrites only what has gone.
    scatter_.at.resize(hosts_ + 1);
    for (std::uint32_t h = 0; h <= hosts_; ++h) scatter_.at[h] = h * block;
    return start_scatter(send.data(), recv, type, op, false);
  }
  void abandon() override {
    doubling_.abandon();
    direct_.abandon();
    scatter_.active = false;
    // A non-blocking collective cannot be cancelled: MPI frees it with the communicator.
  }
  std::vector<std::uint32_t> silent_hosts() const override {
    if (doubling_.active()) return doubling_.silent();
    if (direct_.active()) return direct_.silent();
    return {};  // inside MPI's collective: it does not say whom it waits for
  }
  Result<bool> test() override {
    if (doubling_.active()) {
      auto r = doubling_.advance();
      if (!r) doubling_.abandon();
      return r;
    }
    if (direct_.active()) {
      auto r = direct_.test();
      if (r && *r && scatter_.active) r = next_scatter_step();
      if (!r) {
        direct_.abandon();
        scatter_.active = false;
      }
      return r;
    }
    int flag = 0;
    LF_TRY_STATUS(check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test"));
    return flag != 0;
  }

 private:
  /// Whether a receive has completed, without completing it (MPI_Testall leaves every request as
  /// it was unless all have).
  static bool arrived(MPI_Request request) {
    int flag = 0;
    MPI_Request_get_status(request, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  }

  /// Up to this many bytes an all_reduce goes by recursive doubling (log2(hosts) steps of the whole
  /// vector, the fewest steps); past it, split among the hosts (two steps of a block each).
  static constexpr std::size_t kDoublingMax = 32u << 10;
  /// A reduce-scatter's piece of each block: what a host combines while it is in the cache.
  static constexpr std::uint64_t kScatterPiece = 1u << 20;
  /// Up to this many bytes a broadcast or a barrier goes point to point (Direct).
  static constexpr std::size_t kPointToPointMax = 32u << 10;

  /// An all_reduce by recursive doubling over MPI_Isend/MPI_Irecv: log2 of the hosts exchanges,
  /// each combined by the mesh's own reduction. With a host count that is not a power of two, the
  /// first 2·extra hosts pair up first (the even one hands its data to the odd one and gets the
  /// result back at the end). Every op here is commutative, and each pair combines the same two values, so
  /// every host ends with the same bits: both partners apply the op with the lower virtual rank's
  /// data first (MIN and MAX pick between ±0 and among NaNs by order). The first step sends from
  /// `send` and receives straight into `data` (no copy of the caller's input); later steps work in
  /// `data`.
  class Doubling {
   public:
    Status start(MPI_Comm comm, std::uint32_t hosts, std::uint32_t host, std::span<const std::byte> send,
                 std::span<std::byte> data, DType type, ReduceOp op) {
      auto ok = begin(comm, hosts, host, send, data, type, op);
      if (!ok) abandon();
      return ok;
    }
    [[nodiscard]] bool active() const { return active_; }

    /// Ends an exchange that will not finish (an error, or its link going away): the receive is
    /// cancelled, the send let go.
    void abandon() {
      if (!active_) return;
      if (requests_[0] != MPI_REQUEST_NULL) {
        MPI_Cancel(&requests_[0]);
        MPI_Wait(&requests_[0], MPI_STATUS_IGNORE);
      }
      if (requests_[1] != MPI_REQUEST_NULL) MPI_Request_free(&requests_[1]);
      active_ = false;
    }

    /// The host whose message this step still waits for (none between steps).
    [[nodiscard]] std::vector<std::uint32_t> silent() const {
      if (active_ && requests_[0] != MPI_REQUEST_NULL && !arrived(requests_[0])) return {from_};
      return {};
    }

    /// true once this host holds the result.
    Result<bool> advance() {
      int done = 0;
      LF_TRY_STATUS(check(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE), "MPI_Testall(all_reduce)"));
      if (!done) return false;
      if (combine_) LF_TRY_STATUS(combine());
      first_ = data_.data();
      return next();
    }

   private:
    Status begin(MPI_Comm comm, std::uint32_t hosts, std::uint32_t host, std::span<const std::byte> send,
                 std::span<std::byte> data, DType type, ReduceOp op) {
      comm_ = comm;
      first_ = send.data();
      data_ = data;
      type_ = type;
      op_ = op == ReduceOp::Average ? ReduceOp::Sum : op;  // the caller divides
      incoming_.resize(data.size());
      std::uint32_t pow2 = 1;
      while (pow2 * 2 <= hosts) pow2 *= 2;
      extra_ = hosts - pow2;
      pow2_ = pow2;
      host_ = host;
      // Virtual rank among the pow2 hosts that double; -1 for the even host of a first pair.
      vrank_ = host < 2 * extra_ ? (host % 2 == 1 ? static_cast<int>(host / 2) : -1) : static_cast<int>(host - extra_);
      active_ = true;
      if (host < 2 * extra_) {
        stage_ = Stage::Pair;
        if (host % 2 == 0) return post(static_cast<int>(host + 1), true, false);  // send, then wait for the result
        return post(static_cast<int>(host - 1), false, true, false);              // the even host's data is first
      }
      return begin_doubling();
    }

    /// This step's result into data_: lower op higher, by the mesh's own reduction (a call of
    /// MPI_Reduce_local costs more than combining a few elements). Ours is first_ (the caller's
    /// input on the first step, which is only read); theirs came into data_ on the first step of a
    /// caller with separate buffers, else into incoming_.
    Status combine() {
      const std::span<const std::byte> mine(first_, data_.size());
      const std::span<const std::byte> theirs(first_ != data_.data() ? data_.data() : incoming_.data(), data_.size());
      const std::span<const std::byte> ins[] = {mine_lower_ ? mine : theirs, mine_lower_ ? theirs : mine};
      return reduce(ins, data_, type_, op_);
    }

    Result<bool> next() {
      switch (stage_) {
        case Stage::Pair:
          if (vrank_ < 0) {  // even host of a pair: sent; now the result comes back
            stage_ = Stage::Result;
            from_ = host_ + 1;
            LF_TRY_STATUS(check(MPI_Irecv(data_.data(), static_cast<int>(data_.size()), MPI_BYTE,
                                          static_cast<int>(host_ + 1), kTag, comm_, &requests_[0]),
                                "MPI_Irecv(all_reduce)"));
            requests_[1] = MPI_REQUEST_NULL;
            combine_ = false;
            return false;
          }
          LF_TRY_STATUS(begin_doubling());
          return finished();
        case Stage::Doubling:
          mask_ <<= 1;
          if (mask_ < pow2_) {
            LF_TRY_STATUS(exchange());
            return false;
          }
          if (host_ < 2 * extra_) {  // odd host of a pair: the result goes back to the even one
            stage_ = Stage::Result;
            LF_TRY_STATUS(post(static_cast<int>(host_ - 1), true, false));
            return false;
          }
          active_ = false;
          return true;
        case Stage::Result:
          active_ = false;
          return true;
      }
      return true;
    }

    enum class Stage { Pair, Doubling, Result };
    static constexpr int kTag = 7;

    Result<bool> finished() {
      if (stage_ == Stage::Doubling) return false;
      active_ = false;
      return true;
    }
    Status begin_doubling() {
      stage_ = Stage::Doubling;
      mask_ = 1;
      if (pow2_ == 1) {  // one host doubling alone: nothing to exchange
        stage_ = Stage::Result;
        requests_[0] = requests_[1] = MPI_REQUEST_NULL;
        combine_ = false;
        if (host_ < 2 * extra_) return post(static_cast<int>(host_ - 1), true, false);
        return {};
      }
      return exchange();
    }
    /// This round's partner: the host whose virtual rank differs in bit `mask_`.
    Status exchange() {
      const int partner_v = vrank_ ^ static_cast<int>(mask_);
      const int partner =
          partner_v < static_cast<int>(extra_) ? partner_v * 2 + 1 : partner_v + static_cast<int>(extra_);
      return post(partner, true, true, vrank_ < partner_v);
    }
    /// Sends this step's data (the caller's input on the first step) and receives the peer's: on
    /// the first step straight into data_, after that into incoming_.
    Status post(int peer, bool send, bool receive, bool mine_lower = false) {
      requests_[0] = requests_[1] = MPI_REQUEST_NULL;
      combine_ = receive;
      mine_lower_ = mine_lower;
      std::byte* into = first_ != data_.data() ? data_.data() : incoming_.data();
      if (receive) {
        from_ = static_cast<std::uint32_t>(peer);
        LF_TRY_STATUS(check(MPI_Irecv(into, static_cast<int>(data_.size()), MPI_BYTE, peer, kTag, comm_, &requests_[0]),
                            "MPI_Irecv(all_reduce)"));
      }
      if (send)
        LF_TRY_STATUS(
            check(MPI_Isend(first_, static_cast<int>(data_.size()), MPI_BYTE, peer, kTag, comm_, &requests_[1]),
                  "MPI_Isend(all_reduce)"));
      return {};
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    const std::byte* first_ = nullptr;  // what the next send sends: the caller's input, then data_
    std::span<std::byte> data_;
    std::vector<std::byte> incoming_;
    DType type_ = DType::U8;
    ReduceOp op_ = ReduceOp::Sum;
    std::uint32_t pow2_ = 1, extra_ = 0, host_ = 0, mask_ = 1;
    std::uint32_t from_ = 0;  // the host of the receive in flight
    int vrank_ = 0;
    Stage stage_ = Stage::Doubling;
    MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    bool combine_ = false, mine_lower_ = false, active_ = false;
  };

  /// Exchanges posted all at once, point to point: every message of the call in one step,
  /// whatever the host count (all_gather, broadcast, barrier, reduce_scatter). MPI's non-blocking
  /// collectives cost several times a small message's latency per call; past a few hosts or a
  /// few tens of KiB their algorithms are worth that.
  class Direct {
   public:
    void begin(MPI_Comm comm) {
      comm_ = comm;
      requests_.clear();
      from_.clear();
      reduce_ = false;
      active_ = true;
    }
    [[nodiscard]] bool active() const { return active_; }
    Status receive(std::byte* into, std::uint64_t bytes, std::uint32_t peer) {
      requests_.push_back(MPI_REQUEST_NULL);
      from_.push_back(peer);
      return check(
          MPI_Irecv(into, static_cast<int>(bytes), MPI_BYTE, static_cast<int>(peer), kTag, comm_, &requests_.back()),
          "MPI_Irecv");
    }
    Status send(const std::byte* from, std::uint64_t bytes, std::uint32_t peer) {
      requests_.push_back(MPI_REQUEST_NULL);
      from_.push_back(kSent);
      return check(
          MPI_Isend(from, static_cast<int>(bytes), MPI_BYTE, static_cast<int>(peer), kTag, comm_, &requests_.back()),
          "MPI_Isend");
    }
    /// Once every message is in: `out` = the reduction of every host's block in host order, ours
    /// (`mine`, host `self`) among the `hosts − 1` received ones. Average divides here, by the
    /// host count, with f16 and bf16 still in f32 (with one rank per host, hosts are the ranks).
    void reduce_into(std::span<const std::byte> mine, std::span<std::byte> out, std::uint32_t hosts, std::uint32_t self,
                     DType type, ReduceOp op) {
      mine_ = mine;
      out_ = out;
      type_ = type;
      op_ = op;
      hosts_ = hosts;
      self_ = self;
      incoming_.resize(out.size() * (hosts - 1));
      reduce_ = true;
    }
    [[nodiscard]] std::byte* incoming(std::uint32_t i) { return incoming_.data() + i * out_.size(); }
    /// The hosts whose messages have not arrived.
    [[nodiscard]] std::vector<std::uint32_t> silent() const {
      std::vector<std::uint32_t> hosts;
      for (std::size_t i = 0; i < requests_.size(); ++i)
        if (from_[i] != kSent && requests_[i] != MPI_REQUEST_NULL && !arrived(requests_[i])) hosts.push_back(from_[i]);
      return hosts;
    }

    Result<bool> test() {
      int done = 0;
      LF_TRY_STATUS(check(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE),
                          "MPI_Testall"));
      if (!done) return false;
      active_ = false;
      if (reduce_) {
        // Written only now: until the sends are done, `out` may be what one of them reads. Our
        // block is read where it is unless `out` overlaps it without being it.
        std::span<const std::byte> mine = mine_;
        if (out_.data() != mine_.data() && out_.data() < mine_.data() + mine_.size() &&
            mine_.data() < out_.data() + out_.size()) {
          std::memmove(out_.data(), mine_.data(), out_.size());
          mine = out_;
        }
        ins_.clear();
        for (std::uint32_t h = 0, i = 0; h < hosts_; ++h)
          ins_.push_back(h == self_ ? mine : std::span<const std::byte>(incoming(i++), out_.size()));
        LF_TRY_STATUS(reduce(ins_, out_, type_, op_));
      }
      return true;
    }
    /// Ends an exchange that will not finish: receives cancelled, sends let go.
    void abandon() {
      for (std::size_t i = 0; i < requests_.size(); ++i) {
        if (requests_[i] == MPI_REQUEST_NULL) continue;
        if (from_[i] != kSent) {
          MPI_Cancel(&requests_[i]);
          MPI_Wait(&requests_[i], MPI_STATUS_IGNORE);
        } else {
          MPI_Request_free(&requests_[i]);
        }
      }
      requests_.clear();
      active_ = false;
    }

   private:
    static constexpr int kTag = 8;
    MPI_Comm comm_ = MPI_COMM_NULL;
    std::vector<MPI_Request> requests_;
    static constexpr std::uint32_t kSent = ~0u;
    std::vector<std::uint32_t> from_;  // by request: the host a receive is from, or kSent
    bool active_ = false, reduce_ = false;
    std::span<const std::byte> mine_;
    std::span<std::byte> out_;
    std::vector<std::byte> incoming_;
    std::vector<std::span<const std::byte>> ins_;
    std::uint32_t hosts_ = 0, self_ = 0;
    DType type_ = DType::U8;
    ReduceOp op_ = ReduceOp::Sum;
  };

  /// Whether an all_reduce of `bytes` (past kDoublingMax) is split among the hosts (see
  /// start_split_all_reduce) rather than left to MPI_Iallreduce.
  [[nodiscard]] bool splits(std::uint64_t bytes) const {
    return hosts_ > 1 && hosts_ <= kDirectHosts && bytes / hosts_ < INT_MAX - 64;
  }

  /// A large all_reduce in two Direct steps over blocks of whole elements, one per host: every
  /// host sends block h of its input to host h, which combines the hosts' blocks in host order
  /// into its block of the result (a reduce-scatter); then every host sends its combined block to
  /// every other, straight into their results (an all-gather). Each host sends and receives
  /// 2(hosts − 1)/hosts of the vector, as MPI's reduce-scatter + all-gather does, but with no copy
  /// of the input into the result first and the combination written once, where it ends.
  Status start_split_all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op) {
    const std::uint64_t es = size_of(type), count = recv.size() / es;
    scatter_.at.resize(hosts_ + 1);
    for (std::uint32_t h = 0; h <= hosts_; ++h) scatter_.at[h] = count * h / hosts_ * es;
    const std::uint64_t at = scatter_.at[host_];
    // Average is the caller's to divide (as in Doubling): the blocks are summed here.
    return start_scatter(send.data(), recv.subspan(at, scatter_.at[host_ + 1] - at), type,
                         op == ReduceOp::Average ? ReduceOp::Sum : op, true, recv.data());
  }

  /// A pairwise reduce-scatter: host h combines block h (from scatter_.at[h] to scatter_.at[h +
  /// 1] in every host's `send`) into its `out`. It goes in pieces of kScatterPiece bytes of each
  /// block, one exchange each, so that what arrives is combined while it is still in the cache
  /// and the link holds only a piece from each host. `gather_into`: the split all_reduce's result,
  /// whose blocks go round once the last piece is combined.
  Status start_scatter(const std::byte* send, std::span<std::byte> out, DType type, ReduceOp op, bool then_gather,
                       std::byte* gather_into = nullptr) {
    auto& s = scatter_;
    s.send = send;
    s.out = out;
    s.type = type;
    s.op = op;
    s.then_gather = then_gather;
    s.gather_into = gather_into;
    s.step = 0;
    s.steps = 1;
    for (std::uint32_t h = 0; h < hosts_; ++h)
      s.steps = std::max(s.steps, (s.at[h + 1] - s.at[h] + kScatterPiece - 1) / kScatterPiece);
    s.active = true;
    Status posted = post_scatter_piece();
    if (!posted) s.active = false;
    return posted;
  }
  /// Posts piece `scatter_.step` of every block: ours from every other host, theirs to them.
  Status post_scatter_piece() {
    const auto& s = scatter_;
    const std::uint64_t from = s.step * kScatterPiece;
    auto piece_of = [&](std::uint32_t h) {
      const std::uint64_t length = s.at[h + 1] - s.at[h];
      return from < length ? std::min(kScatterPiece, length - from) : 0;
    };
    const std::uint64_t mine = piece_of(host_);
    return start_direct([&]() -> Status {
      if (mine > 0) {
        direct_.reduce_into({s.send + s.at[host_] + from, mine}, s.out.subspan(from, mine), hosts_, host_, s.type,
                            s.op);
        for (std::uint32_t h = 0, i = 0; h < hosts_; ++h)
          if (h != host_) LF_TRY_STATUS(direct_.receive(direct_.incoming(i++), mine, h));
      }
      for (std::uint32_t h = 0; h < hosts_; ++h)
        if (const std::uint64_t theirs = piece_of(h); h != host_ && theirs > 0)
          LF_TRY_STATUS(direct_.send(s.send + s.at[h] + from, theirs, h));
      return {};
    });
  }
  /// After an exchange of the scatter ended: its next piece, or the split all_reduce's all-gather
  /// step, or the end (true).
  Result<bool> next_scatter_step() {
    auto& s = scatter_;
    if (++s.step < s.steps) {
      LF_TRY_STATUS(post_scatter_piece());
      return false;
    }
    s.active = false;
    if (!s.then_gather) return true;
    // This host's combined block to every other host, theirs into the result.
    Status gathering = start_gather(s.gather_into, [&](std::uint32_t h) {
      return std::pair{s.at[h], s.at[h + 1] - s.at[h]};
    });
    if (!gathering) return std::unexpected(gathering.error());
    return false;
  }

  /// Begins a Direct all-gather in `all`, whose block h is `block(h)` ({offset, length}): this
  /// host's block to every other host, theirs into place.
  template <class Block>
  Status start_gather(std::byte* all, Block&& block) {
    return start_direct([&]() -> Status {
      for (std::uint32_t h = 0; h < hosts_; ++h)
        if (h != host_) {
          const auto [at, length] = block(h);
          LF_TRY_STATUS(direct_.receive(all + at, length, h));
        }
      const auto [at, length] = block(host_);
      for (std::uint32_t h = 0; h < hosts_; ++h)
        if (h != host_) LF_TRY_STATUS(direct_.send(all + at, length, h));
      return {};
    });
  }

  /// Begins a Direct exchange whose messages `post` posts; one that fails leaves none posted.
  template <class Post>
  Status start_direct(Post&& post) {
    direct_.begin(comm_);
    Status ok = post();
    if (!ok) direct_.abandon();
    return ok;
  }

  /// Whether an exchange of `bytes` in all goes point to point (Direct).
  [[nodiscard]] bool direct(std::uint64_t bytes) const { return hosts_ <= kDirectHosts && bytes <= kPointToPointMax; }
  static constexpr std::uint32_t kDirectHosts = 16;
  /// Whether an all_gather whose largest block is `block` bytes goes point to point, at any size:
  /// each host sends its block to every other and receives theirs, as many bytes as a ring moves,
  /// straight between the callers' buffers and in one step.
  [[nodiscard]] bool gathers_directly(std::uint64_t block) const { return hosts_ <= kDirectHosts && block <= INT_MAX; }

  Result<MPI_Op> op_for(DType type, ReduceOp op) { return ops_.get(type, op); }
  MPI_Comm comm_;
  std::uint32_t hosts_, host_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  Doubling doubling_;
  Direct direct_;
  /// A reduce-scatter in flight (start_scatter): where each host's block begins in every input
  /// (and where the last ends), the input, this host's block of the result, the piece in flight
  /// and how many there are, and the split all_reduce's result when the scatter is its first step.
  struct Scatter {
    std::vector<std::uint64_t> at;
    const std::byte* send = nullptr;
    std::span<std::byte> out;
    DType type = DType::U8;
    ReduceOp op = ReduceOp::Sum;
    std::uint64_t step = 0, steps = 0;
    bool then_gather = false, active = false;
    std::byte* gather_into = nullptr;
  } scatter_;
  std::vector<int> counts_, offsets_;
  Ops ops_;
};

/// One MPI backend call in flight: its request, and what happens once it has ended.
struct MpiCall {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<float> in, out;  // f16/bf16 in f32
  std::function<Status(const MPI_Status&)> after;
  Deadline deadline{kForever};
  std::string what;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string group, std::vector<std::uint32_t> world, const mpi::Communicator& job)
      : comm_(comm), group_(std::move(group)), world_(std::move(world)), job_(&job) {
    int r = 0, n = 0;
    MPI_Comm_rank(comm_, &r);
    MPI_Comm_size(comm_, &n);
    rank_ = static_cast<std::uint32_t>(r);
    size_ = static_cast<std::uint32_t>(n);
  }
  ~MpiCommunicator() override {
    // A call that never ended (a timeout) keeps its request: MPI frees the communicator after it.
    MPI_Comm_free(&comm_);
  }
  const std::string& group() const override { return group_; }
  std::uint32_t rank() const override { return rank_; }
  std::uint32_t size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }

  Work all_reduce(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                  CallOptions o) override {
    if (send.size() != recv.size())
      return bad("all_reduce", str_format("send holds {} bytes, recv {}", send.size(), recv.size()));
    auto counted = elements("all_reduce", send.size(), type);
    if (!counted) return Work::done(std::unexpected(counted.error()));
    const std::size_t count = *counted;
    // f16 and bf16 travel widened to f32.
    auto mop = ops_.get(type == DType::F16 || type == DType::BF16 ? DType::F32 : type, op);
    if (!mop) return Work::done(std::unexpected(mop.error()));
    auto c = call("all_reduce", o);
    const std::uint32_t n = size_;
    if (type == DType::F16 || type == DType::BF16) {
      // Accumulated in f32, rounded once at the end, as the other backends do.
      c->in = widen(send, type);
      c->out.resize(count);
      auto* raw = c.get();
      c->after = [raw, recv, type, op, n](const MPI_Status&) -> Status {
        narrow(raw->out, recv, type, op == ReduceOp::Average ? static_cast<float>(n) : 1.0f);
        return {};
      };
      return post(
          c, MPI_Iallreduce(c->in.data(), c->out.data(), static_cast<int>(count), MPI_FLOAT, *mop, comm_, &c->request));
    }
    c->after = [recv, type, op, n](const MPI_Status&) -> Status {
      return op == ReduceOp::Average ? divide(recv, type, n) : Status{};
    };
    const void* s = send.data() == recv.data() ? MPI_IN_PLACE : send.data();
    return post(c, MPI_Iallreduce(s, recv.data(), static_cast<int>(count), mpi_type(type), *mop, comm_, &c->request));
  }

  Work all_gather(std::span<const std::byte> send, std::span<std::byte> recv, DType type, CallOptions o) override {
    if (recv.size() != send.size() * size_)
      return bad("all_gather", str_format("recv must hold {} × {} bytes, holds {}", size_, send.size(), recv.size()));
    auto counted = elements("all_gather", recv.size(), type);
    if (!counted) return Work::done(std::unexpected(counted.error()));
    auto c = call("all_gather", o);
    const void* s = send.data() == recv.data() + rank_ * send.size() ? MPI_IN_PLACE : send.data();
    return post(c, MPI_Iallgather(s, static_cast<int>(send.size()), MPI_BYTE, recv.data(),
                                  static_cast<int>(send.size()), MPI_BYTE, comm_, &c->request));
  }

  Work broadcast(std::span<std::byte> buffer, std::uint32_t root, DType type, CallOptions o) override {
    if (root >= size_) return bad("broadcast", str_format("root {} is not a rank of a group of {}", root, size_));
    auto counted = elements("broadcast", buffer.size(), type);
    if (!counted) return Work::done(std::unexpected(counted.error()));
    auto c = call("broadcast", o);
    return post(c, MPI_Ibcast(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, static_cast<int>(root), comm_,
                              &c->request));
  }

  Work reduce_scatter(std::span<const std::byte> send, std::span<std::byte> recv, DType type, ReduceOp op,
                      CallOptions o) override {
    if (send.size() != recv.size() * size_)
      return bad("reduce_scatter",
                 str_format("send must hold {} × recv's {} bytes, holds {}", size_, recv.size(), send.size()));
    auto counted = elements("reduce_scatter", send.size(), type);
    if (!counted) return Work::done(std::unexpected(counted.error()));
    auto mop = ops_.get(type == DType::F16 || type == DType::BF16 ? DType::F32 : type, op);
    if (!mop) return Work::done(std::unexpected(mop.error()));
    auto c = call("reduce_scatter", o);
    const std::uint32_t n = size_;
    const std::size_t block = recv.size() / size_of(type);
    if (type == DType::F16 || type == DType::BF16) {
      c->in = widen(send, type);
      c->out.resize(block);
      auto* raw = c.get();
      c->after = [raw, recv, type, op, n](const MPI_Status&) -> Status {
        narrow(raw->out, recv, type, op == ReduceOp::Average ? static_cast<float>(n) : 1.0f);
        return {};
      };
      return post(c, MPI_Ireduce_scatter_block(c->in.data(), c->out.data(), static_cast<int>(block), MPI_FLOAT, *mop,
                                               comm_, &c->request));
    }
    c->after = [recv, type, op, n](const MPI_Status&) -> Status {
      return op == ReduceOp::Average ? divide(recv, type, n) : Status{};
    };
    return post(c, MPI_Ireduce_scatter_block(send.data(), recv.data(), static_cast<int>(block), mpi_type(type), *mop,
                                             comm_, &c->request));
  }

  Work barrier(CallOptions o) override {
    auto c = call("barrier", o);
    return post(c, MPI_Ibarrier(comm_, &c->request));
  }

  Work send(std::span<const std::byte> buffer, std::uint32_t peer, std::uint32_t tag, CallOptions o) override {
    if (peer >= size_) return bad("send", str_format("peer {} is not a rank of a group of {}", peer, size_));
    if (buffer.size() > INT_MAX || tag > 32767)
      return bad("send",
                 str_format("{} bytes with tag {} (at most INT_MAX bytes, tags up to 32767)", buffer.size(), tag));
    auto c = call("send", o, peer);
    return post(c, MPI_Isend(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, static_cast<int>(peer),
                             static_cast<int>(tag), comm_, &c->request));
  }

  Work recv(std::span<std::byte> buffer, std::uint32_t peer, std::uint32_t tag, CallOptions o) override {
    if (peer >= size_) return bad("recv", str_format("peer {} is not a rank of a group of {}", peer, size_));
    if (buffer.size() > INT_MAX || tag > 32767)
      return bad("recv",
                 str_format("{} bytes with tag {} (at most INT_MAX bytes, tags up to 32767)", buffer.size(), tag));
    auto c = call("recv", o, peer);
    c->after = [buffer, peer, world = world_[peer]](const MPI_Status& st) -> Status {
      int got = 0;
      MPI_Get_count(&st, MPI_BYTE, &got);
      if (static_cast<std::size_t>(got) != buffer.size())
        return fail(Errc::InvalidArgument, "mesh::recv",
                    str_format("{} sent {} bytes into a {}-byte buffer", ranks_text(peer, world), got, buffer.size()));
      return {};
    };
    return post(c, MPI_Irecv(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, static_cast<int>(peer),
                             static_cast<int>(tag), comm_, &c->request));
  }

 private:
  static Work bad(const char* what, std::string why) {
    return Work::done(fail(Errc::InvalidArgument, str_format("mesh::{}", what), std::move(why)));
  }
  static Result<std::size_t> elements(const char* what, std::size_t bytes, DType type) {
    if (bytes % size_of(type) != 0)
      return fail(Errc::InvalidArgument, str_format("mesh::{}", what),
                  str_format("{} bytes are not a whole number of {} elements", bytes, to_string(type)));
    if (bytes > INT_MAX)
      return fail(Errc::InvalidArgument, str_format("mesh::{}", what),
                  str_format("{} bytes: the MPI backend takes at most INT_MAX bytes per call", bytes));
    return bytes / size_of(type);
  }

  std::shared_ptr<MpiCall> call(const char* what, const CallOptions& o,
                                std::optional<std::uint32_t> peer = std::nullopt) {
    auto c = std::make_shared<MpiCall>();
    c->deadline = Deadline(o.timeout);
    c->what = peer ? str_format("{} with {}", what, ranks_text(*peer, world_[*peer]))
                   : str_format("{} (call #{})", what, calls_++);
    return c;
  }

  Work post(const std::shared_ptr<MpiCall>& c, int code) {
    if (code != MPI_SUCCESS) return Work::done(std::unexpected(mpi::to_error(code, c->what)));
    auto state = std::make_shared<Work::State>();
    std::weak_ptr<Work::State> weak = state;
    state->progress = [c, weak, job = job_, world = world_, group = group_, polls = std::uint64_t{0}]() mutable {
      auto s = weak.lock();
      if (!s || s->result) return;
      int flag = 0;
      MPI_Status st{};
      if (const int tested = MPI_Test(&c->request, &flag, &st); tested != MPI_SUCCESS)
        return s->finish(std::unexpected(mpi::to_error(tested, str_format("mesh::{}", c->what))));
      if (flag) return s->finish(c->after ? c->after(st) : Status{});
      if ((++polls & 1023) == 0) {
        std::string lost;
        for (std::uint32_t r = 0; r < world.size(); ++r)
          if (auto alive = job->check_alive(static_cast<int>(world[r])); !alive)
            lost += str_format("{}{} ({})", lost.empty() ? "" : "; ", ranks_text(r, world[r]), alive.error().cause());
        if (!lost.empty())
          return s->finish(
              fail(Errc::PeerLost, str_format("mesh::{}", c->what), str_format("group '{}' lost {}", group, lost)));
      }
      if (c->deadline.passed())
        s->finish(fail(Errc::Timeout, str_format("mesh::{}", c->what),
                       str_format("group '{}' did not end the call in time; the MPI backend cannot tell which rank "
                                  "is missing (the native backend can)",
                                  group)));
    };
    return Work(std::move(state));
  }

  MPI_Comm comm_;
  std::string group_;
  std::vector<std::uint32_t> world_;
  const mpi::Communicator* job_;
  std::uint32_t rank_ = 0, size_ = 0;
  std::uint64_t calls_ = 0;
  Ops ops_;
};

#if LAVAFLOW_MESH_GLOO
/// Gloo meets through files: group rank 0 makes a private directory, every rank connects, and the
/// directory goes once all have (nothing stays behind in the temporary directory).
Result<std::unique_ptr<Communicator>> open_gloo_group(const mpi::Communicator& job, const MpiGroupOptions& options,
                                                      const ProcessGroup& group, std::uint32_t me, MPI_Comm comm) {
  std::uint64_t nonce = 0;
  std::filesystem::path dir;
  int made = 1;
  if (me == 0) {
    nonce = (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    dir = std::filesystem::temp_directory_path() / str_format("lavaflow-gloo-{}-{:x}", job.job_key(), nonce);
    made = ::mkdir(dir.c_str(), 0700) == 0 ? 1 : 0;
  }
  MPI_Bcast(&nonce, 1, MPI_UINT64_T, 0, comm);
  MPI_Bcast(&made, 1, MPI_INT, 0, comm);
  dir = std::filesystem::temp_directory_path() / str_format("lavaflow-gloo-{}-{:x}", job.job_key(), nonce);
  if (!made) {
    MPI_Comm_free(&comm);
    return fail(
        Errc::System, "mesh::mpi_communicators",
        str_format("group '{}': rank 0 could not create the Gloo rendezvous directory {}", group.name, dir.string()));
  }
  bool one_host = true;
  for (std::uint32_t r : group.ranks)
    one_host = one_host && job.location(static_cast<int>(r)).host == job.location(job.rank()).host;
  MPI_Comm p2p = MPI_COMM_NULL;
  MPI_Comm_dup(comm, &p2p);
  MPI_Comm_set_errhandler(p2p, MPI_ERRORS_RETURN);
  auto c =
      detail::open_gloo({group.name, dir.string(), me, static_cast<std::uint32_t>(group.ranks.size()), one_host,
                         options.open_timeout, std::make_unique<MpiCommunicator>(p2p, group.name, group.ranks, job)});
  MPI_Barrier(comm);
  if (me == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  MPI_Comm_free(&comm);
  return c;
}
#endif

Result<std::unique_ptr<Communicator>> open_group(const mpi::Communicator& job, const MpiGroupOptions& options,
                                                 const ProcessGroup& group, std::uint32_t world_rank) {
  constexpr const char* call = "mesh::mpi_communicators";
  if (group.backend != Backend::Native && group.backend != Backend::Mpi &&
      (group.backend != Backend::Gloo || !LAVAFLOW_MESH_GLOO))
    return fail(Errc::Unsupported, call,
                str_format("group '{}' asks for the {} backend; this build opens {} groups in an MPI job", group.name,
                           to_string(group.backend), LAVAFLOW_MESH_GLOO ? "native, mpi and gloo" : "native and mpi"));
  if (world_rank != static_cast<std::uint32_t>(job.rank()))
    return fail(Errc::InvalidArgument, call, str_format("rank {} opened a group for rank {}", job.rank(), world_rank));
  std::vector<int> members;
  std::optional<std::uint32_t> me;
  for (std::uint32_t r : group.ranks) {
    if (r >= static_cast<std::uint32_t>(job.size()))
      return fail(Errc::InvalidArgument, call,
                  str_format("group '{}' names rank {} of a job of {}", group.name, r, job.size()));
    if (r == world_rank) me = static_cast<std::uint32_t>(members.size());
    members.push_back(static_cast<int>(r));
  }
  if (!me) return fail(Errc::InvalidArgument, call, str_format("rank {} is not in group '{}'", world_rank, group.name));

  MPI_Group world_group = MPI_GROUP_NULL, sub = MPI_GROUP_NULL;
  LF_TRY_STATUS(check(MPI_Comm_group(job.comm(), &world_group), "MPI_Comm_group"));
  const int code = MPI_Group_incl(world_group, static_cast<int>(members.size()), members.data(), &sub);
  MPI_Group_free(&world_group);
  LF_TRY_STATUS(check(code, "MPI_Group_incl"));
  MPI_Comm comm = MPI_COMM_NULL;
  const int made = MPI_Comm_create_group(job.comm(), sub, static_cast<int>(name_hash(group.name) % 32768), &comm);
  MPI_Group_free(&sub);
  LF_TRY_STATUS(check(made, "MPI_Comm_create_group"));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (group.backend == Backend::Mpi) return std::make_unique<MpiCommunicator>(comm, group.name, group.ranks, job);
#if LAVAFLOW_MESH_GLOO
  if (group.backend == Backend::Gloo) return open_gloo_group(job, options, group, *me, comm);
#endif

  // Native: hosts by first appearance in the group; a nonce from group rank 0 keeps the segment's
  // name apart from any other opening of a group of the same name.
  NativeOptions o;
  o.group = group.name;
  o.world_ranks = group.ranks;
  o.rank = *me;
  o.chunk_bytes = options.chunk_bytes;
  o.arena_bytes = options.arena_bytes;
  o.attach_timeout = options.open_timeout;
  std::vector<HostIdentity> seen;
  for (std::uint32_t r : group.ranks) {
    const HostIdentity& h = job.location(static_cast<int>(r)).host;
    auto at = std::find(seen.begin(), seen.end(), h);
    if (at == seen.end()) at = seen.insert(seen.end(), h);
    o.hosts.push_back(static_cast<std::uint32_t>(at - seen.begin()));
  }
  std::uint64_t nonce = 0;
  if (*me == 0) nonce = (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  if (auto ok = check(MPI_Bcast(&nonce, 1, MPI_UINT64_T, 0, comm), "MPI_Bcast"); !ok) {
    MPI_Comm_free(&comm);
    return std::unexpected(ok.error());
  }
  o.key = str_format("{}-{:x}-{:x}", job.job_key(), name_hash(group.name), nonce);
  const auto nhosts = static_cast<std::uint32_t>(seen.size());
  if (nhosts > 1) {
    const std::uint32_t host = o.hosts[*me];
    const bool leader = std::find(o.hosts.begin(), o.hosts.end(), host) - o.hosts.begin() == *me;
    MPI_Comm leaders = MPI_COMM_NULL;
    if (auto ok =
            check(MPI_Comm_split(comm, leader ? 0 : MPI_UNDEFINED, static_cast<int>(host), &leaders), "MPI_Comm_split");
        !ok) {
      MPI_Comm_free(&comm);
      return std::unexpected(ok.error());
    }
    if (leader) {
      MPI_Comm_set_errhandler(leaders, MPI_ERRORS_RETURN);
      o.link = std::make_unique<MpiHostLink>(leaders, nhosts, host);
    }
    o.remote = std::make_unique<MpiCommunicator>(comm, group.name, group.ranks, job);
  } else {
    MPI_Comm_free(&comm);
  }
  return open_native(std::move(o));
}

}  // namespace

Result<DeviceMesh> mesh_from_mpi(const mpi::Communicator& comm, Backend backend) {
  std::vector<RankInfo> ranks;
  for (int r = 0; r < comm.size(); ++r) {
    RankInfo info;
    info.host = comm.location(r).host.hostname;
    for (const auto& d : comm.location(r).devices) info.devices.push_back({d.name, 0});
    ranks.push_back(std::move(info));
  }
  return DeviceMesh::create(static_cast<std::uint32_t>(comm.rank()), std::move(ranks), backend);
}

std::vector<Backend> mpi_backends() {
  if (LAVAFLOW_MESH_GLOO) return {Backend::Native, Backend::Mpi, Backend::Gloo};
  return {Backend::Native, Backend::Mpi};
}

CommunicatorFactory mpi_communicators(const mpi::Communicator& comm, MpiGroupOptions options) {
  return [&comm, options](const ProcessGroup& group, std::uint32_t world_rank) {
    return open_group(comm, options, group, world_rank);
  };
}

}  // namespace lavaflow::mesh
