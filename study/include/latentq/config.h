// latentq/config.h — study configuration files (TOML, parsed with toml++).
//
// A config names the input dump, the layers and targets, and the quantizer matrix; the full
// reference with comments is study/config/default.toml (embedded into the latentq binary).
//
//   [input]      dump = "path.h5"          relative to the config file's directory
//                layers = "all" | [0, 2]
//                targets = ["c_kv", "k_pe"]
//   [quantizers] bits, schemes, granularities, group_sizes, scale_dtypes   the cross product
//                extra = [spec, ...]                                        appended as given
//                exclude = [spec or '*' glob, ...]                          removed from the above
//   [targets.<c_kv|k_pe>]  quantizers = [spec, ...]   replaces the list for that target
//                          exclude = [spec or glob]   removed for that target only
//   [[mixed]]    name = "mixed" (default), layers = [0, 1] | "all" (default), c_kv = spec, k_pe = spec
//                one rule of a mixed assignment; the rules of one name are one quantizer of every
//                target, which must cover every studied (layer, target) exactly once
//   [output]     results = "path.h5"       relative to the config file's directory
//   [svd], [cross_layer], [attention], [e2e]   the probes: latentq/probe_config.h
//
// Unknown keys, unknown specs, wrong types and out-of-range values are errors
// (std::invalid_argument naming the config source, line:column and key).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "latentq/probe_config.h"
#include "latentq/spec.h"
#include "latentq/transform.h"

namespace latentq {

/// One rule of a mixed assignment ([[mixed]] in a config): `spec` behind `transform` on `target` of
/// `layers` (the rule's string "<transform>,<spec>" or "<spec>").
struct MixedRule {
  std::vector<int> layers;  ///< the layer indices; empty = every studied layer
  Target target = Target::CKV;
  QuantSpec spec;
  Transform transform{};  ///< the rotation before `spec`; kind None: none
  bool operator==(const MixedRule&) const = default;
};

/// A quantizer of the study: its canonical spec string (QuantSpec::to_string) and the spec; or a
/// mixed assignment (`mixed` non-empty): a name that is no spec (e.g. "mixed") and one spec per
/// (layer, target), run as one row whose bytes per token are the sum of what each layer stores.
struct Quantizer {
  std::string
      name;  ///< canonical TransformedSpec string ("had,int4-asym-token", "int8-sym-tensor"), or a mixed row's name
  QuantSpec spec;                  ///< unused for a mixed assignment
  Transform transform{};           ///< the rotation before the quantizer (latentq/transform.h); kind None: none
  std::vector<MixedRule> mixed{};  ///< the rules of a mixed assignment, config order; empty otherwise
  bool operator==(const Quantizer&) const = default;
  bool is_mixed() const { return !mixed.empty(); }
  /// The spec stored on (layer, target): `spec`, or the mixed rule covering them. Throws
  /// std::invalid_argument naming the assignment, the layer and the target when no rule covers them.
  const QuantSpec& spec_for(int layer, Target target) const;
  /// The transform before that spec: `transform`, or that of the mixed rule covering them. Throws as
  /// spec_for.
  const Transform& transform_for(int layer, Target target) const;
};

/// The quantizers to run on one target, in run order.
struct TargetPlan {
  Target target;
  std::vector<Quantizer> quantizers;
};

struct StudyConfig {
  std::string text;                   ///< the full config text (stored in results files)
  std::string source;                 ///< where it came from (a path, or the embedded default's path)
  std::filesystem::path base_dir;     ///< directory relative paths resolve against
  std::filesystem::path dump;         ///< [input].dump resolved; empty if not given
  std::vector<int> layers;            ///< [input].layers; empty = all layers of the dump
  std::vector<TargetPlan> targets;    ///< one per [input].targets entry, in that order
  std::filesystem::path results;      ///< [output].results resolved; empty if not given
  std::vector<std::string> warnings;  ///< non-fatal remarks (e.g. an exclude pattern matching nothing)
  ProbeConfig probes;                 ///< [svd], [cross_layer], [attention], [e2e] (latentq/probe_config.h)

  /// Every quantizer of any target, first occurrence order (c_kv's list first when it is first).
  std::vector<Quantizer> all_quantizers() const;
  /// The plan of `t`, or nullptr if the target is not studied.
  const TargetPlan* plan(Target t) const;
};

/// Parse config text. `source` names it in messages; `base_dir` resolves relative paths.
/// Throws std::invalid_argument with "<source>:<line>:<col>: ..." for TOML syntax errors, unknown
/// keys (naming the key and the valid ones), wrong types, bits outside {2, 4, 8}, negative group
/// sizes, unknown granularities/schemes/scale dtypes/targets, invalid spec strings (the message of
/// QuantSpec::parse, which lists the valid forms), or a target left with no quantizer.
StudyConfig parse_config(std::string_view text, const std::string& source, const std::filesystem::path& base_dir);

/// Read and parse a config file (base_dir = its directory). Throws std::runtime_error if it
/// cannot be read, and as parse_config.
StudyConfig load_config(const std::filesystem::path& path);

/// The embedded study/config/default.toml, parsed as if it lived at <source dir>/study/config/.
StudyConfig default_config();
/// The embedded default config text and the path it stands for.
std::string_view default_config_text();
std::filesystem::path default_config_path();

/// The quantizer cross product, in order: bits × schemes × (tensor × scale_dtypes, or
/// {channel, token} × group_sizes × scale_dtypes), following the order of each list and of
/// `granularities`; duplicates (by canonical name) dropped. Throws std::invalid_argument as
/// parse_config for bad values.
std::vector<Quantizer> expand_matrix(const std::vector<int64_t>& bits, const std::vector<std::string>& schemes,
                                     const std::vector<std::string>& granularities,
                                     const std::vector<int64_t>& group_sizes,
                                     const std::vector<std::string>& scale_dtypes);

/// True if the canonical quantizer name matches `pattern`: a '*' glob (fnmatch) or, without '*',
/// the canonical form of a spec string (so "int4-asym-channel-g32-fp16" matches
/// "int4-asym-channel-g32").
bool quantizer_matches(const std::string& name, const std::string& pattern);

}  // namespace latentq
