// latentq/attention/dsa.h — DeepSeek Sparse Attention's selection: the keys each query row reads, from the
// tensors a DSA indexer cache and its queries hold (DeepSeek-V3.2, GLM-5). Written from transformers 5.24.0
// models/deepseek_v32/modeling_deepseek_v32.py (DeepseekV32Indexer.forward), as python/latentq/sparse_mla.py:
//   score[q, t] = Σ_h index_w[q, h] · relu(softmax_scale · index_q[q, h, :] · index_k[t, :])
//   the row reads the top-`topk` keys of its causal window by score (all of them when the window holds no more);
//   ties at the k-th score go to the lower key index.
#pragma once

#include <cstdint>
#include <span>

#include "latentq/attention/types.h"

namespace latentq::probes {

/// The selection (CSR by query row; key index j: token seq_offsets[s] + j) of the DSA indexer for index_q
/// [Tq, n_heads, dim], index_w [Tq, n_heads] (n_heads^-0.5 applied), index_k [T, dim]; q_rows [Tq] token indices,
/// seq_offsets [S+1]. Scores in float64. Throws std::invalid_argument for sizes that do not match, topk < 1, a
/// softmax_scale that is not finite and > 0, or a q_row outside [0, T).
KeySelection dsa_select_topk(std::span<const float> index_q, std::span<const float> index_w,
                             std::span<const float> index_k, int64_t n_heads, int64_t dim,
                             std::span<const int32_t> q_rows, std::span<const int64_t> seq_offsets,
                             double softmax_scale, int64_t topk);

}  // namespace latentq::probes
