// SPDX-License-Identifier: MIT
// lavaflow-demo — lava-flow's main job.
//   lavaflow-demo [--count N] [--size BYTES] [--transport auto|shm|vulkan]
//       runs a producer here and a consumer process, connected by a channel; verifies every message.
//   lavaflow-demo produce --channel NAME [--count N] [--size BYTES] [--transport …] [--consumers K]
//   lavaflow-demo consume --channel NAME [--count N]
//       the two halves, for two terminals.
//   lavaflow-demo share [--size BYTES]
//       one exportable Vulkan buffer handed to a second process by descriptor + fd.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "payload.hpp"
#if LAVAFLOW_DEMO_MPI
#include "mesh.hpp"
#endif
#include "gpu.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/lavaflow.hpp"
#include "lavaflow/transports/local.hpp"

using namespace lavaflow;
using namespace std::chrono_literals;

namespace {

constexpr int kNoDevice = 77;
// Flag limits: beyond them a value is a typo, not a request.
constexpr std::uint64_t kMaxCount = 1ull << 40;
constexpr std::uint64_t kMaxSeconds = 7ull * 24 * 3600;
constexpr std::uint64_t kMaxMessageBytes = 1ull << 32;
constexpr std::uint32_t kMaxConsumers = 16;
constexpr std::uint32_t kMaxSlots = ProducerOptions::kMaxSlots;
/// user_tag of the end-of-stream message a timed producer (--seconds) sends last; its sequence
/// number is the count of data messages before it, which the consumer checks.
constexpr std::uint64_t kEndOfStream = ~0ull;
constexpr std::uint64_t kMaxLatencySamples = 10'000'000;  // the consumer's latency percentiles use at most these

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::string describe(const VulkanContext& ctx) {
  const auto& c = ctx.capabilities();
  return str_format("{} ({}, driver {}, device UUID {})", c.identity.name, device_type_name(c.type), c.driver_name,
                    to_string(c.identity.device_uuid));
}

std::string human_bytes(double b) {
  if (b >= 1 << 30) return str_format("{:.2f} GiB", b / (1 << 30));
  if (b >= 1 << 20) return str_format("{:.2f} MiB", b / (1 << 20));
  if (b >= 1 << 10) return str_format("{:.2f} KiB", b / (1 << 10));
  return str_format("{:.0f} B", b);
}

/// Every flag of every subcommand (each subcommand reads its own).
struct Options {
  std::string channel;
  std::optional<std::uint64_t> count;    ///< messages; unset: the subcommand's default
  std::optional<std::uint64_t> seconds;  ///< stream for this long
  std::optional<std::uint64_t> size;     ///< bytes per message; unset: the subcommand's default
  std::uint32_t consumers = 1;
  std::uint32_t slots = 0;  ///< 0: the channel's default
  std::uint64_t interval_us = 0;
  std::string verify = "auto";                 ///< where frames are written and verified: auto, gpu or cpu
  std::optional<std::uint64_t> corrupt_frame;  ///< the producer flips one byte of this frame (tests)
  std::uint64_t timeout_s = 30;
  std::optional<TransportKind> transport;
  std::string dir;
  bool progress = true;
  int summary_fd = -1;  ///< run_both's consumer writes its summary line here
};

int die(const std::string& who, const Error& e) {
  std::fprintf(stderr, "[%s] FAILED: %s\n", who.c_str(), e.message().c_str());
  return 1;
}

// ---------------------------------------------------------------------------------------------
// produce / consume

/// Writes message `seq` into the loaned buffer (in place, or through a staging copy when the ring
/// buffer is device-local GPU memory without a host mapping). Returns its checksum.
Result<std::uint64_t> write_message(const Producer& p, const Loan& loan, std::uint64_t seq, std::uint64_t size,
                                    bool corrupt, std::optional<Stager>& stager, std::vector<std::byte>& scratch) {
  // A consumer's GPU may still be reading the slot: the CPU writes only after its release.
  for (const auto& w : loan.gpu_waits())
    if (auto ok = wait_on_host(w, 30s); !ok) return std::unexpected(ok.error());
  if (auto bytes = loan.bytes(); !bytes.empty()) {
    lfapp::fill_message(bytes.first(size), seq);
    const auto sum = lfapp::checksum(bytes.first(size));
    if (corrupt) bytes[size / 2] ^= std::byte{0x5a};  // after the checksum: damage in transit
    return sum;
  }
  if (!stager) {
    LF_TRY(auto s, Stager::create(*p.vulkan(), p.slot_size()));
    stager.emplace(std::move(s));
  }
  scratch.resize(size);
  lfapp::fill_message(scratch, seq);
  const auto sum = lfapp::checksum(scratch);
  if (corrupt) scratch[size / 2] ^= std::byte{0x5a};
  LF_TRY_STATUS(stager->upload(dynamic_cast<GpuBuffer&>(loan.buffer()), scratch));
  return sum;
}

Status check_message(const Consumer& c, const Received& r, std::optional<Stager>& stager,
                     std::vector<std::byte>& scratch) {
  if (auto w = r.gpu_wait())  // written by the producer's GPU: read once that write is done
    if (auto ok = wait_on_host(*w, 30s); !ok) return std::unexpected(ok.error());
  std::span<const std::byte> view = r.bytes();
  if (view.empty() && r.info().size > 0) {
    if (!stager) {
      LF_TRY(auto s, Stager::create(*c.vulkan(), c.slot_size()));
      stager.emplace(std::move(s));
    }
    scratch.resize(r.info().size);
    LF_TRY_STATUS(stager->download(dynamic_cast<GpuBuffer&>(r.buffer()), scratch));
    view = scratch;
  }
  const auto seq = r.info().sequence;
  if (r.info().user_tag == lfdemo::kGpuPatternTag) {  // written on a GPU: every word is the check
    if (auto bad = lfapp::mismatches(view, seq))
      return fail(Errc::Malformed, "verify", str_format("frame {} is corrupt ({} words differ)", seq, bad));
    return {};
  }
  if (!lfapp::matches(view, seq) || lfapp::checksum(view) != r.info().user_tag)
    return fail(Errc::Malformed, "verify", str_format("message {} is corrupt (checksum mismatch)", seq));
  return {};
}

/// What the producer half reports to run_both's summary.
struct ProducerSummary {
  std::string route, reason, ring, writer;
};

int produce(const Options& a, ProducerSummary* summary = nullptr) {
  const std::string& name = a.channel;
  const std::uint64_t count = *a.count, size = *a.size, seconds = *a.seconds, interval = a.interval_us;
  const std::uint32_t consumers = a.consumers;
  const bool gpu_wanted = a.verify != "cpu";
  // Room past each frame for the GPU time its write ended (the consumer's latency figure).
  const std::uint64_t slot_size = gpu_wanted ? lfdemo::stamp_offset(size) + lfdemo::kStampBytes : size;
  ProducerOptions o{.slots = a.slots,
                    .slot_size = slot_size,
                    .timestamps = true,
                    .host_wait_for_gpu_release = !gpu_wanted,
                    .transport = a.transport,
                    .directory = a.dir};
  auto p = Producer::create(name, o);
  if (!p) return die("producer", p.error());
  auto& prod = **p;
  std::printf("[producer pid %d] channel \"%s\": route %s — %s\n", ::getpid(), name.c_str(),
              to_string(prod.route().transport).data(), prod.route().reason.c_str());
  const std::string ring = prod.vulkan()
                               ? str_format("{} x {} in Vulkan memory on {}", prod.slots(), human_bytes(double(size)),
                                            describe(*prod.vulkan()))
                               : str_format("{} x {} in CPU shared memory", prod.slots(), human_bytes(double(size)));
  std::printf("[producer] ring of %s\n", ring.c_str());
  std::string writer = "the CPU";
  std::unique_ptr<lfdemo::GpuWriter> gpu;
  if (gpu_wanted) {
    auto w = lfdemo::make_gpu_writer(prod, a.verify == "auto" ? "gpu" : a.verify);
    if (w) {
      gpu = std::move(*w);
      writer = gpu->description();
    } else if (a.verify != "auto") {
      return die("producer", w.error());
    } else {
      writer += str_format(" (no GPU writer: {})", w.error().message());
    }
  }
  std::printf("[producer] frames written by %s\n", writer.c_str());
  if (summary) *summary = {std::string(to_string(prod.route().transport)), prod.route().reason, ring, writer};
  std::printf("[producer] waiting for %llu consumer(s)…\n", static_cast<unsigned long long>(consumers));
  std::fflush(stdout);
  if (auto ok = prod.wait_for_consumers(static_cast<std::uint32_t>(consumers), 60s); !ok)
    return die("producer", ok.error());

  std::optional<Stager> stager;  // only for device-local rings without a host mapping
  std::vector<std::byte> scratch;
  const bool progress = a.progress;
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::seconds(seconds);
  // --seconds S: stream for S seconds (at most --count messages when that is given too).
  const std::uint64_t limit = count;
  auto last_print = t0;
  std::uint64_t sent = 0;
  for (std::uint64_t seq = 0; seq < limit && (!seconds || Clock::now() < deadline); ++seq, ++sent) {
    auto loan = prod.loan(30s);
    if (!loan) return die("producer", loan.error());
    const bool corrupt = a.corrupt_frame == seq;
    std::uint64_t tag = 0;
    if (gpu) {
      if (auto ok = gpu->write(*loan, seq, size, corrupt ? std::optional(size / 2) : std::nullopt); !ok)
        return die("producer", ok.error());
      tag = lfdemo::kGpuPatternTag;
    }
    if (tag == 0) {
      auto sum = write_message(prod, *loan, seq, size, corrupt, stager, scratch);
      if (!sum) return die("producer", sum.error());
      tag = *sum;
    }
    if (auto pub = prod.publish(std::move(*loan), {.size = size, .user_tag = tag}); !pub)
      return die("producer", pub.error());
    if (interval) std::this_thread::sleep_for(std::chrono::microseconds(interval));
    if (progress && Clock::now() - last_print > 1s) {
      last_print = Clock::now();
      std::printf("[producer] %llu messages sent, %u consumer(s)\n", static_cast<unsigned long long>(seq + 1),
                  prod.consumer_count());
      std::fflush(stdout);
    }
  }
  if (gpu)
    if (auto ok = gpu->finish(60s); !ok) return die("producer", ok.error());
  const double secs = ms_since(t0) / 1000;
  if (seconds) {  // tell the consumers where the stream ends
    auto loan = prod.loan(30s);
    if (!loan) return die("producer", loan.error());
    if (auto pub = prod.publish(std::move(*loan), {.size = 1, .user_tag = kEndOfStream}); !pub)
      return die("producer", pub.error());
  }
  // Let consumers finish with the ring before the producer (and the ring) goes away.
  if (auto ok = prod.flush(60s); !ok) return die("producer", ok.error());
  std::printf("[producer] done: %llu messages of %s in %.3f s — %.0f msg/s, %s/s\n",
              static_cast<unsigned long long>(sent), human_bytes(double(size)).c_str(), secs, double(sent) / secs,
              human_bytes(double(sent) * double(size) / secs).c_str());
  return 0;
}

int consume(const Options& a) {
  const std::string& name = a.channel;
  const std::uint64_t count = *a.count;
  auto c = Consumer::open(name, {.host_wait_for_gpu = a.verify == "cpu",
                                 .connect_timeout = std::chrono::seconds(a.timeout_s),
                                 .directory = a.dir});
  if (!c) return die("consumer", c.error());
  auto& con = **c;
  std::string verifier = "the CPU";
  std::unique_ptr<lfdemo::GpuVerifier> gpu;
  if (a.verify != "cpu") {
    auto v = lfdemo::make_gpu_verifier(con, a.verify == "auto" ? "gpu" : a.verify);
    if (v) {
      gpu = std::move(*v);
      verifier = gpu->description();
    } else if (a.verify != "auto") {
      return die("consumer", v.error());
    } else {
      verifier += str_format(" (no GPU verifier: {})", v.error().message());
    }
  }
  std::printf("[consumer pid %d] channel \"%s\" from producer pid %d: route %s — %s\n", ::getpid(), name.c_str(),
              con.producer_pid(), to_string(con.route().transport).data(), con.route().reason.c_str());
  if (con.vulkan())
    std::printf("[consumer] ring imported into own Vulkan context on %s\n", describe(*con.vulkan()).c_str());
  std::fflush(stdout);
  std::vector<std::uint64_t> latency_ns;
  latency_ns.reserve(std::min<std::uint64_t>(count ? count : 100000, kMaxLatencySamples));
  std::vector<std::byte> scratch;
  std::optional<Stager> stager;
  std::uint64_t expect = 0, bytes = 0;
  // --count 0: until the producer's end-of-stream message (lavaflow-demo produce --seconds S).
  const bool until_end = count == 0;
  const std::uint64_t limit = until_end ? ~0ull : count;
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  const auto t0 = Clock::now();
  auto last_print = t0;
  for (std::uint64_t i = 0; i < limit; ++i) {
    auto r = con.receive(std::chrono::seconds(a.timeout_s));
    if (!r) {
      std::fprintf(stderr, "\n[consumer] FAILED after %llu messages%s: %s\n", static_cast<unsigned long long>(i),
                   until_end ? " (before the end-of-stream message)" : str_format(" of {}", count).c_str(),
                   r.error().message().c_str());
      return 1;
    }
    const auto seq = r->info().sequence;
    if (until_end && r->info().user_tag == kEndOfStream) {
      if (seq != expect) {
        std::fprintf(stderr, "[consumer] FAILED: the stream ended at message %llu but %llu arrived\n",
                     static_cast<unsigned long long>(seq), static_cast<unsigned long long>(expect));
        return 1;
      }
      break;
    }
    if (seq != expect) {
      std::fprintf(stderr, "[consumer] FAILED: message %llu arrived where %llu was expected (%s)\n",
                   static_cast<unsigned long long>(seq), static_cast<unsigned long long>(expect),
                   seq > expect ? "lost" : "duplicated or reordered");
      return 1;
    }
    if (gpu && r->info().user_tag == lfdemo::kGpuPatternTag) {
      if (auto ok = gpu->verify(*r); !ok) return die("consumer", ok.error());
      bytes += r->info().size;
      ++expect;
      continue;
    }
    if (auto ok = check_message(con, *r, stager, scratch); !ok) return die("consumer", ok.error());
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    const auto now = static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
    if (latency_ns.size() < kMaxLatencySamples) latency_ns.push_back(now - r->info().timestamp_ns);
    bytes += r->info().size;
    ++expect;
    if (Clock::now() - last_print > (tty ? 200ms : 1s)) {
      last_print = Clock::now();
      const double s = ms_since(t0) / 1000;
      // One progress line: rewritten in place on a terminal, a line per second in a log.
      std::printf("%s[consumer] %5.1f s  %llu messages verified  %.0f msg/s  %s/s%s", tty ? "\r" : "", s,
                  static_cast<unsigned long long>(i + 1), double(i + 1) / s, human_bytes(double(bytes) / s).c_str(),
                  tty ? "   " : "\n");
      std::fflush(stdout);
    }
  }
  if (tty) std::printf("\n");
  const std::uint64_t received = expect;
  std::sort(latency_ns.begin(), latency_ns.end());
  double p50 = latency_ns.empty() ? 0.0 : double(latency_ns[latency_ns.size() / 2]) / 1000;
  double p99 = latency_ns.empty() ? 0.0 : double(latency_ns[(latency_ns.size() - 1) * 99 / 100]) / 1000;
  std::string latency_what = "publish -> receive";
  if (gpu) {
    auto rep = gpu->finish(60s);
    if (!rep) return die("consumer", rep.error());
    if (rep->wrong_words != 0) {
      std::fprintf(stderr, "[consumer] FAILED: frame %llu is corrupt (%llu words differ in all, checked on %s)\n",
                   static_cast<unsigned long long>(rep->first_bad_frame),
                   static_cast<unsigned long long>(rep->wrong_words), gpu->description().c_str());
      return 1;
    }
    if (rep->frames != 0) {
      p50 = rep->p50_us;
      p99 = rep->p99_us;
      latency_what = rep->latency;
    }
  }
  const double secs = ms_since(t0) / 1000;
  if (a.summary_fd >= 0) {  // for run_both's summary
    const std::string line =
        str_format("{} {} {:.1f} {:.1f} {:.3f} {}; verified by {}|{}\n", received, bytes, p50, p99, secs,
                   con.vulkan() ? describe(*con.vulkan()) : std::string("CPU shared memory (no Vulkan import)"),
                   verifier, latency_what);
    (void)!::write(a.summary_fd, line.data(), line.size());
  }
  std::printf(
      "[consumer] OK: %llu messages, %s, all verified by %s (none lost, duplicated, reordered or corrupt) in %.3f s "
      "— %.0f msg/s, %s/s; %s latency p50 %.1f us, p99 %.1f us\n",
      static_cast<unsigned long long>(received), human_bytes(double(bytes)).c_str(), verifier.c_str(), secs,
      double(received) / secs, human_bytes(double(bytes) / secs).c_str(), latency_what.c_str(), p50, p99);
  return 0;
}

int run_both(const Options& a, const char* self) {
  const std::uint64_t count = *a.count, size = *a.size, seconds = *a.seconds;
  const std::string name = str_format("demo-{}", ::getpid());
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    return 1;
  }
  UniqueFd summary_read(pipe_fds[0]), summary_write(pipe_fds[1]);
  ::fcntl(summary_write.get(), F_SETFD, 0);  // the consumer inherits the write end
  std::vector<std::string> args{self,           "consume",
                                "--channel",    name,
                                "--count",      std::to_string(count),
                                "--verify",     a.verify,
                                "--summary-fd", std::to_string(summary_write.get())};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::printf("lavaflow-demo: a producer (this process) and a consumer process, channel \"%s\", %s of %s messages\n",
              name.c_str(), count ? str_format("{} messages", count).c_str() : str_format("{} s", seconds).c_str(),
              human_bytes(double(size)).c_str());
  std::fflush(stdout);
  pid_t child = -1;
  if (::posix_spawn(&child, self, nullptr, nullptr, argv.data(), environ) != 0) {
    std::perror("posix_spawn");
    return 1;
  }
  summary_write.reset();
  Options p = a;
  p.channel = name;
  if (!count) p.count = ~0ull;  // --seconds alone: as many as fit
  p.progress = false;           // the consumer's progress line speaks for both
  ProducerSummary ps;
  const int prc = produce(p, &ps);
  if (prc != 0) ::kill(child, SIGTERM);  // it would wait for a producer that has given up
  int status = 0;
  ::waitpid(child, &status, 0);
  const int crc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (prc != 0 || crc != 0) {
    std::fprintf(stderr, "lavaflow-demo: FAILED (producer exit %d, consumer exit %d)\n", prc, crc);
    return 1;
  }
  char buf[1024] = {};
  const auto n = ::read(summary_read.get(), buf, sizeof buf - 1);
  unsigned long long frames = 0, bytes = 0;
  double p50 = 0, p99 = 0, secs = 0;
  int used = 0;
  if (n > 0 && std::sscanf(buf, "%llu %llu %lf %lf %lf %n", &frames, &bytes, &p50, &p99, &secs, &used) == 5) {
    std::string consumer_device(buf + used);
    while (!consumer_device.empty() && consumer_device.back() == '\n') consumer_device.pop_back();
    std::string latency_what = "publish -> receive";
    if (auto bar = consumer_device.rfind('|'); bar != std::string::npos) {
      latency_what = consumer_device.substr(bar + 1);
      consumer_device.resize(bar);
    }
    std::printf(
        "\nsummary\n"
        "  route       %s — %s\n"
        "  producer    ring of %s; frames written by %s\n"
        "  consumer    %s\n"
        "  frames      %llu of %s, every byte verified (none lost, duplicated, reordered or corrupt)\n"
        "  throughput  %.0f frames/s, %s/s\n"
        "  latency     %s p50 %.1f us, p99 %.1f us\n",
        ps.route.c_str(), ps.reason.c_str(), ps.ring.c_str(), ps.writer.c_str(), consumer_device.c_str(), frames,
        human_bytes(double(size)).c_str(), double(frames) / secs, human_bytes(double(bytes) / secs).c_str(),
        latency_what.c_str(), p50, p99);
  }
  std::printf("lavaflow-demo: OK\n");
  return 0;
}

std::byte pattern(std::uint64_t i) { return static_cast<std::byte>((i * 2654435761u) >> 13); }

int share_consumer(int sock) {
  auto m = recv_message(sock, 60s);
  if (!m) {
    std::fprintf(stderr, "consumer: %s\n", m.error().message().c_str());
    return 1;
  }
  const auto t0 = Clock::now();
  auto desc = ExportDescriptor::deserialize(m->payload);
  std::string verdict;
  if (!desc || m->fds.size() != 1) {
    verdict = desc ? "expected one fd" : desc.error().message();
  } else if (auto ctx = VulkanContext::create({.device = desc->device_uuid}); !ctx) {
    verdict = ctx.error().message();
  } else {
    std::printf("[consumer pid %d] own Vulkan context on %s\n", ::getpid(), describe(*ctx).c_str());
    auto buf = GpuBuffer::import(*ctx, *desc, std::move(m->fds[0]));
    if (!buf) {
      verdict = buf.error().message();
    } else {
      const double import_ms = ms_since(t0);
      std::vector<std::byte> data(buf->size());
      const auto t1 = Clock::now();
      if (auto s = download(*ctx, *buf, data); !s) verdict = s.error().message();
      for (std::uint64_t i = 0; verdict.empty() && i < data.size(); ++i)
        if (data[i] != pattern(i)) verdict = str_format("byte {} is {:#x}, expected {:#x}", i, data[i], pattern(i));
      if (verdict.empty()) {
        std::printf("[consumer pid %d] imported in %.2f ms, read and verified %llu bytes in %.2f ms\n", ::getpid(),
                    import_ms, static_cast<unsigned long long>(data.size()), ms_since(t1));
        verdict = "ok";
      }
    }
  }
  (void)send_message(sock, std::as_bytes(std::span(verdict)));
  if (verdict != "ok") std::fprintf(stderr, "[consumer] FAILED: %s\n", verdict.c_str());
  return verdict == "ok" ? 0 : 1;
}

int share_producer(int sock, pid_t child, std::uint64_t size) {
  const auto t0 = Clock::now();
  auto ctx = VulkanContext::create();
  if (!ctx) {
    std::fprintf(stderr, "producer: %s\n", ctx.error().message().c_str());
    return kNoDevice;
  }
  std::printf("[producer pid %d] Vulkan context on %s\n", ::getpid(), describe(*ctx).c_str());
  auto buf = GpuBuffer::allocate(*ctx, {.size = size, .memory = GpuMemory::DeviceLocal});
  if (!buf) {
    std::fprintf(stderr, "producer: %s\n", buf.error().message().c_str());
    return 1;
  }
  std::vector<std::byte> data(size);
  for (std::uint64_t i = 0; i < size; ++i) data[i] = pattern(i);
  if (auto s = upload(*ctx, *buf, data); !s) {
    std::fprintf(stderr, "producer: %s\n", s.error().message().c_str());
    return 1;
  }
  auto ex = buf->export_handle();
  if (!ex) {
    std::fprintf(stderr, "producer: %s\n", ex.error().message().c_str());
    return 1;
  }
  std::printf(
      "[producer pid %d] allocated %llu bytes (%s, dedicated, memory type %u), wrote the pattern, exported fd %d\n",
      ::getpid(), static_cast<unsigned long long>(size), std::string(to_string(buf->kind())).c_str(),
      ex->descriptor.memory_type_index, ex->fd.get());
  int fds[] = {ex->fd.get()};
  if (auto s = send_message(sock, ex->descriptor.serialize(), fds); !s) {
    std::fprintf(stderr, "producer: %s\n", s.error().message().c_str());
    return 1;
  }
  ex->fd.reset();  // the consumer holds its own reference now
  std::printf("[producer pid %d] sent descriptor (%zu bytes) + fd over a Unix socket (SCM_RIGHTS) to pid %d\n",
              ::getpid(), ExportDescriptor::kSerializedSize, child);
  auto reply = recv_message(sock, 120s);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!reply) {
    std::fprintf(stderr, "producer: consumer gave no answer: %s\n", reply.error().message().c_str());
    return 1;
  }
  std::string verdict(reinterpret_cast<const char*>(reply->payload.data()), reply->payload.size());
  if (verdict != "ok" || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "FAILED: consumer says: %s\n", verdict.c_str());
    return 1;
  }
  std::printf(
      "OK: consumer verified %llu bytes of the producer's Vulkan memory, zero copies between processes, %.1f ms in "
      "all\n",
      static_cast<unsigned long long>(size), ms_since(t0));
  return 0;
}

/// Forks before either side touches Vulkan: each process builds its own context.
int share(std::uint64_t size) {
  auto pair = socket_pair();
  if (!pair) return die("share", pair.error());
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    pair->first.reset();
    std::_Exit(share_consumer(pair->second.get()));
  }
  pair->second.reset();
  return share_producer(pair->first.get(), pid, size);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "lavaflow-demo: a verified stream of messages between processes over a lava-flow channel.\n"
      "Without a subcommand: this process produces, a consumer process it starts consumes (default 3 s\n"
      "of 1 MiB messages), every byte verified, then a summary. Exit status: 0 success, 1 failure,\n"
      "2 bad usage, 77 no usable Vulkan device (share) or no MPI (mesh).",
      "lavaflow-demo"};
  app.set_help_all_flag("--help-all", "help for every subcommand");
  auto stream_flags = [&](CLI::App& cmd) {
    lfapp::add_whole(cmd, "--count", o.count, "messages to send", 0, kMaxCount);
    lfapp::add_whole(cmd, "--seconds", o.seconds, "stream for this long instead", 0, kMaxSeconds);
    lfapp::add_whole(cmd, "--size", o.size, "bytes per message", 1, kMaxMessageBytes);
  };
  auto transport_flag = [&](CLI::App& cmd) {
    cmd.add_option_function<std::string>(
           "--transport",
           [&](const std::string& t) { o.transport = t == "auto" ? std::nullopt : std::optional(*parse_transport(t)); },
           "auto (routing chooses), shm or vulkan")
        ->check(CLI::IsMember({"auto", "shm", "vulkan"}));
  };
  auto verify_flag = [&](CLI::App& cmd) {
    cmd.add_option("--verify", o.verify,
                   "where frames are written and verified: gpu (GPU-ordered hand-off: CUDA kernels where built, "
                   "else Vulkan compute), cuda, vulkan, cpu, or auto (gpu where it can run)")
        ->check(CLI::IsMember({"auto", "gpu", "cuda", "vulkan", "cpu"}));
  };
  auto corrupt_flag = [&](CLI::App& cmd) {
    lfapp::add_whole(cmd, "--corrupt-frame", o.corrupt_frame, "flip one byte of this frame after writing it", 0,
                     kMaxCount)
        ->group("Testing");  // the consumer must name this frame
  };
  stream_flags(app);
  transport_flag(app);
  verify_flag(app);
  corrupt_flag(app);
  auto* produce_cmd = app.add_subcommand("produce", "the producer half, for a second terminal");
  produce_cmd->add_option("--channel", o.channel, "channel name")->required();
  stream_flags(*produce_cmd);
  transport_flag(*produce_cmd);
  lfapp::add_whole(*produce_cmd, "--consumers", o.consumers, "wait for this many consumers", 1, kMaxConsumers);
  lfapp::add_whole(*produce_cmd, "--slots", o.slots, "ring buffers (0: the channel's default)", 0, kMaxSlots);
  verify_flag(*produce_cmd);
  corrupt_flag(*produce_cmd);
  lfapp::add_whole(*produce_cmd, "--interval-us", o.interval_us, "pause between messages", 0, 60'000'000);
  produce_cmd->add_option("--dir", o.dir, "rendezvous directory (default: the user's runtime directory)");
  auto* consume_cmd = app.add_subcommand("consume", "the consumer half: checks sequence and checksum of every message");
  consume_cmd->add_option("--channel", o.channel, "channel name")->required();
  lfapp::add_whole(*consume_cmd, "--count", o.count, "messages to expect (0: until the producer's end of stream)", 0,
                   kMaxCount);
  lfapp::add_whole(*consume_cmd, "--timeout", o.timeout_s, "seconds to wait for the producer", 0, kMaxSeconds);
  consume_cmd->add_option("--dir", o.dir, "rendezvous directory");
  verify_flag(*consume_cmd);
  consume_cmd->add_option("--summary-fd", o.summary_fd, "write the summary line to this fd")
      ->check(lfapp::whole(0, 1 << 20))
      ->group("");  // internal: run_both's own consumer
  auto* mesh_cmd = app.add_subcommand("mesh", "under mpiexec -n N: every rank to every rank, routed per pair");
  lfapp::add_whole(*mesh_cmd, "--count", o.count, "messages per pair", 1, kMaxCount);
  lfapp::add_whole(*mesh_cmd, "--size", o.size, "bytes per message", 1, kMaxMessageBytes);
  auto* share_cmd =
      app.add_subcommand("share", "one exportable Vulkan buffer handed to a second process by descriptor + fd");
  lfapp::add_whole(*share_cmd, "--size", o.size, "bytes (default 64 MiB)", 1, kMaxMessageBytes);
  app.require_subcommand(0, 1);
  if (auto rc = lfapp::parse(app, argc, argv)) return *rc;

  if (produce_cmd->parsed()) {
    if (!o.count && !o.seconds) o.count = 1000;
    if (!o.count) o.count = ~0ull;  // --seconds alone
    o.seconds = o.seconds.value_or(0);
    o.size = o.size.value_or(1 << 20);
    return produce(o);
  }
  if (consume_cmd->parsed()) {
    o.count = o.count.value_or(1000);
    return consume(o);
  }
  if (mesh_cmd->parsed()) {
#if LAVAFLOW_DEMO_MPI
    return lfdemo::mesh_main(argc, argv, o.count.value_or(1000), o.size.value_or(4096));
#else
    std::fprintf(stderr, "lavaflow-demo mesh: MPI is not built (LAVAFLOW_WITH_MPI)\n");
    return 77;
#endif
  }
  if (share_cmd->parsed()) return share(o.size.value_or(64ull << 20));
  if (!o.count && !o.seconds) o.seconds = 3;
  o.count = o.count.value_or(0);
  o.seconds = o.seconds.value_or(0);
  o.size = o.size.value_or(1 << 20);
  if (!*o.count && !*o.seconds) {
    std::fprintf(stderr, "lavaflow-demo: give --count N or --seconds S (both are 0)\n");
    return 2;
  }
  return run_both(o, "/proc/self/exe");
}
