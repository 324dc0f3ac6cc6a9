// latentq/probe_config.h — the probe sections of a study config and [e2e] (StudyConfig::probes). Each
// probe section is parsed by its probe's descriptor (latentq/probe_registry.h, study/probes/);
// the settings of the probes shipped here are declared below because several probes read them ([svd]
// ranks are also the attention probe's svd-rank<r> rows). A new probe declares its settings in its own file.
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
//   [e2e]          enabled = false        true: run python -m latentq.e2e after the results are written
//                  model = "path"         the tiny-mla model directory, relative to the config file
//                  quantizers = []        [] = every quantizer of the study; else spec strings
// Unknown keys and bad values are std::invalid_argument naming "<source>:<line>:<col>" and the key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <map>
#include <memory>
#include <vector>

#include "latentq/probe_registry.h"

namespace latentq {

/// [svd] (study/probes/svd.cpp).
struct SvdSettings : ProbeSettings {
  bool enabled = true;
  bool centered = true;
  std::vector<int64_t> ranks;  ///< empty = probes::default_svd_ranks(kv_lora_rank)
};

enum class PairSelection { Auto, All, Adjacent };

/// [cross_layer] (study/probes/cross_layer.cpp).
struct CrossLayerSettings : ProbeSettings {
  bool enabled = true;
  PairSelection pairs = PairSelection::Auto;
  std::vector<int64_t> windows{2};  ///< window sizes w (>= 2)
  std::vector<int64_t> ranks;       ///< total window ranks k; empty = w·r/8, w·r/4, w·r/2 per w
  bool centered = true;
};

/// [attention] (study/probes/attention.cpp).
struct AttentionSettings : ProbeSettings {
  bool enabled = true;
  std::vector<std::string> targets{"c_kv", "k_pe", "c_kv+k_pe"};  ///< each "c_kv", "k_pe" or "c_kv+k_pe"
  bool svd = true;                                                ///< also the svd-rank<r> cells (c_kv only)
  double check_tolerance = 1e-4;                                  ///< /attention_check: warn above this relative error
};

struct E2eSettings {
  bool enabled = false;                 ///< only [e2e] enabled = true runs the script
  std::filesystem::path model;          ///< resolved against the config's directory; empty = the script's default
  std::vector<std::string> quantizers;  ///< canonical spec strings; empty = every quantizer of the study
  // Passed through to python -m latentq.e2e when set (0 / empty: the script's default):
  std::filesystem::path text;    ///< the scored text file (resolved like model); empty = the KJV held-out split
  int64_t seq_len = 0;           ///< tokens per window (--seq-len), >= 1
  int64_t num_seqs = 0;          ///< windows (--num-seqs), >= 1
  int64_t offset_bytes = -1;     ///< where the windows start in the text (--offset-bytes), >= 0; -1 = default
  std::string device;            ///< torch device (--device): cpu, cuda, cuda:N
  std::string dtype;             ///< compute dtype (--dtype): float32, bfloat16, float16
  int64_t batch_runs = 0;        ///< runs per forward (--batch-runs), >= 1; 0 = auto
  bool trust_remote_code = false;  ///< run the checkpoint's own code (--trust-remote-code): model and tokenizer
  std::string tokenizer;           ///< --tokenizer: auto (the checkpoint's; an error when it fails) or bytes
  std::string stream;              ///< --stream: auto (by size), on or off
  std::string memory_budget;       ///< --memory-budget: host memory for weights when streaming, e.g. 24G
  // Free-running generation (/generation, latentq.e2e_generation) and retrieval at range (/retrieval,
  // latentq.e2e_retrieval): unset = off for `latentq run`, on for `latentq study` (the step skips them, with a
  // note, for a model it streams or a sparse-MLA / DeepSeek-V4 model).
  std::optional<bool> generation;  ///< --generation
  bool generation_auto = false;    ///< not a config key: `latentq study` turned it on (--generation auto: no error
                                   ///< when the text or model cannot hold the prompts, a note)
  int64_t gen_prompts = 0;         ///< prompts cut from the text (--gen-prompts), >= 1; 0 = the script's default
  int64_t gen_prompt_len = 0;      ///< tokens per prompt (--gen-prompt-len), >= 1; 0 = default
  int64_t gen_new_tokens = 0;      ///< greedy tokens per prompt (--gen-new-tokens), >= 1; 0 = default
  std::optional<bool> retrieval;   ///< --retrieval
  std::vector<int64_t> needle_lengths;  ///< context lengths of the needle test (--needle-lengths); empty = default
  int64_t needle_samples = 0;           ///< samples per (length, depth) (--needle-samples), >= 1; 0 = default
  std::string dump_text_sha256;  ///< not a config key: `latentq study` sets it (--dump-text-sha256)
  std::string selection;  ///< not a config key: --e2e of run / study / merge (frontier or all; empty = frontier)
  std::string budgets;    ///< not a config key: their --budgets, the decision's budgets (empty = the default)
};

/// The probe sections of a config and [e2e].
struct ProbeConfig {
  E2eSettings e2e;
  /// The settings of every registered probe by section name (defaults for a section left out).
  std::map<std::string, std::shared_ptr<const ProbeSettings>> sections;
  /// What parsing noticed and kept going: a spec named twice in [e2e] quantizers (run once).
  std::vector<std::string> warnings;
};

/// Parse [e2e] and every registered probe's section of config text (other sections are ignored).
/// `source` names the text in messages, `base_dir` resolves relative paths. Throws
/// std::invalid_argument for TOML syntax errors, unknown keys, wrong types and bad values (naming
/// "<source>:<line>:<col>" and the key).
ProbeConfig parse_probe_config(std::string_view text, const std::string& source, const std::filesystem::path& base_dir);

/// "auto", "all" or "adjacent".
const char* to_string(PairSelection p);

}  // namespace latentq
