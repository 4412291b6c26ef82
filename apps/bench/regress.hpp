// SPDX-License-Identifier: MIT
#pragma once
// Benchmark regression detection for `lavaflow-bench run | compare | report`: one row schema for
// every suite, the run file that holds those rows and the machine they were measured on, the
// comparison of two runs, and the Markdown report. Depends on nlohmann-json and the standard
// library only, so the unit tests and the fuzz target build it without the rest of the bench.
#include <cstdint>
#include <expected>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lfbench::regress {

/// Which way a metric gets worse, declared with the metric where a suite's output is normalised:
/// latencies and times are worse higher, throughputs, bandwidths and reuse worse lower.
enum class Better { Lower, Higher };

/// A central value and the interval around it that holds the measurement's noise: p25..p75 of the
/// samples of one run, or the lowest and highest of several repeated runs' medians.
struct Spread {
  double value = 0, lo = 0, hi = 0;
};

/// One measured figure: its identity (suite, name, mode, size, variant, metric), its value and
/// spread, and where the suite measured a baseline in the same run, the ratio to it.
struct Row {
  std::string suite, name, mode, variant, metric;
  std::uint64_t size = 0;
  Better better = Better::Lower;
  Spread abs;
  std::uint64_t samples = 0;    ///< repetitions behind `abs` (1: the spread is the suite's own p25..p75)
  std::string baseline;         ///< the same-run baseline's name ("" when none)
  std::optional<Spread> ratio;  ///< this row ÷ its baseline, worse in the same direction as the metric

  /// "suite name mode size variant metric", the key rows are matched by.
  [[nodiscard]] std::string key() const;
};

struct SuiteStatus {
  std::string suite;
  std::string status;  ///< ran | skipped | failed
  std::string reason;  ///< why skipped or failed
  std::string plot;    ///< file name of its plot beside the run file ("" when none)
  double seconds = 0;
};

/// What `lavaflow-bench run` writes to DIR/run.json (each suite's own output goes to DIR/raw/).
struct Run {
  nlohmann::ordered_json environment = nlohmann::ordered_json::object();  ///< name → text
  bool quick = false;
  std::uint64_t repeats = 1;
  std::vector<SuiteStatus> suites;
  std::vector<Row> rows;
};

/// Parses a run file's text. The error says what is wrong and where (file name not included).
[[nodiscard]] std::expected<Run, std::string> parse_run(std::string_view text);
/// Reads and parses `path` (a run file, or a directory holding run.json); the error names the file.
[[nodiscard]] std::expected<Run, std::string> load_run(const std::filesystem::path& path);
/// The file `load_run` reads for `path`.
[[nodiscard]] std::filesystem::path run_file(const std::filesystem::path& path);
[[nodiscard]] nlohmann::ordered_json to_json(const Run& run);

/// Turns one suite's `--json` output, one document per repetition, into rows. Repeated: each
/// row's value is the median of the repetitions and its spread their range; a ratio is taken
/// within each repetition, then summarised the same way. Once: the suite's own p25..p75 where it
/// records them, and a ratio's spread by interval arithmetic on both spreads.
[[nodiscard]] std::expected<std::vector<Row>, std::string> normalise(std::string_view suite,
                                                                     const std::vector<nlohmann::json>& repetitions);

struct CompareOptions {
  double threshold = 0.10;   ///< a fraction: 0.10 fails a row more than 10 % worse
  bool ratios_only = false;  ///< skip rows without a same-run baseline (absolute figures move with the machine)
};

enum class Verdict { Same, Better, Noise, Regression, Skipped };

struct Compared {
  const Row* base = nullptr;
  const Row* now = nullptr;
  bool by_ratio = false;
  Spread b, n;       ///< what was compared: ratios or values
  double worse = 0;  ///< how much worse `now` is, as a fraction (negative: better)
  Verdict verdict = Verdict::Same;
  std::string note;
};

struct Comparison {
  std::vector<Compared> rows;
  std::vector<const Row*> only_base, only_new;
  std::size_t regressions = 0;
};

/// Matches rows by key and judges each. A row regresses only when both hold:
///  - it is worse than the base by more than the threshold (median against median), and
///  - the shift is beyond the noise: the two spreads do not overlap (lower is better: new lo >
///    base hi; higher is better: new hi < base lo).
/// A row whose spreads overlap is "noise" however far the medians moved. Where both sides carry a
/// ratio to a same-run baseline the ratio is compared, so that a slower machine is not a regression.
[[nodiscard]] Comparison compare(const Run& base, const Run& now, const CompareOptions& options);

/// The comparison as a text table, then the rows found on one side only, then a summary line.
[[nodiscard]] std::string format_comparison(const Comparison& c, const CompareOptions& options);

struct ReportInput {
  std::string label;           ///< the run as the user named it (its heading)
  std::filesystem::path path;  ///< where it is (a run directory or file): its plots lie beside it
  Run run;
};

/// A Markdown page with each run's environment, suites and one table per suite; plot links are
/// relative to `out_dir` (the directory the page is written to).
[[nodiscard]] std::string markdown_report(const std::vector<ReportInput>& runs, const std::filesystem::path& out_dir,
                                          const std::string& command);

[[nodiscard]] std::string_view to_string(Better b);
[[nodiscard]] std::string_view to_string(Verdict v);

}  // namespace lfbench::regress
