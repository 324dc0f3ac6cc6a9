// latentq/probes/split.h — the fit / held-out token split shared by the SVD and cross-layer probes.
//
// Rule (whole sequences, so no sequence is seen by both the fit and the evaluation):
//   S ≥ 2 sequences: fit = sequences [0, ⌊S/2⌋), held-out = sequences [⌊S/2⌋, S)
//                    (S = 3 fits on 1 sequence and evaluates on 2);
//   S = 1          : fit = tokens [0, ⌊T/2⌋), held-out = tokens [⌊T/2⌋, T) of that sequence.
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
/// validate_seq_offsets) or when the fit or the held-out split is empty.
TokenSplit fit_heldout_split(std::span<const int64_t> seq_offsets, int64_t T);

}  // namespace latentq::probes
