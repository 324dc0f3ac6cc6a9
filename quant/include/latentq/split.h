// latentq/split.h — the fit / held-out token split shared by the SVD and cross-layer probes, the
// rate–distortion bound and the fitted quantizers (Lloyd-Max codebooks, quantize.h).
//
// Rule (whole sequences, so no sequence is seen by both the fit and the evaluation), over the N
// non-empty sequences (empty ones, seq_offsets[s] == seq_offsets[s+1], are skipped: they hold no
// token, so a dump with or without them splits the same tokens the same way):
//   N ≥ 2: fit = the first ⌊N/2⌋ non-empty sequences, held-out = the other ⌈N/2⌉
//          (N = 3 fits on 1 sequence and evaluates on 2);
//   N = 1: fit = the first ⌊L/2⌋ tokens of that sequence (L its length), held-out = the rest.
// The tiny-mla dump (4 × 512 tokens) fits on sequences 0–1 (1024 tokens), evaluates on 2–3.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace latentq::probes {

/// Token ranges [begin, end) of the fit and held-out splits (indices into the T tokens).
struct TokenSplit {
  std::vector<std::pair<int64_t, int64_t>> fit;
  std::vector<std::pair<int64_t, int64_t>> heldout;
  int64_t fit_tokens() const;
  int64_t heldout_tokens() const;
};

/// Check seq_offsets [S+1] (int64): S ≥ 1, 0 = o_0 ≤ o_1 ≤ ... ≤ o_S = T.
/// Throws std::invalid_argument naming `what` (e.g. "seq_offsets") and the offending entry.
void validate_seq_offsets(std::span<const int64_t> seq_offsets, int64_t T, std::string_view what = "seq_offsets");

/// The split described above. Throws std::invalid_argument for bad seq_offsets (see
/// validate_seq_offsets) or when the fit or the held-out split is empty (T = 0, or one non-empty
/// sequence of 1 token).
TokenSplit fit_heldout_split(std::span<const int64_t> seq_offsets, int64_t T);

/// The token ranges a fitted quantizer (Lloyd-Max codebooks, transform coding) fits on: the fit split's, or
/// every token {[0, T)} when the split is empty (one sequence of 1 token). Throws std::invalid_argument for
/// bad seq_offsets (validate_seq_offsets of quantize.h).
std::vector<std::pair<int64_t, int64_t>> quantizer_fit_ranges(std::span<const int64_t> seq_offsets, int64_t T);

/// The largest basis rank that `fit_tokens` fit tokens determine: fit_tokens − 1 when centered (the
/// fit mean takes one degree of freedom), else fit_tokens; 0 when there is none. The SVD and
/// shared-basis probes reject a larger rank; the study caps its automatic ranks at it.
int64_t max_fit_rank(int64_t fit_tokens, bool centered);

}  // namespace latentq::probes
