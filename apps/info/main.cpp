// SPDX-License-Identifier: MIT
// lavaflow-info: this process's location, the Vulkan devices and what they can share, and the
// CPU topology with the CPU allocation strategies available here. `--json` for machines.
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "cli.hpp"
#include "interop.hpp"
#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/lavaflow.hpp"
#include "lavaflow/transports/local.hpp"
#include "pool_report.hpp"

using namespace lavaflow;

namespace {

const char* yes(bool b) { return b ? "yes" : "no"; }

std::string api(std::uint32_t v) {
  return str_format("{}.{}.{}", VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v), VK_API_VERSION_PATCH(v));
}

struct StrategyRow {
  CpuStrategy strategy;
  StrategyChoice choice;
};

std::vector<StrategyRow> strategies(const CpuTopology& topo, const VulkanContext* ctx) {
  std::vector<StrategyRow> rows;
  for (auto s : {CpuStrategy::SharedMemory, CpuStrategy::NumaBound, CpuStrategy::HugePages, CpuStrategy::GpuPinned}) {
    CpuBufferOptions o{.size = 4 << 20, .strategy = s, .gpu = ctx};
    rows.push_back({s, choose_cpu_strategy(topo, o)});
  }
  rows.push_back({CpuStrategy::Auto, choose_cpu_strategy(topo, {.size = 4 << 20})});
  return rows;
}

struct TransportRow {
  std::string name;
  Probe probe;
};

/// Each local transport's own answer to "can a producer here serve a consumer on this host?".
std::vector<TransportRow> transports(const ProcessLocation& me, const VulkanContext* ctx) {
  std::vector<TransportRow> rows;
  for (const auto& t : local_transports())
    rows.push_back({std::string(t->name()), t->can_connect(me, std::nullopt, {ctx})});
  return rows;
}

std::string mib(std::int64_t bytes) { return str_format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

/// --pool: the statistics of every pool that publishes them (PoolOptions::stats_label).
int show_pools(bool json, const std::filesystem::path& directory) {
  const auto dir = directory.empty() ? runtime_directory() : directory;
  const auto read = read_published_pools(dir);
  if (!read) {
    std::fprintf(stderr, "lavaflow-info: %s\n", read.error().message().c_str());
    return 1;
  }
  const auto& pools = *read;
  using Json = nlohmann::ordered_json;
  Json out = {{"directory", dir.string()}, {"pools", Json::array()}};
  if (!json) std::printf("pools publishing their statistics in %s:%s\n", dir.c_str(), pools.empty() ? " none" : "");
  for (const auto& p : pools) {
    auto summary = p.error.empty() ? lfinfo::parse_pool_report(p.report)
                                   : std::expected<lfinfo::PoolSummary, std::string>(std::unexpected(p.error));
    if (json) {
      Json row = {{"pid", p.pid}, {"label", p.label}};
      if (summary)
        row["stats"] = std::move(summary->all);
      else
        row["error"] = summary.error();
      out["pools"].push_back(std::move(row));
      continue;
    }
    if (!summary) {
      std::printf("  pid %d \"%s\": no report (%s)\n", p.pid, p.label.c_str(), summary.error().c_str());
      continue;
    }
    std::printf(
        "  pid %d \"%s\": %s in %lld buffers; reserved %s in %lld segments (peak %s); reuse %.3f; %lld fds; %lld "
        "out-of-memory\n",
        p.pid, p.label.c_str(), mib(summary->allocated_bytes).c_str(), static_cast<long long>(summary->allocations),
        mib(summary->reserved_bytes).c_str(), static_cast<long long>(summary->segments),
        mib(summary->reserved_peak).c_str(), summary->reuse_rate, static_cast<long long>(summary->open_fds),
        static_cast<long long>(summary->num_ooms));
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  CLI::App app{
      "lavaflow-info: this process's location (host, boot id, pid, Vulkan devices), each Vulkan device with\n"
      "its UUIDs and the external memory / semaphore handle types it can export and import, the CPU\n"
      "topology (NUMA nodes, huge pages), which CPU allocation strategies work here, which local\n"
      "channel transports this machine supports, and the interop matrix between the APIs.",
      "lavaflow-info"};
  app.add_flag("--json", json, "print JSON instead of text");
  bool pools = false;
  std::string pool_dir;
  app.add_flag("--pool", pools,
               "only the statistics of the memory pools that running processes of this user publish "
               "(PoolOptions::stats_label)");
  app.add_option("--pool-directory", pool_dir, "where those pools publish (default: the runtime directory)")
      ->needs("--pool");
  if (auto rc = lfapp::parse(app, argc, argv)) return *rc;
  if (pools) return show_pools(json, pool_dir);
  auto devices = enumerate_devices();
  std::vector<DeviceIdentity> ids;
  if (devices)
    for (const auto& d : *devices) ids.push_back(d.identity);
  auto loc = ProcessLocation::current(ids);
  if (!loc) {
    std::fprintf(stderr, "lavaflow-info: %s\n", loc.error().message().c_str());
    return 1;
  }
  const auto topo = CpuTopology::detect();
  auto ctx = VulkanContext::create();
  const auto rows = strategies(topo, ctx ? &*ctx : nullptr);
  const auto trows = transports(*loc, ctx ? &*ctx : nullptr);
  const auto interop = lfinfo::interop_report(devices ? *devices : std::vector<DeviceCapabilities>{});
  std::vector<std::string> acc_notes;
  const auto acc = lfinfo::accelerators(devices ? *devices : std::vector<DeviceCapabilities>{}, acc_notes);

  if (json) {
    using Json = nlohmann::ordered_json;
    Json j;
    j["location"] = {
        {"hostname", loc->host.hostname}, {"boot_id", loc->host.boot_id}, {"pid", loc->pid}, {"uid", loc->uid}};
    j["vulkan_devices"] = Json::array();
    if (devices) {
      for (const auto& d : *devices) {
        j["vulkan_devices"].push_back({
            {"index", d.index},
            {"name", d.identity.name},
            {"type", device_type_name(d.type)},
            {"api_version", api(d.api_version)},
            {"driver", d.driver_name},
            {"driver_info", d.driver_info},
            {"device_uuid", to_string(d.identity.device_uuid)},
            {"driver_uuid", to_string(d.identity.driver_uuid)},
            {"device_local_bytes", d.device_local_bytes},
            {"memory_opaque_fd", {{"export", d.memory_fd_export}, {"import", d.memory_fd_import}}},
            {"memory_host_pointer", {{"import", d.memory_host_import}, {"alignment", d.host_import_alignment}}},
            {"semaphore_opaque_fd",
             {{"export", d.semaphore_fd_export},
              {"import", d.semaphore_fd_import},
              {"timeline", d.timeline_semaphore},
              {"timeline_export", d.timeline_fd_export}}},
            {"fence_opaque_fd", {{"export", d.fence_fd_export}}},
        });
      }
    }
    if (!devices) j["vulkan_error"] = devices.error().message();
    Json cpu = {{"cpus", topo.cpus},
                {"numa_library", topo.numa_library},
                {"numa_nodes", topo.numa_nodes},
                {"huge_page_size", topo.huge_page_size},
                {"huge_pages_total", topo.huge_pages_total},
                {"huge_pages_free", topo.huge_pages_free},
                {"strategies", Json::array()}};
    for (const auto& r : rows)
      cpu["strategies"].push_back({{"strategy", to_string(r.strategy)},
                                   {"available", r.strategy == CpuStrategy::Auto || r.choice.strategy == r.strategy},
                                   {"resolves_to", to_string(r.choice.strategy)},
                                   {"reason", r.choice.reason}});
    j["cpu"] = std::move(cpu);
    j["local_transports"] = Json::array();
    for (const auto& t : trows)
      j["local_transports"].push_back({{"name", t.name}, {"available", t.probe.ok}, {"reason", t.probe.reason}});
    Json report = {{"notes", interop.notes}, {"devices", Json::array()}, {"matrix", Json::array()}};
    for (const auto& d : interop.devices)
      report["devices"].push_back({{"api", d.api}, {"name", d.name}, {"detail", d.detail}});
    for (const auto& m : interop.matrix)
      report["matrix"].push_back({{"exporter", m.exporter},
                                  {"importer", m.importer},
                                  {"memory", m.memory},
                                  {"memory_how", m.memory_how},
                                  {"semaphore", m.semaphore},
                                  {"semaphore_how", m.semaphore_how}});
    j["interop"] = std::move(report);
    Json accs = Json::array();
    for (std::size_t i = 0; i < acc.list().size(); ++i) {
      const auto& a = acc.list()[i];
      Json apis = Json::array();
      for (const auto& d : a.apis)
        apis.push_back({{"api", to_string(d.api)}, {"name", d.name}, {"index", d.index}, {"detail", d.detail}});
      Json shares = Json::array();
      for (std::size_t k = 0; k < acc.list().size(); ++k)
        if (auto how = acc.share(i, k); !how.empty()) shares.push_back({{"with", k}, {"how", how}});
      accs.push_back({{"name", a.name},
                      {"uuid", a.uuid ? to_string(*a.uuid) : ""},
                      {"type", device_type_name(a.type)},
                      {"memory_bytes", a.memory_bytes},
                      {"memory_budget_bytes", a.memory_budget_bytes},
                      {"pci_address", a.pci_address},
                      {"numa_node", a.numa_node},
                      {"apis", apis},
                      {"shares_memory_with", shares}});
    }
    j["accelerators"] = {{"list", accs}, {"notes", acc_notes}};
    std::puts(j.dump().c_str());
    return 0;
  }

  std::printf("lava-flow %s\n\nThis process\n", "0.1.0");
  std::printf("  host      %s\n  boot id   %s\n  pid       %d   uid %u\n", loc->host.hostname.c_str(),
              loc->host.boot_id.c_str(), loc->pid, loc->uid);
  std::printf("\nVulkan devices\n");
  if (!devices)
    std::printf("  none: %s\n", devices.error().message().c_str());
  else if (devices->empty())
    std::printf("  none found\n");
  else
    for (const auto& d : *devices) {
      std::printf("  [%u] %s (%s, Vulkan %s, %s)\n", d.index, d.identity.name.c_str(), device_type_name(d.type).c_str(),
                  api(d.api_version).c_str(), d.driver_name.c_str());
      std::printf("      device UUID %s\n      driver UUID %s\n", to_string(d.identity.device_uuid).c_str(),
                  to_string(d.identity.driver_uuid).c_str());
      std::printf("      memory, opaque fd:    export %-3s import %s\n", yes(d.memory_fd_export),
                  yes(d.memory_fd_import));
      std::printf("      memory, host pointer: import %s (alignment %llu)\n", yes(d.memory_host_import),
                  static_cast<unsigned long long>(d.host_import_alignment));
      std::printf("      semaphore, opaque fd: export %-3s import %-3s timeline %s, timeline export %s\n",
                  yes(d.semaphore_fd_export), yes(d.semaphore_fd_import), yes(d.timeline_semaphore),
                  yes(d.timeline_fd_export));
      std::printf("      fence, opaque fd:     export %s\n", yes(d.fence_fd_export));
      if (auto note = gpu_sharing_note(d); !note.empty()) std::printf("      processes:            %s\n", note.c_str());
    }
  std::printf("\nCPU\n  %d CPUs, %d NUMA node(s)%s, huge pages: %llu of %llu free (%llu KiB each)\n", topo.cpus,
              topo.numa_nodes, topo.numa_library ? "" : " (libnuma unavailable)",
              static_cast<unsigned long long>(topo.huge_pages_free),
              static_cast<unsigned long long>(topo.huge_pages_total),
              static_cast<unsigned long long>(topo.huge_page_size / 1024));
  std::printf("\nCPU allocation strategies (for a 4 MiB buffer)\n");
  for (const auto& r : rows) {
    const bool ok = r.strategy == CpuStrategy::Auto || r.choice.strategy == r.strategy;
    std::printf("  %-14s %-13s %s\n", std::string(to_string(r.strategy)).c_str(),
                r.strategy == CpuStrategy::Auto ? ("-> " + std::string(to_string(r.choice.strategy))).c_str()
                                                : (ok ? "available" : "unavailable"),
                r.choice.reason.c_str());
  }
  std::printf("\nLocal channel transports (preference order)\n");
  for (const auto& t : trows)
    std::printf("  %-8s %-11s %s\n", t.name.c_str(), t.probe.ok ? "available" : "unavailable", t.probe.reason.c_str());
  std::printf("\nCUDA / OpenCL / OpenGL\n");
  for (const auto& d : interop.devices)
    std::printf("  %-7s %s\n          %s\n", d.api.c_str(), d.name.c_str(), d.detail.c_str());
  for (const auto& n : interop.notes) std::printf("  %s\n", n.c_str());
  std::printf("\nAccelerators (every API's devices, matched by UUID)\n");
  for (std::size_t i = 0; i < acc.list().size(); ++i) {
    const auto& a = acc.list()[i];
    std::printf("  [%zu] %s (%s), %llu MiB%s%s%s\n", i, a.name.c_str(), device_type_name(a.type).c_str(),
                static_cast<unsigned long long>(a.memory_bytes >> 20),
                a.memory_budget_bytes ? str_format(", budget {} MiB", a.memory_budget_bytes >> 20).c_str() : "",
                a.pci_address.empty() ? "" : (", PCI " + a.pci_address).c_str(),
                a.numa_node >= 0 ? str_format(", NUMA node {}", a.numa_node).c_str() : "");
    for (const auto& d : a.apis)
      std::printf("      %-7s %s [%u]\n", std::string(to_string(d.api)).c_str(), d.name.c_str(), d.index);
  }
  for (const auto& n : acc_notes) std::printf("  %s\n", n.c_str());
  std::printf("\nInterop matrix (exporter -> importer: memory | semaphores)\n");
  for (const auto& m : interop.matrix)
    std::printf("  %s -> %s\n      memory:     %-3s %s\n      semaphores: %-3s %s\n", m.exporter.c_str(),
                m.importer.c_str(), yes(m.memory), m.memory_how.c_str(), yes(m.semaphore), m.semaphore_how.c_str());
  return 0;
}
