// latentq/batch.h — batch runs of cell-structured studies: checkpointing and --resume, --shard i/n,
// and merging shard files. Generic over result groups: a study is a list of CellTasks, each with a
// stable key and the rows (ColumnTables) it contributes to one or more groups (/latent_error;
// /svd and /svd_spectrum; ...).
//
// Cell identity lives in the results file itself, in the group /cells (cells_spec(): cell, group, index,
// first_row, rows): one row per (cell, group) of every cell present, in canonical order (the order of the
// study's plan, then the cell's groups in the order it declares them), so that the rows of a cell in a group are /<group>[first_row : first_row + rows]. The per-cell tables keep
// exactly their own columns (no extra key column); every per-cell group lists its cells in
// canonical order, so a complete file, a resumed file and a merged file are identical table for
// table, row for row. Groups not named in /cells are derived (e.g. /summary, recomputed from the
// per-cell groups by a DeriveFn) or foreign (e.g. /e2e added later by python -m latentq.e2e).
//
// Root attributes added by the batch layer (besides the study's own: config, input_sha256, ...):
//   config_sha256  SHA-256 of the `config` attribute (the full config text), lower-case hex
//   plan_sha256    SHA-256 of the canonical list of every cell key of the study, joined by '\n'
//   cells_total    number of cells of the whole study
//   shard          "i/n"; shard_index i, shard_count n (an unsharded or merged file is "0/1")
//   shard_cells    number of cells this shard owns
//   cells          number of cells present in the file
//   complete       1 when every cell of the shard is present (and derived tables are written when
//                  n = 1), 0 for a checkpoint
//   merged_from    (merged files) the shard files, comma-separated
//
// Shards: cell `key` belongs to shard shard_of(key, n) = (first 8 bytes of SHA-256(key) as a
// big-endian uint64) mod n; deterministic, independent of the platform and of the order of cells
// in the config. Shard files (n > 1) hold no derived tables; merge_results() recomputes them.
//
// Checkpoints: a run writes the cells completed so far to "<OUT>.partial" (the same format,
// complete = 0, atomically: temporary file + rename) whenever new cells completed (at most every
// `checkpoint_interval` seconds) and renames nothing over OUT until the run is complete, so an
// existing complete OUT is never replaced by a partial file. A run killed at any moment leaves a
// readable "<OUT>.partial" missing at most the cells completed since the last checkpoint began
// (and possibly a temporary ".<OUT name>.partial.<pid>.tmp", removed by the next run once that pid
// is gone).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "latentq/results.h"
#include "latentq/table.h"

namespace latentq {

/// The group holding the cell index of a results file.
inline constexpr const char* kCellsGroup = "cells";
/// Its columns with their units and definitions (batch.cpp).
const GroupSpec& cells_spec();

/// One cell of a batch: a stable key and the rows it adds to its groups.
struct CellTask {
  /// Stable and unique within the study, e.g. "003/c_kv/int4-asym-channel-g32/latent_error",
  /// "003/svd", "003-004/cross_layer".
  std::string key;
  /// The groups its rows go to (each one path component, not "cells"; distinct), e.g.
  /// {"latent_error"} or {"svd", "svd_spectrum"}.
  std::vector<std::string> groups;
  /// Computes the cell's rows: one table per group, in `groups` order, each with any number of
  /// rows (0 allowed); every cell of a group must give the same columns in the same order (or a
  /// table without columns for no rows). Called on a worker thread while the calling thread may be
  /// writing a checkpoint, so it must not use HDF5 (the HDF5 library here is not thread-safe).
  /// Errors are thrown (std::exception); the message should name the key (it is prefixed otherwise).
  std::function<std::vector<ColumnTable>()> compute;
  /// False: never runs at the same time as another task with concurrent = false.
  bool concurrent = true;
};

/// A shard "i/n" of a study: the cells with shard_of(key, n) == i.
struct Shard {
  int64_t index = 0;
  int64_t count = 1;
  /// Parse "i/n" (0 <= i < n, decimal). Throws std::invalid_argument naming the string otherwise.
  static Shard parse(std::string_view s);
  /// "i/n"
  std::string to_string() const;
  bool operator==(const Shard&) const = default;
};

/// The shard (0..count-1) of a cell key: the first 8 bytes of SHA-256(key), big-endian, mod count.
/// Throws std::invalid_argument if count < 1.
int64_t shard_of(std::string_view key, int64_t count);

/// The first difference between two tables, e.g. "column 'rel_fro', row 3: 0.25 vs 0.5", or ""
/// when they are identical: same column names, order and types, same rows in the same order,
/// float64 compared bit for bit (NaN equals the same NaN, -0 differs from +0). With rtol > 0 or atol > 0,
/// two finite float64 values are equal when |x − y| ≤ rtol · max(|x|, |y|) + atol (results of two engines,
/// e.g. the CPU and the device attention); non-finite ones are still compared bit for bit.
std::string table_difference(const ColumnTable& a, const ColumnTable& b, double rtol = 0, double atol = 0);

/// Lower-case hex SHA-256 of `bytes` (OpenSSL EVP).
std::string sha256_hex(std::string_view bytes);

/// One cell's rows as read from or written to a results file.
struct CellRows {
  std::string key;
  int64_t index = 0;              ///< position in the canonical plan
  std::vector<NamedTable> parts;  ///< per group (group, rows), in the cell's group order
};

/// The cells of a results file (canonical order) and its other content.
struct BatchFile {
  Attrs attrs;                            ///< root attributes
  std::vector<CellRows> cells;            ///< sorted by index
  std::vector<std::string> other_groups;  ///< groups not named in /cells (derived or foreign), file order
};

/// Read a results file written by run_batch()/merge_results(). Throws std::runtime_error for a
/// missing or non-HDF5 file, std::invalid_argument for another schema ("... is not a
/// latentq-results/1 file (schema = ...)"), a file without /cells (written without batch support),
/// or a /cells table that does not match the groups (bad types, rows out of range, duplicate keys
/// or indices); messages name the path.
BatchFile read_batch_file(const std::filesystem::path& path);

/// The per-cell tables of `cells` (sorted by index): one table per group, in order of the group's
/// first appearance, each the concatenation of its cells' rows; then the /cells table (last). A
/// group whose cells all gave tables without columns is left out (so is a group no cell has). Throws
/// std::invalid_argument naming the cell when a cell's columns differ from the other cells of its group.
std::vector<NamedTable> assemble_cell_tables(const std::vector<CellRows>& cells);

/// Tables derived from the per-cell tables (e.g. /summary from /latent_error), computed from the
/// root attributes (config text, dimensions) and the per-cell tables (without /cells) of a
/// complete, unsharded or merged study.
using DeriveFn = std::function<std::vector<NamedTable>(const Attrs& root, const std::vector<NamedTable>& cell_tables)>;

/// "<out>.partial": where run_batch() checkpoints a run that is not complete.
std::filesystem::path partial_path(const std::filesystem::path& out);

struct BatchOptions {
  Shard shard;                     ///< the cells to run (default: all)
  bool resume = false;             ///< continue from "<out>.partial", else from a complete `out`
  int threads = 0;                 ///< worker threads; 0 = std::thread::hardware_concurrency()
  double checkpoint_interval = 0;  ///< minimum seconds between checkpoints (0: whenever cells completed)
  /// Test hook: stop after this many cells were computed in this run (0 = never): no new cell is
  /// started, the completed ones are checkpointed, run_batch returns with complete = false.
  size_t stop_after = 0;
  /// Called from the calling thread about every 100 ms and at the end with (cells of the shard
  /// present, cells of the shard); resumed cells count as present.
  std::function<void(size_t, size_t)> progress;
  /// The order in which the cells this run computes are started: called once, before any starts, with
  /// their plan indices in canonical order (the shard's cells not resumed); returns the same indices
  /// reordered. Unset: canonical order. Rows are written in canonical order either way. The study uses
  /// it to run the cells layer by layer and to know how often each dump layer will be read.
  std::function<std::vector<size_t>(const std::vector<size_t>& pending)> schedule;
};

/// Where the cells' time went: the cells of one kind (the first group a cell writes, e.g. "latent_error",
/// "attention_error", "svd"), how many this run computed and their summed compute time in seconds (on
/// the worker threads: with n threads, up to n x the wall time).
struct CellTime {
  std::string group;
  size_t cells = 0;
  double seconds = 0;
};

struct BatchResult {
  bool complete = false;
  size_t total = 0;                    ///< cells of the whole study
  size_t owned = 0;                    ///< cells of this shard
  size_t resumed = 0;                  ///< cells taken from the file resumed
  size_t computed = 0;                 ///< cells computed by this run
  std::filesystem::path resumed_from;  ///< the file resumed (empty if none)
  std::filesystem::path written;       ///< `out` when complete, else partial_path(out)
  Attrs attrs;                         ///< root attributes written
  std::vector<NamedTable> tables;      ///< tables written (per-cell groups, derived, /cells)
  std::vector<CellTime> cell_time;     ///< the computed cells by kind, most seconds first
  double cells_seconds = 0;            ///< wall time of the cells (the worker pool)
  double finish_seconds = 0;           ///< wall time of the derived tables and the write (complete runs)
};

/// One line: "cells 12.3 s wall on 2 threads (thread-seconds: attention_error 15.1 s / 84 cells, ...);
/// derived tables + write 0.4 s" (at most `kinds` kinds named, the rest summed as "other").
std::string format_cell_time(const BatchResult& r, int threads, size_t kinds = 6);

/// Run the cells of `plan` (the whole study in canonical order) that belong to options.shard and
/// write `out`. `attrs` are the study's root attributes and must hold `config` (the full config
/// text) and `input_sha256`; the batch attributes above are added. Derived tables (`derive`, may
/// be empty) are written only for unsharded runs (count 1).
///
/// With options.resume, the cells already present in "<out>.partial" (if it exists, else in `out`,
/// if it exists; else nothing is resumed) are taken from it and not recomputed; the file must have
/// been written for the same config text, input (input_sha256), shard and plan, else
/// std::invalid_argument showing both config or input hashes. Without resume an existing `out` or
/// partial file is replaced. When `out` was resumed, groups it holds that are neither per-cell nor
/// derived (e.g. /e2e) are kept.
///
/// When complete, `out` is written atomically and "<out>.partial" removed. A failing cell does not
/// stop the others; afterwards the completed cells are checkpointed and std::invalid_argument is
/// thrown for the first failing cell in canonical order, naming its key and the partial file.
/// Throws std::invalid_argument for duplicate keys or a bad group name in `plan`, and as
/// write_results() for I/O errors.
BatchResult run_batch(const std::filesystem::path& out, const Attrs& attrs, const std::vector<CellTask>& plan,
                      const DeriveFn& derive, const BatchOptions& options = {});

struct MergeResult {
  size_t shards = 0;       ///< shard count n
  size_t cells = 0;        ///< cells merged (= cells_total)
  size_t overlapping = 0;  ///< cells present in more than one input (all equal)
  Attrs attrs;
  std::vector<NamedTable> tables;
};

/// Join shard files (complete, written by run_batch with --shard i/n) into `out`: the per-cell
/// tables in canonical order, derived tables recomputed with `derive`, root attributes of the
/// first input with shard "0/1", cells = cells_total, merged_from. The result equals an unsharded
/// run of the same config, cell for cell and table for table. `out` is written atomically (it may
/// be one of the inputs).
///
/// Throws std::invalid_argument (nothing written) for: no inputs; an input that is not a
/// latentq-results/1 file or has no batch attributes or /cells; inputs of different configs (both
/// config_sha256 shown) or inputs (both input_sha256 shown), plans or shard counts; an incomplete
/// shard (a checkpoint); missing shards (their indices listed); a cell present in two inputs with
/// different rows (the key and both files named); a merged set of cells that is not the whole
/// study. std::runtime_error for unreadable files and I/O errors.
MergeResult merge_results(const std::filesystem::path& out, const std::vector<std::filesystem::path>& inputs,
                          const DeriveFn& derive);

}  // namespace latentq
