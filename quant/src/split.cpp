#include "latentq/split.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "latentq/quantize.h"

namespace latentq::probes {

int64_t TokenSplit::fit_tokens() const {
  int64_t n = 0;
  for (const auto& [b, e] : fit) n += e - b;
  return n;
}

int64_t TokenSplit::heldout_tokens() const {
  int64_t n = 0;
  for (const auto& [b, e] : heldout) n += e - b;
  return n;
}

void validate_seq_offsets(std::span<const int64_t> seq_offsets, int64_t T, std::string_view what) {
  const std::string name(what);
  if (seq_offsets.size() < 2)
    throw std::invalid_argument(name + ": expected [S+1] offsets with S >= 1, got " +
                                std::to_string(seq_offsets.size()) + " entries");
  if (seq_offsets.front() != 0)
    throw std::invalid_argument(name + "[0] = " + std::to_string(seq_offsets.front()) + ", expected 0");
  if (seq_offsets.back() != T)
    throw std::invalid_argument(name + "[S] = " + std::to_string(seq_offsets.back()) +
                                ", expected T = " + std::to_string(T));
  for (size_t s = 1; s < seq_offsets.size(); ++s)
    if (seq_offsets[s] < seq_offsets[s - 1])
      throw std::invalid_argument(name + " not non-decreasing at entry " + std::to_string(s) + " (" +
                                  std::to_string(seq_offsets[s - 1]) + " > " + std::to_string(seq_offsets[s]) + ")");
}

TokenSplit fit_heldout_split(std::span<const int64_t> seq_offsets, int64_t T) {
  validate_seq_offsets(seq_offsets, T);
  const int64_t S = static_cast<int64_t>(seq_offsets.size()) - 1;
  // The non-empty sequences [begin, end): an empty one holds no token and takes no place in the split.
  std::vector<std::pair<int64_t, int64_t>> seqs;
  for (int64_t s = 0; s < S; ++s)
    if (seq_offsets[s + 1] > seq_offsets[s]) seqs.emplace_back(seq_offsets[s], seq_offsets[s + 1]);
  const int64_t N = static_cast<int64_t>(seqs.size());
  TokenSplit split;
  if (N == 1) {
    const auto [b, e] = seqs.front();
    const int64_t mid = b + (e - b) / 2;
    if (mid > b) split.fit.emplace_back(b, mid);
    split.heldout.emplace_back(mid, e);
  } else {
    for (int64_t i = 0; i < N; ++i) (i < N / 2 ? split.fit : split.heldout).push_back(seqs[static_cast<size_t>(i)]);
  }
  if (split.fit_tokens() == 0 || split.heldout_tokens() == 0)
    throw std::invalid_argument("seq_offsets: the fit/held-out split (" +
                                std::string(N == 1 ? "the halves of the only non-empty sequence"
                                                   : "the first half of the non-empty sequences / the rest") +
                                "; " + std::to_string(N) + " of " + std::to_string(S) +
                                " sequences are non-empty) leaves " + std::to_string(split.fit_tokens()) + " fit and " +
                                std::to_string(split.heldout_tokens()) + " held-out tokens; both must be non-empty");
  return split;
}

int64_t max_fit_rank(int64_t fit_tokens, bool centered) {
  return std::max<int64_t>(0, fit_tokens - (centered ? 1 : 0));
}

std::vector<std::pair<int64_t, int64_t>> quantizer_fit_ranges(std::span<const int64_t> seq_offsets, int64_t T) {
  try {
    return fit_heldout_split(seq_offsets, T).fit;
  } catch (const std::invalid_argument&) {
    latentq::validate_seq_offsets(seq_offsets, T);  // bad offsets stay an error; only a split too small falls back
    return {{0, T}};
  }
}

}  // namespace latentq::probes
