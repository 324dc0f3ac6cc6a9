// latentq/probe_config.h — the probe sections of a study config ([svd], [cross_layer], [attention],
// [e2e]), parsed with toml++ from the same text as latentq/config.h (StudyConfig::probes).
//
//   [svd]          enabled = true         the SVD pruning probe on c_kv (/svd, /svd_spectrum)
//                  centered = true        subtract the fit mean before the SVD (stored: kv_lora_rank floats)
//                  ranks = []             [] = kv_lora_rank/16, /8, /4, /2, 3/4, 1 (probes::default_svd_ranks),
//                                         capped at what the fit split determines (probe_study.h svd_ranks);
//                                         a rank > kv_lora_rank or > that is an error when the dump is known
//   [cross_layer]  enabled = true         /cross_layer (pairs) and /cross_layer_sharing (windows)
//                  pairs = "auto"         "all" (every pair a < b), "adjacent" (consecutive studied
//                                         layers), "auto" (all for <= 16 studied layers, else adjacent)
//                  windows = [2]          window sizes w >= 2 (w consecutive studied layers)
//                  ranks = []             total ranks k of a window (multiples of every w, <= w·kv_lora_rank);
//                                         [] = w·r/8, w·r/4, w·r/2 (rounded down to a multiple of w)
//                  centered = true
//   [attention]    enabled = true         /attention_error and /attention_check (needs the dump's
//                                         q_rows/q_nope/q_pe/w_uk/w_uv/attn_out; skipped with a note otherwise)
//                  targets = ["c_kv", "k_pe", "c_kv+k_pe"]   which latents are quantized
//                  svd = true             also SVD-pruned c_kv at every [svd] rank ("svd-rank<r>")
//                  check_tolerance = 1e-4 warn when the recomputation differs from attn_out by more
//   [decode_order] (absent = off)         /attention_position: attention on the decode-order cache
//                                         (latentq/decode_order.h) per query-position bucket
//                  residual = [0]         R values (>= 0): recent keys read in bf16
//                  sink = [0]             S values (>= 0): first tokens of each sequence kept in bf16
//                  prefill = [0]          P values (>= 0): queries before P read every key in bf16
//                  quantizers = [...]     spec strings ("<transform>,<quantizer>" allowed); required, non-empty
//                  targets = ["c_kv+k_pe"]   each "c_kv", "k_pe" or "c_kv+k_pe"
//                  position_bucket = 64   W >= 1: query positions bucketed as [b·W, (b+1)·W)
//                  The modes are the cross product R × S × P (decode-r<R>-s<S>-p<P>) plus the baseline
//                  prefill-at-once. Needs the dump's attention datasets (loaded for it even when
//                  [attention] is disabled).
//   [e2e]          enabled = false        true: run experiments/e2e_inject.py after the results are written
//                  model = "path"         the tiny-mla model directory, relative to the config file
//                  quantizers = []        [] = every quantizer of the study; else spec strings
// Unknown keys and bad values are std::invalid_argument naming "<source>:<line>:<col>" and the key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "latentq/decode_order.h"

namespace latentq {

struct SvdSettings {
  bool enabled = true;
  bool centered = true;
  std::vector<int64_t> ranks;  ///< empty = probes::default_svd_ranks(kv_lora_rank)
};

enum class PairSelection { Auto, All, Adjacent };

struct CrossLayerSettings {
  bool enabled = true;
  PairSelection pairs = PairSelection::Auto;
  std::vector<int64_t> windows{2};  ///< window sizes w (>= 2)
  std::vector<int64_t> ranks;       ///< total window ranks k; empty = w·r/8, w·r/4, w·r/2 per w
  bool centered = true;
};

struct AttentionSettings {
  bool enabled = true;
  std::vector<std::string> targets{"c_kv", "k_pe", "c_kv+k_pe"};  ///< each "c_kv", "k_pe" or "c_kv+k_pe"
  bool svd = true;                  ///< also the svd-rank<r> cells (c_kv only)
  double check_tolerance = 1e-4;    ///< /attention_check: warn above this relative error
};

struct DecodeOrderSettings {
  bool enabled = false;                    ///< true when the config has a [decode_order] section
  std::vector<int64_t> residual{0};        ///< R values, >= 0, config order
  std::vector<int64_t> sink{0};            ///< S values, >= 0
  std::vector<int64_t> prefill{0};         ///< P values, >= 0
  std::vector<std::string> quantizers;     ///< canonical TransformedSpec strings, config order
  std::vector<std::string> targets{"c_kv+k_pe"};  ///< each "c_kv", "k_pe" or "c_kv+k_pe"
  int64_t position_bucket = 64;            ///< W >= 1
  /// The decode modes, R-major then S then P (config order; the baseline prefill-at-once not included).
  std::vector<DecodeOrder> modes() const;
};

struct E2eSettings {
  bool enabled = false;                 ///< only [e2e] enabled = true runs the script
  std::filesystem::path model;          ///< resolved against the config's directory; empty = the script's default
  std::vector<std::string> quantizers;  ///< canonical spec strings; empty = every quantizer of the study
};

struct ProbeConfig {
  SvdSettings svd;
  CrossLayerSettings cross_layer;
  AttentionSettings attention;
  DecodeOrderSettings decode_order;
  E2eSettings e2e;
};

/// The root keys this parser owns (the config's root key check accepts them).
inline constexpr const char* kProbeConfigSections[] = {"svd", "cross_layer", "attention", "decode_order", "e2e"};

/// Parse the probe sections of config text (other sections are ignored). `source` names the text in
/// messages, `base_dir` resolves [e2e] model. Throws std::invalid_argument for TOML syntax errors,
/// unknown keys, wrong types, a rank < 1, a window < 2, a cross-layer rank that is not a multiple of
/// every window, an unknown attention target, a tolerance that is not > 0, or a bad spec string.
ProbeConfig parse_probe_config(std::string_view text, const std::string& source, const std::filesystem::path& base_dir);

/// "auto", "all" or "adjacent".
const char* to_string(PairSelection p);

}  // namespace latentq
