// latentq/probe_registry.h — the probe registry: ONE descriptor per probe, in one file per probe
// (study/probes/<name>.cpp), which the generic runner (latentq/probe_study.h), the config
// parser (latentq/config.h) and the batch runner (latentq/batch_study.h) take everything from:
//
//   section()   the config section the probe owns ("svd" → [svd]); config.cpp accepts exactly the
//               registered sections (plus the study's own), an unknown one is an error naming the file
//               and the known sections
//   parse()     its settings: parse + validate + defaults (a missing section gives the defaults)
//   groups()    the result groups it writes: their columns with dtypes, units and definitions
//   plan()      its cells for a config and a dump header (keys, groups, the layers each reads)
//   run()       one cell → one table per group of the cell
//   row_keys()  the cell key of every row of one of its groups (for merge/resume checks and tests)
//   report()    what `latentq run` prints after the latent summary (notes, warnings, tables)
//   root_attrs() root attributes of the results file its settings add (e.g. for the e2e step)
//
// How to add a probe (e.g. [decode_order] with groups /decode_order): write ONE file
// study/probes/decode_order.cpp that defines a class deriving from Probe and ends with
// LATENTQ_DEFINE_PROBE(decode_order, DecodeOrderProbe); the build picks up every file of that folder
// (CMake glob, re-checked at build time) and registers it. Read settings with SettingsReader; get them
// back anywhere with probe_settings<DecodeOrderSettings>(config, "decode_order"). Add a test and a line
// in study/README.md. Nothing else changes: not the runner, not the config parser, not the CLI.
//
// Canonical order: probes run and are written in ascending order() (cells in each probe's plan order,
// after the latent-error cells); they print in ascending print_order().
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "latentq/dump.h"
#include "latentq/attention/device_seam.h"
#include "latentq/results.h"
#include "latentq/spec.h"
#include "latentq/table.h"

namespace latentq {

struct StudyConfig;
struct TargetPlan;  // latentq/config.h

// ---- settings -------------------------------------------------------------------------------------

/// Base of every probe's settings (each probe derives its own struct).
struct ProbeSettings {
  virtual ~ProbeSettings() = default;
};

/// Reads the keys of one config section (toml++ stays behind it). Every error throws
/// std::invalid_argument "<source>:<line>:<col>: ..." naming the key "<section>.<key>".
class SettingsReader {
 public:
  SettingsReader(const SettingsReader&) = delete;
  SettingsReader& operator=(const SettingsReader&) = delete;
  ~SettingsReader();

  const std::string& section() const;
  /// False when the config has no such section (parse() then returns the defaults).
  bool present() const;
  /// Throws for a key of the section that is not in `valid`, naming it and the valid keys.
  void check_keys(std::initializer_list<const char*> valid) const;
  bool has(const char* key) const;
  /// The value of `key`, or nullopt when absent; throws for a wrong type.
  std::optional<bool> boolean(const char* key) const;
  std::optional<std::string> string(const char* key) const;
  std::optional<double> number(const char* key) const;  ///< integer or float
  std::optional<std::vector<std::string>> strings(const char* key) const;
  /// An array of integers, each >= lo, none listed twice.
  std::optional<std::vector<int64_t>> ints(const char* key, int64_t lo) const;
  /// A path relative to the config file's directory, resolved and normalized.
  std::optional<std::filesystem::path> path(const char* key) const;
  /// Throw std::invalid_argument at the position of `key` (element `index` of an array when given).
  [[noreturn]] void fail(const char* key, const std::string& message, std::optional<size_t> index = {}) const;

  struct Impl;
  explicit SettingsReader(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- result groups ---------------------------------------------------------------------------------
// A probe declares each group it writes as a GroupSpec (latentq/table.h: its columns with their dtypes,
// units and definitions, once) and builds the group's rows from empty_table(spec) with add_row(); the
// results writer stores that column record in the file.

// ---- cells -----------------------------------------------------------------------------------------

class Probe;

/// One cell of a probe: a stable key, the groups it has rows in, the dump layers it reads (the
/// runner loads exactly those, once per window), and the probe's own description of the cell.
struct ProbeCell {
  const Probe* probe = nullptr;
  std::string key;                     ///< e.g. "003/svd"
  std::vector<std::string> groups;     ///< in the order run() returns their tables
  std::vector<int> layers;             ///< the layers run() reads, ascending
  bool attention = false;              ///< run() reads the attention datasets of those layers
  std::shared_ptr<const void> detail;  ///< the probe's cell description (as<T>())

  template <class T>
  const T& as() const {
    return *static_cast<const T*>(detail.get());
  }
  template <class T>
  static ProbeCell make(const Probe* probe, std::string key, std::vector<std::string> groups, std::vector<int> layers,
                        bool attention, T detail) {
    return {probe,
            std::move(key),
            std::move(groups),
            std::move(layers),
            attention,
            std::make_shared<const T>(std::move(detail))};
  }
};

/// What a probe plans for a config and a dump.
struct ProbePart {
  std::vector<ProbeCell> cells;       ///< canonical order within the probe
  std::vector<std::string> groups;    ///< the groups the run writes (even without cells); empty: disabled
  std::vector<std::string> notes;     ///< lines printed before the tables ("attention: skipped: ...")
  std::vector<std::string> warnings;  ///< printed as "latentq: warning: ..." before the run
};

/// The data a running cell reads: the dump header (attrs, tokens, seq_offsets, path; `header.layers`
/// lists the studied layers with their index only) and the data of the cell's layers. Per-layer
/// results shared by several cells (an SVD basis, the reference attention) go through shared():
/// computed once per layer residency, thread-safely, and dropped with the layer.
class LayerAccess {
 public:
  virtual ~LayerAccess() = default;
  virtual const Dump& header() const = 0;
  /// The data of `index` (one of the cell's layers). Throws std::invalid_argument otherwise.
  virtual const Layer& layer(int index) const = 0;
  /// The device the attention probes evaluate their /attention_error cells on (`--device cuda`); null or
  /// empty: the CPU.
  virtual const probes::AttentionDeviceFactory* attention_device() const { return nullptr; }
  /// The value named `name` for `layer`, made by `make` on first use (exceptions propagate and the
  /// next call tries again).
  template <class T>
  std::shared_ptr<const T> shared(int layer, const std::string& name, const std::function<T()>& make) const {
    return std::static_pointer_cast<const T>(shared_any(
        layer, name, [&] { return std::static_pointer_cast<const void>(std::make_shared<const T>(make())); }));
  }

 protected:
  virtual std::shared_ptr<const void> shared_any(int layer, const std::string& name,
                                                 const std::function<std::shared_ptr<const void>()>& make) const = 0;
};

/// What report() prints from.
struct ProbeReportInput {
  const StudyConfig& config;
  const ColumnTable* summary;             ///< /summary; null for a shard
  const std::vector<NamedTable>& tables;  ///< every table of the run
  const DumpAttrs& attrs;
  const ProbePart& part;  ///< this probe's plan
  const NamedTable* find(const std::string& group) const;
};

// ---- the descriptor ----------------------------------------------------------------------------------

class Probe {
 public:
  virtual ~Probe() = default;
  /// The config section it owns, e.g. "svd".
  virtual std::string section() const = 0;
  /// Position in the canonical order (cells and groups); distinct across probes.
  virtual int order() const = 0;
  /// Position of its printed tables (default: order()).
  virtual int print_order() const { return order(); }
  /// Its settings from the section (defaults when !r.present()); throws through `r` for bad values.
  virtual std::shared_ptr<const ProbeSettings> parse(const SettingsReader& r) const = 0;
  /// Every group it can write, with columns.
  virtual std::vector<GroupSpec> groups() const = 0;
  /// Its cells for `config` over `dump` (a header: layer indices, no layer data needed). Throws
  /// std::invalid_argument for values the dump cannot take, naming them.
  virtual ProbePart plan(const StudyConfig& config, const Dump& dump) const = 0;
  /// The rows of one of its cells: one table per group of the cell. Runs on the calling thread only.
  virtual std::vector<ColumnTable> run(const StudyConfig& config, const ProbeCell& cell,
                                       const LayerAccess& in) const = 0;
  /// The cell key of every row of `group` (one of its groups), from the columns.
  virtual std::vector<std::string> row_keys(const std::string& group, const ColumnTable& t) const = 0;
  /// Printed after the latent summary: warnings (to err, without the "latentq: warning: " prefix)
  /// and tables (to out). Default: nothing.
  virtual std::vector<std::string> report_warnings(const ProbeReportInput&) const { return {}; }
  virtual std::string report(const ProbeReportInput&) const { return {}; }
  /// Root attributes of the results file that its settings add (e.g. for a later step to read; the
  /// runner writes them with the study's own). Default: none.
  virtual Attrs root_attrs(const StudyConfig&) const { return {}; }
  /// The (quantizer, target) pairs its cells quantize beyond the study's quantizers (canonical
  /// "<transform>,<spec>" names, e.g. [decode_order]'s), so that the study lists those a format cannot
  /// take with its own (latentq/applicable.h); its plan() must leave their cells out. Default: none.
  virtual std::vector<std::pair<std::string, Target>> quantized_pairs(const StudyConfig&) const { return {}; }
  /// Cached tensors beyond the study's [input] targets (c_kv, k_pe) whose /latent_error cells the study plans, with
  /// their quantizers: e.g. [indexer]'s formats on index_k of a sparse MLA dump. The study plans them on the layers
  /// that hold the target (Dump::holds), lists the pairs a format cannot take in /not_applicable, and keeps them
  /// out of /summary, the decision and the planner (is_latent_target). Default: none.
  virtual std::vector<TargetPlan> latent_targets(const StudyConfig&, const DumpAttrs&) const;
  /// Why the probe, enabled in `config`, has nothing to measure on a dump of `attrs`'s cache family, with the cached
  /// tensor it would read (e.g. [svd] on DeepSeek-V4: no c_kv), or {CKV, ""} when it applies (or is disabled). The
  /// study lists a reason in /not_applicable (quantizer "[section]", width 0) and the probe's plan() prints it and
  /// plans no cell. Default: applies.
  virtual std::pair<Target, std::string> not_applicable_reason(const StudyConfig&, const DumpAttrs&) const;
};

/// Every registered probe, ascending order(). Checks (once) that sections, orders and group names
/// are distinct (assert-like std::logic_error otherwise).
const std::vector<const Probe*>& registered_probes();
/// The probe owning `section`, or nullptr.
const Probe* find_probe(std::string_view section);
/// The probe writing `group`, or nullptr.
const Probe* probe_of_group(std::string_view group);
/// The column schema of a probe group; throws std::invalid_argument for an unknown group.
const GroupSpec& probe_group_spec(const std::string& group);

/// Parse the sections of every registered probe from config text (called by parse_config).
std::map<std::string, std::shared_ptr<const ProbeSettings>> parse_probe_sections(std::string_view text,
                                                                                 const std::string& source,
                                                                                 const std::filesystem::path& base_dir);
/// A SettingsReader over one section of config text (for parse_probe_sections and tests).
std::unique_ptr<SettingsReader> make_settings_reader(std::string_view text, const std::string& source,
                                                     const std::filesystem::path& base_dir, const std::string& section);

/// The settings of `section` in `config`, as the probe's type. Throws std::logic_error when the
/// section is not registered or of another type.
template <class T>
const T& probe_settings(const StudyConfig& config, const std::string& section);
const ProbeSettings& probe_settings_any(const StudyConfig& config, const std::string& section);
template <class T>
const T& probe_settings(const StudyConfig& config, const std::string& section) {
  const T* p = dynamic_cast<const T*>(&probe_settings_any(config, section));
  if (!p) throw std::logic_error("probe settings [" + section + "] are of another type");
  return *p;
}

}  // namespace latentq

/// In study/probes/<name>.cpp: registers `Class` (default-constructible, deriving from
/// latentq::Probe) under the file's stem `name`.
#define LATENTQ_DEFINE_PROBE(name, Class)  \
  namespace latentq::registry {            \
  const ::latentq::Probe& probe_##name() { \
    static const Class instance;           \
    return instance;                       \
  }                                        \
  }
