// The ranks of the SVD and sharing probes for a dump (latentq/probe_study.h: svd_ranks,
// sharing_ranks, rank_cap_warnings): what the fit split determines, shared by the svd, cross_layer and
// attention probes.
#include "latentq/probe_attention.h"
#include "latentq/probe_study.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "latentq/split.h"
#include "latentq/analysis/svd_probe.h"

namespace latentq {
namespace {

// What the fit split of a dump supports (probes::fit_heldout_split, probes::max_fit_rank).
struct FitLimit {
  int64_t tokens = 0;    // fit tokens
  int64_t max_rank = 0;  // the largest rank they determine
  int64_t seqs = 0;      // non-empty sequences of the dump
};
FitLimit fit_limit(const Dump& dump, bool centered) {
  FitLimit f;
  try {
    f.tokens = probes::fit_heldout_split(dump.seq_offsets, dump.num_tokens()).fit_tokens();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", dump.path.string(), e.what()));
  }
  f.max_rank = probes::max_fit_rank(f.tokens, centered);
  for (size_t s = 0; s + 1 < dump.seq_offsets.size(); ++s) f.seqs += dump.seq_offsets[s + 1] > dump.seq_offsets[s];
  return f;
}
std::string fit_split_words(const Dump& dump, const FitLimit& f) {
  return fmt::format("the fit split of {} has {} token{} ({})", dump.path.string(), f.tokens, f.tokens == 1 ? "" : "s",
                     f.seqs == 1 ? "the first half of its only non-empty sequence"
                                 : fmt::format("the first {} of its {} non-empty sequences", f.seqs / 2, f.seqs));
}
std::string fit_words(const Dump& dump, const FitLimit& f, bool centered) {
  return fmt::format("{}, which determine ranks up to {}{}", fit_split_words(dump, f), f.max_rank,
                     centered ? " (centered: one fewer than the tokens)" : "");
}

// The automatic ranks before capping.
std::vector<int64_t> auto_sharing_ranks(int64_t r, int64_t w) {
  std::vector<int64_t> out;
  for (int64_t f : {8, 4, 2}) {
    const int64_t k = std::max(w, (w * r / f) / w * w);
    if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  }
  std::sort(out.begin(), out.end());
  return out;
}
// Each rank capped at `cap` (> 0), duplicates removed, ascending.
std::vector<int64_t> capped(std::vector<int64_t> ranks, int64_t cap) {
  for (int64_t& k : ranks) k = std::min(k, cap);
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

}  // namespace

std::vector<int64_t> svd_ranks(const StudyConfig& config, const Dump& dump) {
  const SvdSettings& S = probe_settings<SvdSettings>(config, "svd");
  const int64_t r = dump.attrs.kv_lora_rank;
  const bool centered = S.centered;
  const FitLimit f = fit_limit(dump, centered);
  if (S.ranks.empty()) {
    if (f.max_rank < 1)
      throw std::invalid_argument(
          fmt::format("{}: [svd]: {}: no SVD rank can be fit (disable [svd] or use a dump with "
                      "more tokens)",
                      config.source, fit_words(dump, f, centered)));
    return capped(probes::default_svd_ranks(r), f.max_rank);
  }
  for (int64_t k : S.ranks) {
    if (k > r)
      throw std::invalid_argument(
          fmt::format("{}: [svd] ranks: rank {} is larger than kv_lora_rank {} of the dump "
                      "(SVD ranks must be 1 .. kv_lora_rank)",
                      config.source, k, r));
    if (k > f.max_rank)
      throw std::invalid_argument(fmt::format("{}: [svd] ranks: rank {} needs {} fit tokens, but {}", config.source, k,
                                              k + (centered ? 1 : 0), fit_words(dump, f, centered)));
  }
  return S.ranks;
}

std::vector<int64_t> sharing_ranks(const StudyConfig& config, const Dump& dump, int64_t w) {
  const CrossLayerSettings& C = probe_settings<CrossLayerSettings>(config, "cross_layer");
  const int64_t r = dump.attrs.kv_lora_rank;
  const bool centered = C.centered;
  const FitLimit f = fit_limit(dump, centered);
  const int64_t cap = f.max_rank / w * w;  // the largest multiple of w the fit split determines
  if (C.ranks.empty()) {
    if (cap < w)
      throw std::invalid_argument(
          fmt::format("{}: [cross_layer]: window {}: {}: no multiple of {} can be fit (disable "
                      "[cross_layer] or use a dump with more tokens)",
                      config.source, w, fit_words(dump, f, centered), w));
    return capped(auto_sharing_ranks(r, w), cap);
  }
  for (int64_t k : C.ranks) {
    if (k > w * r)
      throw std::invalid_argument(
          fmt::format("{}: [cross_layer] ranks: rank {} is larger than window {} x kv_lora_rank "
                      "{} = {} of the dump",
                      config.source, k, w, r, w * r));
    if (k > f.max_rank)
      throw std::invalid_argument(fmt::format("{}: [cross_layer] ranks: rank {} needs {} fit tokens, but {}",
                                              config.source, k, k + (centered ? 1 : 0), fit_words(dump, f, centered)));
  }
  return C.ranks;
}

std::vector<std::string> rank_cap_warnings(const StudyConfig& config, const Dump& dump) {
  const SvdSettings& S = probe_settings<SvdSettings>(config, "svd");
  const CrossLayerSettings& C = probe_settings<CrossLayerSettings>(config, "cross_layer");
  const AttentionSettings& A = probe_settings<AttentionSettings>(config, "attention");
  const int64_t r = dump.attrs.kv_lora_rank;
  std::vector<std::string> parts;
  const bool svd_used = S.enabled || (A.enabled && A.svd && attention_unavailable_reason(dump).empty());
  if (svd_used && S.ranks.empty()) {
    const std::vector<int64_t> full = probes::default_svd_ranks(r), used = svd_ranks(config, dump);
    if (used != full)
      parts.push_back(fmt::format("[svd] ranks {} instead of {}", fmt::join(used, ", "), fmt::join(full, ", ")));
  }
  if (C.enabled && C.ranks.empty()) {
    const size_t studied = dump.layers.size();
    for (int64_t w : C.windows) {
      if (w < 1 || static_cast<size_t>(w) > studied) continue;  // no cell: nothing capped
      const std::vector<int64_t> full = auto_sharing_ranks(r, w), used = sharing_ranks(config, dump, w);
      if (used != full)
        parts.push_back(fmt::format("[cross_layer] window {} ranks {} instead of {}", w, fmt::join(used, ", "),
                                    fmt::join(full, ", ")));
    }
  }
  if (parts.empty()) return {};
  return {
      fmt::format("{}: automatic ranks capped at what the fit split determines ({}): {}; give the ranks "
                  "explicitly to choose others",
                  config.source, fit_split_words(dump, fit_limit(dump, false)), fmt::join(parts, "; "))};
}

}  // namespace latentq
