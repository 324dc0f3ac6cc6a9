// latentq/results.h — results files, HDF5 schema `latentq-results/1`.
//
//   /            attrs: schema = "latentq-results/1", created (UTC ISO 8601), latentq_version,
//                git_commit, config (the full config text), input_path, input_sha256, model,
//                num_layers, kv_lora_rank, qk_rope_head_dim, ... (see study.h for what `run` writes)
//   /<table>/    one group per ColumnTable (latent_error, summary, svd, attention_error, ...):
//                one 1-D dataset per column, in column order (link creation order is tracked,
//                h5py iterates in that order): int64 columns as int64, float64 columns as
//                float64, string columns as variable-length UTF-8 strings (h5py: .asstr()[:]).
//                attrs: rows (int64), columns: the group's column record, a JSON array with one
//                object per dataset, in order:
//                  [{"name": "rel_fro", "dtype": "float64", "unit": "1", "definition": "..."}, ...]
//                dtype "int64", "float64" or "string"; unit and definition as ColumnDoc
//                (latentq/table.h) says, from the GroupSpec where the table is built ("" for a
//                table built without one). Files of older versions hold the comma-separated names.
// So in Python:  pandas.DataFrame({k: v[:] for k, v in f["latent_error"].items()}), and
//                json.loads(f["latent_error"].attrs["columns"]) for what each column is.
//
// Files are written to a temporary file in the destination directory (".<name>.<pid>.tmp") and
// renamed over the destination only when complete: an interrupted or failed write never leaves a
// partial file and never replaces the previous good one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "latentq/table.h"

namespace latentq {

inline constexpr const char* kResultsSchema = "latentq-results/1";

/// An HDF5 attribute value: a scalar int64, float64 or string, or a 1-D string array (h5py: a numpy
/// array of str; e.g. decode_order_modes).
using AttrValue = std::variant<int64_t, double, std::string, std::vector<std::string>>;
/// Ordered attributes.
using Attrs = std::vector<std::pair<std::string, AttrValue>>;

/// A table stored as the group /<group> (a single path component, e.g. "latent_error").
struct NamedTable {
  std::string group;
  ColumnTable table;
  Attrs attrs;  ///< extra attributes of the group (rows and columns are always written)
};

enum class WriteMode {
  /// The file gets exactly `root_attrs` and `tables`; an existing file is replaced (atomically).
  Replace,
  /// Keep an existing results file's root attributes and groups: `root_attrs` overwrite the
  /// same-named attributes, each table replaces the group of its name, every other group is
  /// copied unchanged. Without an existing file this is Replace.
  Update,
};

/// Write a results file (schema attribute added automatically). Creates missing parent
/// directories. Throws std::invalid_argument for a bad group name or a table whose columns differ
/// in length, std::invalid_argument when Update finds an existing file that is not a
/// latentq-results/1 file, std::runtime_error for I/O or HDF5 errors (naming the path). On any
/// error the destination is left as it was and the temporary file is removed.
void write_results(const std::filesystem::path& path, const Attrs& root_attrs, const std::vector<NamedTable>& tables,
                   WriteMode mode = WriteMode::Replace);

/// Install handlers for SIGTERM and SIGINT (once per process; a signal inherited as ignored stays
/// ignored) that unlink the temporary files write_results() is writing at that moment, then let the
/// signal terminate the process (its default action: the exit status shows the signal). Used by
/// `latentq run`: a job killed by Slurm or Ctrl-C leaves no stray ".<name>.<pid>.tmp". SIGKILL
/// cannot be caught; its leftovers are removed by the next run (batch.cpp).
void install_temp_file_signal_cleanup();

/// Root attributes of a results file (schema checked). Throws std::runtime_error for a missing or
/// non-HDF5 file, std::invalid_argument for a missing or wrong `schema` ("... is not a
/// latentq-results/1 file").
Attrs read_results_attrs(const std::filesystem::path& path);

/// The attributes of the group /<group> (schema checked; /e2e's provenance, for example). Throws
/// std::invalid_argument when the group is absent, and as read_results_attrs().
Attrs read_group_attrs(const std::filesystem::path& path, const std::string& group);

/// Names of the table groups of a results file, in creation order (schema checked).
std::vector<std::string> list_tables(const std::filesystem::path& path);

/// Read the table /<group> back (schema checked; column order preserved; each column's unit and definition
/// from the group's column record, empty without one). Throws std::invalid_argument if the group is missing,
/// a dataset is not a 1-D int/float/string array, or the column record does not list the datasets in order.
ColumnTable read_table(const std::filesystem::path& path, const std::string& group);

/// The value of `name` in attrs; throws std::invalid_argument if absent.
const AttrValue& attr(const Attrs& attrs, const std::string& name);

}  // namespace latentq
