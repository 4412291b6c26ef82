// SPDX-License-Identifier: MIT
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <span>

#include "checks.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/mpi/mpi.hpp"
#include "lavaflow/transports/local.hpp"
#include "ring.hpp"
#include "wait.hpp"
#include "wire.hpp"

namespace lavaflow::mpi {

using namespace detail;

// ----- Communicator

Communicator::Communicator(Communicator&& o) noexcept
    : comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
      rank_(o.rank_),
      locations_(std::move(o.locations_)),
      job_key_(std::move(o.job_key_)),
      exits_(std::move(o.exits_)) {}
Communicator& Communicator::operator=(Communicator&& o) noexcept {
  std::swap(comm_, o.comm_);
  std::swap(rank_, o.rank_);
  std::swap(locations_, o.locations_);
  std::swap(job_key_, o.job_key_);
  std::swap(exits_, o.exits_);
  return *this;
}
Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Result<Communicator> Communicator::create(MPI_Comm user, CommunicatorOptions o) {
  constexpr const char* call = "mpi::Communicator::create";
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return fail(Errc::Unsupported, call, "MPI_Init has not been called");
  Communicator c;
  LF_TRY_STATUS(check(MPI_Comm_dup(user, &c.comm_), "MPI_Comm_dup"));
  LF_TRY_STATUS(check(MPI_Comm_set_errhandler(c.comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler"));
  // MPICH 4.0.2 reports an error found while completing a request (MPI_Test on a truncated
  // message) through MPI_COMM_WORLD's handler, not the request's communicator: unless the world
  // returns errors too, malformed input from a peer aborts the whole job instead of becoming an
  // error. On by default; CommunicatorOptions::world_errors_return = false leaves it alone.
  if (o.world_errors_return)
    LF_TRY_STATUS(check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler(world)"));
  int size = 0;
  LF_TRY_STATUS(check(MPI_Comm_rank(c.comm_, &c.rank_), "MPI_Comm_rank"));
  LF_TRY_STATUS(check(MPI_Comm_size(c.comm_, &size), "MPI_Comm_size"));

  std::vector<DeviceIdentity> devices;
  if (o.vulkan) {
    devices.push_back(o.vulkan->capabilities().identity);
  } else if (auto all = enumerate_devices()) {
    for (const auto& d : *all) devices.push_back(d.identity);
  }
  ProcessLocation me;
  if (o.host) {
    me = ProcessLocation::current_with(*o.host, devices);
  } else {
    LF_TRY(me, ProcessLocation::current(devices));
  }
  me.mpi_rank = c.rank_;
  const auto mine = me.serialize();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  LF_TRY_STATUS(
      check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, c.comm_), "MPI_Allgather(location sizes)"));
  int total = 0;
  for (int i = 0; i < size; ++i) {
    if (lens[static_cast<std::size_t>(i)] <= 0 || lens[static_cast<std::size_t>(i)] > 1 << 20)
      return fail(Errc::Malformed, call,
                  str_format("rank {} announced a {}-byte location", i, lens[static_cast<std::size_t>(i)]));
    offsets[static_cast<std::size_t>(i)] = total;
    total += lens[static_cast<std::size_t>(i)];
  }
  std::vector<std::byte> all(static_cast<std::size_t>(total));
  LF_TRY_STATUS(
      check(MPI_Allgatherv(mine.data(), len, MPI_BYTE, all.data(), lens.data(), offsets.data(), MPI_BYTE, c.comm_),
            "MPI_Allgatherv(locations)"));
  for (int i = 0; i < size; ++i) {
    auto loc = ProcessLocation::deserialize(
        std::span(all).subspan(static_cast<std::size_t>(offsets[static_cast<std::size_t>(i)]),
                               static_cast<std::size_t>(lens[static_cast<std::size_t>(i)])));
    if (!loc) return std::unexpected(loc.error().within(str_format("{}: location of rank {}", call, i)));
    loc->mpi_rank = i;
    c.locations_.push_back(std::move(*loc));
  }
  c.job_key_ = str_format("mpi{}-{}", c.locations_[0].pid, size);
  LF_TRY_STATUS(c.open_watches());
  return c;
}

namespace {

/// What tells whether a pid seen by another rank is a process this one can watch: the kernel
/// (boot id), the PID namespace (inode of /proc/self/ns/pid) and the process's start time (clock
/// ticks after boot, field 22 of /proc/PID/stat) — the last so that a reused pid is never taken
/// for the rank. Zeroes where this kernel does not say.
struct ProcessKey {
  char boot_id[40] = {};
  std::uint64_t pid_ns = 0, start = 0;
};

std::uint64_t start_time(const std::string& stat_path) {
  std::ifstream f(stat_path);
  std::string line;
  if (!std::getline(f, line)) return 0;
  const auto close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return 0;
  std::size_t at = close + 2;
  for (int field = 3; field < 22 && at < line.size(); ++field) {
    at = line.find(' ', at);
    if (at == std::string::npos) return 0;
    ++at;
  }
  return std::strtoull(line.c_str() + std::min(at, line.size()), nullptr, 10);
}

ProcessKey own_key() {
  ProcessKey k;
  // The real host, not CommunicatorOptions::host (which tests set to simulate hosts).
  if (auto host = HostIdentity::detect())
    std::memcpy(k.boot_id, host->boot_id.data(), std::min(host->boot_id.size(), sizeof k.boot_id - 1));
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) == 0) k.pid_ns = st.st_ino;
  k.start = start_time("/proc/self/stat");
  return k;
}

}  // namespace

Status Communicator::open_watches() {
  const ProcessKey mine = own_key();
  std::vector<ProcessKey> keys(locations_.size());
  LF_TRY_STATUS(check(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, keys.data(), sizeof mine, MPI_BYTE, comm_),
                      "MPI_Allgather(process keys)"));
  exits_.clear();
  exits_.resize(locations_.size());
  for (std::size_t r = 0; r < keys.size(); ++r) {
    const auto& k = keys[r];
    if (static_cast<int>(r) == rank_ || mine.pid_ns == 0 || k.start == 0 || k.pid_ns != mine.pid_ns ||
        std::memcmp(k.boot_id, mine.boot_id, sizeof k.boot_id) != 0)
      continue;
    const std::int32_t pid = locations_[r].pid;
    UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    // Opened, then checked: the start time read after the pidfd exists belongs to that process.
    if (fd && start_time(str_format("/proc/{}/stat", pid)) == k.start) exits_[r] = std::move(fd);
  }
  return {};
}

bool Communicator::watches(int r) const {
  return r >= 0 && r < static_cast<int>(exits_.size()) && exits_[static_cast<std::size_t>(r)].valid();
}

Status Communicator::check_alive(int r) const {
  if (watches(r) && exited(exits_[static_cast<std::size_t>(r)]))
    return fail(Errc::PeerLost, "mpi::Communicator::check_alive",
                str_format("rank {} (pid {}) has exited", r, location(r).pid));
  return {};
}

UniqueFd Communicator::watch(int r) const {
  if (!watches(r)) return {};
  auto d = exits_[static_cast<std::size_t>(r)].dup();
  return d ? std::move(*d) : UniqueFd{};
}

Result<PairRoute> Communicator::route(int from, int to) const {
  if (from < 0 || to < 0 || from >= size() || to >= size() || from == to)
    return fail(Errc::InvalidArgument, "mpi::Communicator::route",
                str_format("pair {} -> {} of {} ranks", from, to, size()));
  // The channel layer's one routing function, over every transport a rank pair can take.
  static const TransportSet all = {vulkan_transport(), shm_transport(), mpi_transport()};
  LF_TRY(auto decision, choose_route(all, location(from), location(to), {}));
  return PairRoute{from, to, decision.transport->kind(), std::move(decision.reason)};
}

std::vector<PairRoute> Communicator::routes() const {
  std::vector<PairRoute> out;
  for (int i = 0; i < size(); ++i)
    for (int j = 0; j < size(); ++j)
      if (i != j) out.push_back(*route(i, j));
  return out;
}

}  // namespace lavaflow::mpi
