#include "latentq/probes/split.h"

#include <stdexcept>
#include <string>

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
    throw std::invalid_argument(name + "[S] = " + std::to_string(seq_offsets.back()) + ", expected T = " +
                                std::to_string(T));
  for (size_t s = 1; s < seq_offsets.size(); ++s)
    if (seq_offsets[s] < seq_offsets[s - 1])
      throw std::invalid_argument(name + " not non-decreasing at entry " + std::to_string(s) + " (" +
                                  std::to_string(seq_offsets[s - 1]) + " > " + std::to_string(seq_offsets[s]) + ")");
}

TokenSplit fit_heldout_split(std::span<const int64_t> seq_offsets, int64_t T) {
  validate_seq_offsets(seq_offsets, T);
  const int64_t S = static_cast<int64_t>(seq_offsets.size()) - 1;
  TokenSplit split;
  if (S == 1) {
    split.fit.emplace_back(0, T / 2);
    split.heldout.emplace_back(T / 2, T);
  } else {
    const int64_t half = S / 2;
    for (int64_t s = 0; s < S; ++s) {
      if (seq_offsets[s + 1] == seq_offsets[s]) continue;  // empty sequence
      (s < half ? split.fit : split.heldout).emplace_back(seq_offsets[s], seq_offsets[s + 1]);
    }
  }
  if (split.fit_tokens() == 0 || split.heldout_tokens() == 0)
    throw std::invalid_argument("seq_offsets: the fit/held-out split (first half of the " + std::to_string(S) +
                                " sequence(s) / the rest) leaves " + std::to_string(split.fit_tokens()) +
                                " fit and " + std::to_string(split.heldout_tokens()) +
                                " held-out tokens; both must be non-empty");
  return split;
}

}  // namespace latentq::probes
