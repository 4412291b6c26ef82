// SPDX-License-Identifier: MIT
#include "regress.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <system_error>

namespace lfbench::regress {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr std::string_view kFormat = "lavaflow-bench-run";
constexpr int kVersion = 1;
// A run file of every suite repeated a few times is well under a megabyte; anything this large is
// not one, and is refused before it is parsed.
constexpr std::uintmax_t kMaxFileBytes = 64u << 20;

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string human_size(std::uint64_t n) {
  if (n >= (1u << 20) && n % (1u << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

// ----- reading a suite's own --json output (the bench's child processes) ----------------------

std::string text_of(const json& row, const char* field) {
  const auto it = row.find(field);
  return it != row.end() && it->is_string() ? it->get<std::string>() : std::string{};
}

std::optional<double> number_of(const json& row, const char* field) {
  const auto it = row.find(field);
  if (it == row.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < 0) return std::nullopt;
  return v;
}

std::uint64_t size_of(const json& row, const char* field = "size") {
  const auto it = row.find(field);
  if (it == row.end() || !it->is_number_integer() || (!it->is_number_unsigned() && it->get<std::int64_t>() < 0))
    return 0;
  return it->get<std::uint64_t>();
}

/// The row another row of the same repetition is measured against.
struct BaselineRef {
  std::string name, mode;
  std::optional<std::string> variant;  ///< nullopt: any variant (the baseline signals differently)
  std::uint64_t size = 0;
};

/// One figure of one repetition, before the repetitions are summarised.
struct Sample {
  std::string name, mode, variant, metric;
  std::uint64_t size = 0;
  Better better = Better::Lower;
  Spread spread;
  std::string baseline;               ///< its name, for the row
  std::optional<Spread> inline_base;  ///< the suite printed the baseline's figure in the same row
  std::optional<BaselineRef> ref;     ///< the baseline is a row of its own
};

Spread spread_of(const json& row, double value, const char* p25, const char* p75) {
  // Quartiles that do not bracket the median (absent, zero, garbled) are no spread at all.
  const auto lo = number_of(row, p25), hi = number_of(row, p75);
  return {value, lo && *lo > 0 && *lo <= value ? *lo : value, hi && *hi >= value ? *hi : value};
}

/// Adds a sample of `metric` when the row has it as a finite, non-negative number.
Sample* add(std::vector<Sample>& out, const json& row, const char* metric, Better better, std::string name,
            std::string mode, std::string variant, const char* p25 = nullptr, const char* p75 = nullptr) {
  const auto v = number_of(row, metric);
  if (!v) return nullptr;
  Sample s{.name = std::move(name),
           .mode = std::move(mode),
           .variant = std::move(variant),
           .metric = metric,
           .size = size_of(row),
           .better = better,
           .spread = p25 ? spread_of(row, *v, p25, p75) : Spread{*v, *v, *v}};
  out.push_back(std::move(s));
  return &out.back();
}

// Each suite's rows, its metrics with the direction in which they get worse, and its same-run
// baselines. The suites' --json shapes are documented in README.md (lavaflow-bench sections).

void extract_alloc(const json& r, std::vector<Sample>& out) {
  if (auto* s = add(out, r, "median_us", Better::Lower, text_of(r, "name"), "", "")) {
    s->baseline = text_of(r, "baseline");
    if (auto b = number_of(r, "baseline_median_us"); b && !s->baseline.empty()) s->inline_base = Spread{*b, *b, *b};
  }
}

void extract_local(const json& r, std::vector<Sample>& out) {
  const std::string name = text_of(r, "name"), mode = text_of(r, "mode");
  const auto t = r.find("touched");
  const std::string variant = t != r.end() && t->is_boolean() && t->get<bool>() ? "touched" : "";
  // A message the consumer reads through (touched) costs the traffic of its cache lines between the
  // cores, which beyond one line moves with the machine's memory system (other tenants of a VM
  // shift it several-fold between runs), not with either floor below: such rows are recorded, not
  // compared. The untouched rows of every size hold the channel's own cost to its floor.
  const bool bandwidth_bound = !variant.empty() && size_of(r) > 64;
  if (auto* s = add(out, r, "p50_ns", Better::Lower, name, mode, variant, "p25_ns", "p75_ns");
      s && name.starts_with("lavaflow-") && !bandwidth_bound) {
    // A channel's latency against the hardware's floor for its wait mode: a cache line bouncing
    // between the two cores (poll), a futex wake-up (block).
    const bool block = mode == "block";
    s->ref = BaselineRef{block ? "futex-pingpong" : "floor-cacheline", block ? "block" : "poll", "", 4};
    s->baseline = s->ref->name;
  }
  add(out, r, "msgs_per_s", Better::Higher, name, mode, variant);
}

void extract_pool(const json& r, std::vector<Sample>& out) {
  const std::string name = text_of(r, "name");
  if (name == "pool-churn") {
    add(out, r, "reuse", Better::Higher, name, "", text_of(r, "variant"));
    add(out, r, "fragmentation", Better::Lower, name, "", text_of(r, "variant"));
    return;
  }
  if (auto* s = add(out, r, "p50_ns", Better::Lower, name, "", "", "p25_ns", "p75_ns")) {
    const char* base = name == "pool-host"     ? "malloc"
                       : name == "pool-vulkan" ? "vulkan-alloc-export"
                       : name == "pool-cuda"   ? "cuda-alloc-export"
                                               : nullptr;
    if (base) {
      s->ref = BaselineRef{base, "", "", s->size};
      s->baseline = base;
    }
  }
}

void extract_python(const json& r, std::vector<Sample>& out) {
  const std::string name = text_of(r, "name");
  if (auto* s = add(out, r, "p50_ns", Better::Lower, name, "", "", "p25_ns", "p75_ns"); s && name != "cpp-receive") {
    s->ref = BaselineRef{"cpp-receive", "", "", s->size};
    s->baseline = "cpp-receive";
  }
}

void extract_remote(const json& r, std::vector<Sample>& out) {
  const std::string name = text_of(r, "name"), kind = text_of(r, "kind");
  Sample* s = kind == "latency" ? add(out, r, "p50_ns", Better::Lower, name, "", kind)
                                : add(out, r, "mb_per_s", Better::Higher, name, "", kind);
  if (s && name == "lavaflow-mpi") {  // the channel against raw MPI doing the same
    s->ref = BaselineRef{"mpi-raw", "", kind, s->size};
    s->baseline = "mpi-raw";
  }
}

void extract_collectives(const json& r, std::vector<Sample>& out) {
  const std::string name = text_of(r, "name"), op = text_of(r, "op");
  const std::string variant = text_of(r, "dtype") + " " + std::to_string(size_of(r, "ranks")) + " ranks";
  for (auto [metric, better] : {std::pair{"p50_ns", Better::Lower}, std::pair{"busbw_gbps", Better::Higher}})
    if (auto* s = add(out, r, metric, better, name, op, variant); s && name == "lavaflow") {
      s->ref = BaselineRef{"mpi", op, variant, s->size};
      s->baseline = "mpi";
    }
}

/// GPU-buffer collectives: lava-flow's rows against the same calls staged through host memory.
void extract_device_collectives(const json& r, std::vector<Sample>& out) {
  const std::string name = text_of(r, "name"), op = text_of(r, "op");
  const std::string variant = text_of(r, "dtype") + " " + std::to_string(size_of(r, "ranks")) + " ranks";
  for (auto [metric, better] : {std::pair{"p50_ns", Better::Lower}, std::pair{"busbw_gbps", Better::Higher}})
    if (auto* s = add(out, r, metric, better, name, op, variant); s && name.starts_with("lavaflow")) {
      s->ref = BaselineRef{"staged", op, variant, s->size};
      s->baseline = "staged";
    }
}

void extract_interop(const json& r, std::vector<Sample>& out) {
  const std::string name = text_of(r, "name");
  const auto m = r.find("mps");
  const std::string mps = m != r.end() && m->is_boolean() && m->get<bool>() ? "mps" : "";
  if (name == "copy-kernel") {
    if (auto* s = add(out, r, "imported_gbps", Better::Higher, name, "", mps)) {
      s->baseline = "cudaMalloc";
      if (auto b = number_of(r, "cudamalloc_gbps")) s->inline_base = Spread{*b, *b, *b};
    }
    return;
  }
  const std::string variant = text_of(r, "variant") + (mps.empty() ? "" : " " + mps);
  if (name.starts_with("gpu-stream")) {
    if (auto* s = add(out, r, "gbps", Better::Higher, name, "", variant); s && name == "gpu-stream-lavaflow") {
      s->ref = BaselineRef{"gpu-stream-same-process", "", std::nullopt, s->size};
      s->baseline = s->ref->name;
    }
    return;
  }
  if (auto* s = add(out, r, "p50_ns", Better::Lower, name, "", variant); s && name == "gpu-pingpong-lavaflow") {
    s->ref = BaselineRef{"gpu-pingpong-cuda-ipc", "", std::nullopt, s->size};
    s->baseline = s->ref->name;
  }
}

using Extractor = void (*)(const json&, std::vector<Sample>&);

std::optional<Extractor> extractor(std::string_view suite) {
  if (suite == "alloc") return extract_alloc;
  if (suite == "local") return extract_local;
  if (suite == "pool") return extract_pool;
  if (suite == "python") return extract_python;
  if (suite == "remote") return extract_remote;
  if (suite == "collectives") return extract_collectives;
  if (suite == "device-collectives") return extract_device_collectives;
  if (suite == "interop") return extract_interop;
  return std::nullopt;
}

std::string sample_key(std::string_view suite, const Sample& s) {
  Row r{.suite = std::string(suite), .name = s.name, .mode = s.mode, .variant = s.variant, .metric = s.metric};
  r.size = s.size;
  return r.key();
}

/// value ÷ baseline, its spread by interval arithmetic (lowest over highest, highest over lowest).
std::optional<Spread> divide(const Spread& v, const Spread& b) {
  if (b.value <= 0 || b.lo <= 0) return std::nullopt;
  return Spread{v.value / b.value, v.lo / b.hi, v.hi / b.lo};
}

/// Several repetitions' figures as one: their median, and their range as the noise.
Spread summarise(std::vector<Spread> v) {
  if (v.size() == 1) return v.front();
  std::sort(v.begin(), v.end(), [](const Spread& a, const Spread& b) { return a.value < b.value; });
  const std::size_t n = v.size();
  const double median = n % 2 ? v[n / 2].value : (v[n / 2 - 1].value + v[n / 2].value) / 2;
  return {median, v.front().value, v.back().value};
}

// ----- the run file --------------------------------------------------------------------------

/// Reads a run file's fields, each check naming the field it failed on.
class Reader {
 public:
  std::string error;

  bool fail(const std::string& where, const std::string& what) {
    if (error.empty()) error = where + ": " + what;
    return false;
  }
  bool text(const json& o, const char* field, const std::string& where, std::string& out, bool required = true) {
    const auto it = o.find(field);
    if (it == o.end()) return !required || fail(where + "." + field, "missing");
    if (!it->is_string()) return fail(where + "." + field, "not a string");
    out = it->get<std::string>();
    return true;
  }
  bool number(const json& o, const char* field, const std::string& where, double& out) {
    const auto it = o.find(field);
    if (it == o.end()) return fail(where + "." + field, "missing");
    if (!it->is_number()) return fail(where + "." + field, "not a number");
    out = it->get<double>();
    if (!std::isfinite(out)) return fail(where + "." + field, "not a finite number");
    if (out < 0) return fail(where + "." + field, "negative");
    return true;
  }
  bool whole(const json& o, const char* field, const std::string& where, std::uint64_t& out) {
    const auto it = o.find(field);
    if (it == o.end()) return fail(where + "." + field, "missing");
    if (!it->is_number_unsigned()) return fail(where + "." + field, "not a whole number");
    out = it->get<std::uint64_t>();
    return true;
  }
  bool spread(const json& o, const char* value, const char* lo, const char* hi, const std::string& where, Spread& out) {
    if (!number(o, value, where, out.value) || !number(o, lo, where, out.lo) || !number(o, hi, where, out.hi))
      return false;
    if (!(out.lo <= out.value && out.value <= out.hi))
      return fail(where, std::string(lo) + " <= " + value + " <= " + hi + " does not hold");
    return true;
  }
};

std::optional<Row> read_row(Reader& rd, const json& o, const std::string& where) {
  if (!o.is_object()) return rd.fail(where, "not an object"), std::nullopt;
  Row r;
  std::string better;
  if (!rd.text(o, "suite", where, r.suite) || !rd.text(o, "name", where, r.name) ||
      !rd.text(o, "mode", where, r.mode, false) || !rd.text(o, "variant", where, r.variant, false) ||
      !rd.whole(o, "size", where, r.size) || !rd.text(o, "metric", where, r.metric) ||
      !rd.text(o, "better", where, better) || !rd.spread(o, "value", "lo", "hi", where, r.abs) ||
      !rd.whole(o, "samples", where, r.samples) || !rd.text(o, "baseline", where, r.baseline, false))
    return std::nullopt;
  if (r.suite.empty() || r.name.empty() || r.metric.empty())
    return rd.fail(where, "suite, name and metric must not be empty"), std::nullopt;
  if (better == "lower")
    r.better = Better::Lower;
  else if (better == "higher")
    r.better = Better::Higher;
  else
    return rd.fail(where + ".better", "neither \"lower\" nor \"higher\""), std::nullopt;
  if (o.contains("ratio")) {
    Spread s;
    if (!rd.spread(o, "ratio", "ratio_lo", "ratio_hi", where, s)) return std::nullopt;
    r.ratio = s;
  }
  return r;
}

ojson row_json(const Row& r) {
  ojson j{{"suite", r.suite},
          {"name", r.name},
          {"mode", r.mode},
          {"variant", r.variant},
          {"size", r.size},
          {"metric", r.metric},
          {"better", to_string(r.better)},
          {"value", r.abs.value},
          {"lo", r.abs.lo},
          {"hi", r.abs.hi},
          {"samples", r.samples}};
  if (!r.baseline.empty()) j["baseline"] = r.baseline;
  if (r.ratio) {
    j["ratio"] = r.ratio->value;
    j["ratio_lo"] = r.ratio->lo;
    j["ratio_hi"] = r.ratio->hi;
  }
  return j;
}

}  // namespace

std::string Row::key() const {
  std::string k = suite + " " + name;
  if (!mode.empty()) k += " " + mode;
  if (size != 0) k += " " + human_size(size);  // rows that are not per size (a churn trace)
  if (!variant.empty()) k += " " + variant;
  return k + " " + metric;
}

std::string_view to_string(Better b) { return b == Better::Lower ? "lower" : "higher"; }

std::string_view to_string(Verdict v) {
  switch (v) {
    case Verdict::Same:
      return "same";
    case Verdict::Better:
      return "better";
    case Verdict::Noise:
      return "worse, within noise";
    case Verdict::Regression:
      return "REGRESSION";
    case Verdict::Skipped:
      return "not compared";
  }
  return "?";
}

std::expected<std::vector<Row>, std::string> normalise(std::string_view suite,
                                                       const std::vector<nlohmann::json>& repetitions) {
  const auto extract = extractor(suite);
  if (!extract) return std::unexpected("unknown suite '" + std::string(suite) + "'");
  std::vector<std::string> order;  // keys in the order the first repetition printed them
  std::map<std::string, std::vector<Spread>> values, ratios;
  std::map<std::string, Sample> first;
  for (std::size_t rep = 0; rep < repetitions.size(); ++rep) {
    const auto& doc = repetitions[rep];
    const auto results = doc.is_object() ? doc.find("results") : doc.end();
    if (results == doc.end() || !results->is_array())
      return std::unexpected(std::string(suite) + ": output has no \"results\" array");
    std::vector<Sample> samples;
    for (const auto& r : *results)
      if (r.is_object()) (*extract)(r, samples);
    std::map<std::string, bool> seen;
    for (const auto& s : samples) {
      const std::string key = sample_key(suite, s);
      if (seen[key]) continue;  // a suite printing one figure twice: the first counts
      seen[key] = true;
      if (!first.contains(key)) {
        order.push_back(key);
        first.emplace(key, s);
      }
      values[key].push_back(s.spread);
      std::optional<Spread> base = s.inline_base;
      if (s.ref)
        for (const auto& b : samples)
          if (b.name == s.ref->name && b.mode == s.ref->mode && b.size == s.ref->size && b.metric == s.metric &&
              (!s.ref->variant || b.variant == *s.ref->variant)) {
            base = b.spread;
            break;
          }
      if (base)
        if (auto q = divide(s.spread, *base)) ratios[key].push_back(*q);
    }
  }
  std::vector<Row> rows;
  for (const auto& key : order) {
    const Sample& s = first.at(key);
    Row r{.suite = std::string(suite),
          .name = s.name,
          .mode = s.mode,
          .variant = s.variant,
          .metric = s.metric,
          .size = s.size,
          .better = s.better,
          .abs = summarise(values[key]),
          .samples = values[key].size(),
          .baseline = s.baseline};
    // A ratio missing from some repetitions (its baseline failed there) would summarise fewer
    // repetitions than the value: keep it only where every repetition had it.
    if (const auto it = ratios.find(key); it != ratios.end() && it->second.size() == values[key].size())
      r.ratio = summarise(it->second);
    rows.push_back(std::move(r));
  }
  return rows;
}

std::expected<Run, std::string> parse_run(std::string_view text) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return std::unexpected("empty file");
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return std::unexpected(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return std::unexpected("not a JSON object");
  Reader rd;
  std::string format;
  std::uint64_t version = 0;
  if (!rd.text(j, "format", "run", format) || !rd.whole(j, "version", "run", version)) return std::unexpected(rd.error);
  if (format != kFormat) return std::unexpected("not a lavaflow-bench run file (format is '" + format + "')");
  if (version != kVersion) return std::unexpected("run file version " + std::to_string(version) + ", expected 1");
  Run run;
  if (auto e = j.find("environment"); e != j.end()) {
    if (!e->is_object()) return std::unexpected("run.environment: not an object");
    run.environment = *e;
  }
  if (auto q = j.find("quick"); q != j.end() && q->is_boolean()) run.quick = q->get<bool>();
  if (j.contains("repeats") && !rd.whole(j, "repeats", "run", run.repeats)) return std::unexpected(rd.error);
  if (auto s = j.find("suites"); s != j.end()) {
    if (!s->is_array()) return std::unexpected("run.suites: not an array");
    for (std::size_t i = 0; i < s->size(); ++i) {
      const auto& o = (*s)[i];
      const std::string where = "suites[" + std::to_string(i) + "]";
      if (!o.is_object()) return std::unexpected(where + ": not an object");
      SuiteStatus st;
      if (!rd.text(o, "suite", where, st.suite) || !rd.text(o, "status", where, st.status) ||
          !rd.text(o, "reason", where, st.reason, false) || !rd.text(o, "plot", where, st.plot, false))
        return std::unexpected(rd.error);
      if (o.contains("seconds") && !rd.number(o, "seconds", where, st.seconds)) return std::unexpected(rd.error);
      // A plot is a file beside the run file, never a path elsewhere.
      if (st.plot.find('/') != std::string::npos || st.plot == "." || st.plot == "..")
        return std::unexpected(where + ".plot: not a plain file name");
      run.suites.push_back(std::move(st));
    }
  }
  const auto rows = j.find("rows");
  if (rows == j.end()) return std::unexpected("run.rows: missing");
  if (!rows->is_array()) return std::unexpected("run.rows: not an array");
  std::map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < rows->size(); ++i) {
    const std::string where = "rows[" + std::to_string(i) + "]";
    auto r = read_row(rd, (*rows)[i], where);
    if (!r) return std::unexpected(rd.error);
    const auto [it, fresh] = seen.emplace(r->key(), i);
    if (!fresh)
      return std::unexpected(where + ": same row as rows[" + std::to_string(it->second) + "] (" + r->key() + ")");
    run.rows.push_back(std::move(*r));
  }
  return run;
}

std::filesystem::path run_file(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) ? path / "run.json" : path;
}

std::expected<Run, std::string> load_run(const std::filesystem::path& path) {
  const auto file = run_file(path);
  const std::string name = file.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    return std::unexpected(name + ": " + (std::filesystem::exists(file, ec) ? "not a regular file" : "no such file"));
  if (std::filesystem::file_size(file, ec) > kMaxFileBytes)
    return std::unexpected(name + ": larger than " + std::to_string(kMaxFileBytes >> 20) + " MiB, not a run file");
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::unexpected(name + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::unexpected(name + ": read error");
  auto run = parse_run(text.str());
  if (!run) return std::unexpected(name + ": " + run.error());
  return run;
}

nlohmann::ordered_json to_json(const Run& run) {
  ojson j{{"format", kFormat},      {"version", kVersion},      {"environment", run.environment}, {"quick", run.quick},
          {"repeats", run.repeats}, {"suites", ojson::array()}, {"rows", ojson::array()}};
  for (const auto& s : run.suites) {
    ojson o{{"suite", s.suite}, {"status", s.status}, {"seconds", s.seconds}};
    if (!s.reason.empty()) o["reason"] = s.reason;
    if (!s.plot.empty()) o["plot"] = s.plot;
    j["suites"].push_back(std::move(o));
  }
  for (const auto& r : run.rows) j["rows"].push_back(row_json(r));
  return j;
}

Comparison compare(const Run& base, const Run& now, const CompareOptions& o) {
  Comparison c;
  std::map<std::string, const Row*> by_key;
  for (const auto& r : base.rows) by_key.emplace(r.key(), &r);
  std::map<std::string, bool> matched;
  for (const auto& n : now.rows) {
    const auto key = n.key();
    const auto it = by_key.find(key);
    if (it == by_key.end()) {
      c.only_new.push_back(&n);
      continue;
    }
    matched[key] = true;
    const Row& b = *it->second;
    Compared x{.base = &b, .now = &n, .by_ratio = b.ratio && n.ratio};
    x.b = x.by_ratio ? *b.ratio : b.abs;
    x.n = x.by_ratio ? *n.ratio : n.abs;
    const bool lower = n.better == Better::Lower;
    if (o.ratios_only && !x.by_ratio) {
      x.verdict = Verdict::Skipped;
      x.note = "no same-run baseline";
    } else if (b.better != n.better) {
      x.verdict = Verdict::Skipped;
      x.note = "the two runs disagree on which way is better";
    } else if (x.b.value <= 0 || x.n.value <= 0) {
      x.verdict = x.b.value == x.n.value ? Verdict::Same : Verdict::Skipped;
      if (x.verdict == Verdict::Skipped) x.note = "a zero value has no relative change";
    } else {
      x.worse = lower ? x.n.value / x.b.value - 1 : x.b.value / x.n.value - 1;
      const bool worse_beyond_noise = lower ? x.n.lo > x.b.hi : x.n.hi < x.b.lo;
      const bool better_beyond_noise = lower ? x.n.hi < x.b.lo : x.n.lo > x.b.hi;
      if (x.worse > o.threshold)
        x.verdict = worse_beyond_noise ? Verdict::Regression : Verdict::Noise;
      else if (-x.worse > o.threshold && better_beyond_noise)
        x.verdict = Verdict::Better;
      else
        x.verdict = Verdict::Same;
    }
    c.regressions += x.verdict == Verdict::Regression;
    c.rows.push_back(std::move(x));
  }
  for (const auto& r : base.rows)
    if (!matched.contains(r.key())) c.only_base.push_back(&r);
  return c;
}

std::string format_comparison(const Comparison& c, const CompareOptions& o) {
  std::string out;
  auto show = [](const Compared& x, const Spread& s) {
    return (x.by_ratio ? "x" : "") + num(s.value) + " [" + num(s.lo) + ".." + num(s.hi) + "]";
  };
  std::size_t width = 3;
  for (const auto& x : c.rows) width = std::max(width, x.now->key().size());
  char line[1024];
  std::snprintf(line, sizeof line, "%-*s  %-28s %-28s %8s  %s\n", static_cast<int>(width), "row", "base [spread]",
                "new [spread]", "change", "verdict");
  out += line;
  std::size_t compared = 0, skipped = 0;
  for (const auto& x : c.rows) {
    const bool judged = x.verdict != Verdict::Skipped;
    compared += judged;
    skipped += !judged;
    const std::string change = judged && x.b.value > 0
                                   ? (x.n.value >= x.b.value ? "+" : "") + num(100 * (x.n.value / x.b.value - 1)) + "%"
                                   : "";
    std::string verdict(to_string(x.verdict));
    if (x.verdict == Verdict::Regression || x.verdict == Verdict::Noise)
      verdict += " (" + num(100 * x.worse) + " % worse" + (x.by_ratio ? " vs " + x.now->baseline : "") + ")";
    if (!x.note.empty()) verdict += " (" + x.note + ")";
    std::snprintf(line, sizeof line, "%-*s  %-28s %-28s %8s  %s\n", static_cast<int>(width), x.now->key().c_str(),
                  show(x, x.b).c_str(), show(x, x.n).c_str(), change.c_str(), verdict.c_str());
    out += line;
  }
  for (const auto* r : c.only_base) out += "only in base: " + r->key() + "\n";
  for (const auto* r : c.only_new) out += "only in new:  " + r->key() + "\n";
  for (const auto& x : c.rows)
    if (x.verdict == Verdict::Regression)
      out += "REGRESSION: " + x.now->key() + ": " + num(100 * x.worse) + " % worse" +
             (x.by_ratio ? " relative to " + x.now->baseline : "") + ", beyond both runs' spread\n";
  out += std::to_string(compared) + " rows compared (threshold " + num(100 * o.threshold) + " %, beyond the spread), " +
         std::to_string(c.regressions) + " regressed, " + std::to_string(skipped) + " not compared, " +
         std::to_string(c.only_base.size()) + " only in base, " + std::to_string(c.only_new.size()) + " only in new\n";
  return out;
}

std::string markdown_report(const std::vector<ReportInput>& runs, const std::filesystem::path& out_dir,
                            const std::string& command) {
  auto cell = [](std::string s) {  // a table cell: no '|' or line break of its own
    for (auto& ch : s)
      if (ch == '|' || ch == '\n' || ch == '\r') ch = ch == '|' ? '/' : ' ';
    return s;
  };
  std::string md = "# lavaflow-bench results\n\n<!-- Generated by `" + command +
                   "`: regenerate it rather than editing it. -->\n\n"
                   "Values are medians; the spread is p25..p75 of one run's samples, or the range of repeated "
                   "runs' medians. A ratio is the row over its baseline measured in the same run.\n";
  for (const auto& in : runs) {
    const Run& run = in.run;
    md += "\n## " + cell(in.label) + "\n\n| environment | |\n|---|---|\n";
    for (const auto& [k, v] : run.environment.items())
      md += "| " + cell(k) + " | " + cell(v.is_string() ? v.get<std::string>() : v.dump()) + " |\n";
    md += "| quick | " + std::string(run.quick ? "yes" : "no") + " |\n| repeats | " + std::to_string(run.repeats) +
          " |\n\n| suite | status | seconds | note |\n|---|---|---:|---|\n";
    for (const auto& s : run.suites)
      md += "| " + cell(s.suite) + " | " + cell(s.status) + " | " + num(s.seconds) + " | " + cell(s.reason) + " |\n";
    std::vector<std::string> suites;
    for (const auto& r : run.rows)
      if (std::find(suites.begin(), suites.end(), r.suite) == suites.end()) suites.push_back(r.suite);
    for (const auto& suite : suites) {
      md += "\n### " + cell(suite) + "\n\n";
      for (const auto& s : run.suites) {
        if (s.suite != suite || s.plot.empty()) continue;
        const auto plot = run_file(in.path).parent_path() / s.plot;
        std::error_code ec;
        if (!std::filesystem::exists(plot, ec)) continue;
        const auto rel = std::filesystem::relative(plot, out_dir, ec);
        md += "![" + cell(suite) + "](" + (ec || rel.empty() ? plot : rel).generic_string() + ")\n\n";
      }
      md +=
          "| name | mode | size | variant | metric | better | value | spread | baseline | ratio [spread] |\n"
          "|---|---|---:|---|---|---|---:|---|---|---|\n";
      for (const auto& r : run.rows) {
        if (r.suite != suite) continue;
        md += "| " + cell(r.name) + " | " + cell(r.mode) + " | " + human_size(r.size) + " | " + cell(r.variant) +
              " | " + cell(r.metric) + " | " + std::string(to_string(r.better)) + " | " + num(r.abs.value) + " | " +
              num(r.abs.lo) + ".." + num(r.abs.hi) + " | " + cell(r.baseline) + " | " +
              (r.ratio ? num(r.ratio->value) + " [" + num(r.ratio->lo) + ".." + num(r.ratio->hi) + "]" : "") + " |\n";
      }
    }
  }
  return md;
}

}  // namespace lfbench::regress
