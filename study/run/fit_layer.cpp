// The fit of a transform from a dump (latentq/fit_layer.h).
#include "latentq/fit_layer.h"

#include <fmt/format.h>

#include <stdexcept>

#include "latentq/analysis/fit_transform.h"
#include "latentq/analysis/score_basis.h"

namespace latentq {

Rotation fit_layer_rotation(const Dump& dump, const Layer& l, Target target, const Transform& t) {
  const bool ckv = target == Target::CKV;
  const DumpAttrs& A = dump.attrs;
  const int64_t D = A.width(target);
  const float* X = l.rows(target).data();
  const std::vector<int64_t>& rows = l.row_offsets(target, dump.seq_offsets);  // DeepSeek-V4's entries: N, not T
  if (!fit_reads_queries(t.kind)) return probes::fit_rotation(t, X, rows.back(), D, rows);
  if (!is_latent_target(target))
    throw std::invalid_argument(fmt::format(
        "{}: layer {} {}: transform {} fits the attention's score metric of c_kv or k_pe; the indexer's score "
        "(a relu of q·k) has none: use a transform without queries (had, rot, klt)",
        dump.path.string(), l.index, to_string(target), t.to_string()));
  if (!l.has_attention())
    throw std::invalid_argument(fmt::format(
        "{}: layer {} {}: transform {} fits its score metric on the query rows and W_UK, which are not loaded "
        "(the dump has no attention datasets)",
        dump.path.string(), l.index, to_string(target), t.to_string()));
  const Eigen::MatrixXd M =
      ckv ? probes::fit_score_metric(l.q_nope, l.w_uk, l.q_rows, A.num_heads, A.qk_nope_head_dim, D, dump.seq_offsets,
                                     dump.num_tokens())
          : probes::fit_score_metric(l.q_pe, {}, l.q_rows, A.num_heads, A.qk_rope_head_dim, D, dump.seq_offsets,
                                     dump.num_tokens());
  return probes::fit_rotation(t, X, dump.num_tokens(), D, dump.seq_offsets, &M);
}

Rotation fit_layer_rotation(const std::filesystem::path& dump, int layer, Target target, const Transform& t) {
  LoadOptions o;
  o.layers = {layer};
  o.attention = fit_reads_queries(t.kind);
  const Dump d = load_dump(dump, o);
  return fit_layer_rotation(d, d.layers.front(), target, t);
}

std::string fit_layer_missing(const std::filesystem::path& dump, const std::vector<int>& layers, const Transform& t) {
  if (!fit_reads_queries(t.kind)) return "";
  const std::vector<int> bare = layers_without_query_rows(dump, layers);
  return bare.empty() ? "" : fmt::format("{} has no query rows in /layers/{:03d}, which {} fits on", dump.string(),
                                         bare.front(), t.to_string());
}

}  // namespace latentq
