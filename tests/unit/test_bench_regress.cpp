// SPDX-License-Identifier: MIT
// lavaflow-bench's regression detection (apps/bench/regress.cpp): suites' output normalised into
// rows, run files refused with a reason, and the comparison's verdicts.
#include "regress.hpp"
#include "support.hpp"

using namespace lfbench::regress;
using nlohmann::json;

namespace {

/// A run of one local-suite row (p50 with its quartiles) measured against the cache-line floor.
json local_output(double p25, double p50, double p75, double floor = 100) {
  return json{{"results",
               {{{"name", "floor-cacheline"},
                 {"mode", "poll"},
                 {"size", 4},
                 {"touched", false},
                 {"p25_ns", floor * 0.98},
                 {"p50_ns", floor},
                 {"p75_ns", floor * 1.02}},
                {{"name", "lavaflow-shm"},
                 {"mode", "poll"},
                 {"size", 64},
                 {"touched", false},
                 {"p25_ns", p25},
                 {"p50_ns", p50},
                 {"p75_ns", p75},
                 {"msgs_per_s", 1e7}}}}};
}

Run run_of(const std::vector<json>& reps) {
  auto rows = normalise("local", reps);
  REQUIRE(rows);
  Run r;
  r.rows = *rows;
  return r;
}

const Row& row(const Run& r, std::string_view name, std::string_view metric) {
  for (const auto& x : r.rows)
    if (x.name == name && x.metric == metric) return x;
  FAIL("no row " << name << " " << metric);
  return r.rows.front();
}

Verdict verdict(const Run& base, const Run& now, CompareOptions o = {}) {
  const auto c = compare(base, now, o);
  for (const auto& x : c.rows)
    if (x.now->name == "lavaflow-shm" && x.now->metric == "p50_ns") return x.verdict;
  FAIL("row not compared");
  return Verdict::Skipped;
}

}  // namespace

TEST_CASE("normalise: the local suite's rows, their spread and their ratio to the floor") {
  const auto run = run_of({local_output(190, 200, 210)});
  const auto& shm = row(run, "lavaflow-shm", "p50_ns");
  CHECK(shm.key() == "local lavaflow-shm poll 64 B p50_ns");
  CHECK(shm.better == Better::Lower);
  CHECK(shm.abs.value == 200);
  CHECK(shm.abs.lo == 190);
  CHECK(shm.abs.hi == 210);
  CHECK(shm.baseline == "floor-cacheline");
  REQUIRE(shm.ratio);
  CHECK(shm.ratio->value == Approx(2.0));
  CHECK(shm.ratio->lo == Approx(190 / 102.0));  // interval arithmetic: lowest over highest
  CHECK(shm.ratio->hi == Approx(210 / 98.0));
  CHECK(row(run, "lavaflow-shm", "msgs_per_s").better == Better::Higher);
  CHECK_FALSE(row(run, "floor-cacheline", "p50_ns").ratio);
}

TEST_CASE("normalise: a touched message beyond one cache line is recorded, not held to a latency floor") {
  auto out = local_output(190, 200, 210);
  for (const std::uint64_t size : {std::uint64_t{64}, std::uint64_t{4096}}) {
    json touched = out["results"][1];
    touched["size"] = size;
    touched["touched"] = true;
    touched["p50_ns"] = touched["p25_ns"] = touched["p75_ns"] = 5000.0;
    out["results"].push_back(touched);
  }
  const auto run = run_of({out});
  const Row* small = nullptr;
  const Row* large = nullptr;
  for (const auto& x : run.rows)
    if (x.name == "lavaflow-shm" && x.metric == "p50_ns" && x.variant == "touched") (x.size == 64 ? small : large) = &x;
  REQUIRE(small);
  REQUIRE(large);
  REQUIRE(small->ratio);
  CHECK(small->ratio->value == Approx(50.0));
  CHECK_FALSE(large->ratio);
  CHECK(large->abs.value == 5000);
}

TEST_CASE("normalise: repetitions give the median and the range of their medians") {
  const auto run = run_of({local_output(0, 200, 0, 100), local_output(0, 260, 0, 100), local_output(0, 220, 0, 110)});
  const auto& shm = row(run, "lavaflow-shm", "p50_ns");
  CHECK(shm.samples == 3);
  CHECK(shm.abs.value == 220);
  CHECK(shm.abs.lo == 200);
  CHECK(shm.abs.hi == 260);
  REQUIRE(shm.ratio);  // per repetition: 2.0, 2.6, 2.0
  CHECK(shm.ratio->value == Approx(2.0));
  CHECK(shm.ratio->hi == Approx(2.6));
}

TEST_CASE("normalise: output that is not a suite's is refused, garbage rows are left out") {
  CHECK_FALSE(normalise("nosuch", {json::object()}));
  CHECK_FALSE(normalise("local", {json::array()}));
  CHECK_FALSE(normalise("local", {json{{"results", 3}}}));
  auto rows = normalise("local", {json{{"results", {1, "x", {{"name", "lavaflow-shm"}, {"p50_ns", "fast"}}}}}});
  REQUIRE(rows);
  CHECK(rows->empty());
}

TEST_CASE("compare: identical runs, noise, a small and a large change") {
  const auto base = run_of({local_output(195, 200, 205)});
  CHECK(verdict(base, base) == Verdict::Same);
  // 20 % worse, quartiles apart: a regression.
  CHECK(verdict(base, run_of({local_output(234, 240, 246)})) == Verdict::Regression);
  // 5 % worse: under the threshold.
  CHECK(verdict(base, run_of({local_output(205, 210, 215)})) == Verdict::Same);
  // 20 % worse at the median, but the quartiles overlap: noise.
  CHECK(verdict(run_of({local_output(150, 200, 260)}), run_of({local_output(180, 240, 300)})) == Verdict::Noise);
  // 20 % better.
  CHECK(verdict(base, run_of({local_output(156, 160, 164)})) == Verdict::Better);
}

TEST_CASE("compare: a slower machine is no regression where a row has a same-run baseline") {
  const auto base = run_of({local_output(195, 200, 205, 100)});
  // Everything 50 % slower, the floor included: the ratio holds.
  CHECK(verdict(base, run_of({local_output(292, 300, 308, 150)})) == Verdict::Same);
  // The channel 50 % slower, the floor not: the ratio moves.
  CHECK(verdict(base, run_of({local_output(292, 300, 308, 100)})) == Verdict::Regression);
}

TEST_CASE("compare: higher-is-better metrics regress downwards, ratios-only skips absolute rows") {
  auto base = run_of({local_output(195, 200, 205)});
  auto now = base;
  for (auto& r : now.rows)
    if (r.metric == "msgs_per_s") r.abs = {7e6, 7e6, 7e6};
  auto c = compare(base, now, {});
  CHECK(c.regressions == 1);
  c = compare(base, now, {.ratios_only = true});
  CHECK(c.regressions == 0);
  const auto text = format_comparison(compare(base, now, {}), {});
  CHECK_THAT(text, Catch::Contains("REGRESSION: local lavaflow-shm poll 64 B msgs_per_s"));
}

TEST_CASE("compare: rows on one side only are listed, not failed") {
  const auto base = run_of({local_output(195, 200, 205)});
  auto now = base;
  now.rows.pop_back();
  const auto c = compare(base, now, {});
  CHECK(c.regressions == 0);
  CHECK(c.only_base.size() == 1);
}

TEST_CASE("run files: written and read back, malformed ones refused with the cause") {
  Run run = run_of({local_output(195, 200, 205)});
  run.environment["cpu"] = "test";
  run.suites.push_back({.suite = "local", .status = "ran", .plot = "local.png", .seconds = 1});
  const auto again = parse_run(to_json(run).dump());
  REQUIRE(again);
  CHECK(again->rows.size() == run.rows.size());
  CHECK(again->rows.front().key() == run.rows.front().key());
  CHECK(again->suites.front().plot == "local.png");

  auto refused = [](const std::string& text, const std::string& cause) {
    const auto r = parse_run(text);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error(), Catch::Contains(cause));
  };
  refused("", "empty");
  refused("{\"format\":", "not valid JSON");
  refused("[1,2]", "not a JSON object");
  refused(R"({"format":"x","version":1,"rows":[]})", "not a lavaflow-bench run file");
  auto with_row = [&](const std::string& edit_from, const std::string& edit_to) {
    auto text = to_json(run).dump();
    const auto at = text.find(edit_from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, edit_from.size(), edit_to);
  };
  refused(with_row("\"value\":200.0", "\"value\":\"fast\""), "rows[1].value: not a number");
  refused(with_row("\"value\":200.0", "\"value\":1e999"), "not valid JSON");
  refused(with_row("\"value\":200.0", "\"value\":NaN"), "not valid JSON");
  refused(with_row("\"value\":200.0", "\"value\":-1"), "rows[1].value: negative");
  refused(with_row("\"size\":64", "\"size\":1e30"), "rows[1].size: not a whole number");
  refused(with_row("\"size\":64", "\"size\":-64"), "rows[1].size: not a whole number");
  refused(with_row("\"better\":\"lower\"", "\"better\":\"up\""), "rows[0].better");
  refused(with_row("\"metric\":\"p50_ns\",", ""), "rows[0].metric: missing");
  refused(with_row("\"value\":200.0", "\"value\":300.0"), "lo <= value <= hi");
  refused(with_row("\"plot\":\"local.png\"", "\"plot\":\"../../etc/passwd\""), "not a plain file name");
}
