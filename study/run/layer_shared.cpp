// The per-layer shared values of latentq/layer_shared.h.
#include "latentq/layer_shared.h"

#include <fmt/format.h>

#include <stdexcept>

#include "latentq/analysis/score_basis.h"
#include "latentq/analysis/svd_probe.h"

namespace latentq {

Rotation fit_layer_rotation(const Dump& dump, const Layer& l, Target target, const Transform& t) {
  const bool ckv = target == Target::CKV;
  const DumpAttrs& A = dump.attrs;
  const int64_t D = ckv ? A.kv_lora_rank : A.qk_rope_head_dim;
  const float* X = ckv ? l.c_kv.data() : l.k_pe.data();
  if (t.kind != TransformKind::ScoreKlt) return probes::fit_rotation(t, X, dump.num_tokens(), D, dump.seq_offsets);
  if (!l.has_attention())
    throw std::invalid_argument(fmt::format(
        "{}: layer {} {}: transform sklt fits its score metric on the query rows and W_UK, which are not loaded "
        "(the dump has no attention datasets)",
        dump.path.string(), l.index, to_string(target)));
  const Eigen::MatrixXd M =
      ckv ? probes::fit_score_metric(l.q_nope, l.w_uk, l.q_rows, A.num_heads, A.qk_nope_head_dim, D, dump.seq_offsets,
                                     dump.num_tokens())
          : probes::fit_score_metric(l.q_pe, {}, l.q_rows, A.num_heads, A.qk_rope_head_dim, D, dump.seq_offsets,
                                     dump.num_tokens());
  return probes::fit_rotation(t, X, dump.num_tokens(), D, dump.seq_offsets, &M);
}

std::shared_ptr<const Rotation> layer_rotation(const LayerAccess& in, int layer, Target target, const Transform& t) {
  static const std::shared_ptr<const Rotation> identity = std::make_shared<const Rotation>();
  if (t.kind == TransformKind::None) return identity;
  return in.shared<Rotation>(layer, fmt::format("rotation/{}/{}", to_string(target), t.to_string()),
                             [&] { return fit_layer_rotation(in.header(), in.layer(layer), target, t); });
}

std::shared_ptr<const RotatedLatent> rotated_latent(const LayerAccess& in, int layer, Target target,
                                                    const Transform& t) {
  if (t.kind == TransformKind::None)
    throw std::invalid_argument(
        fmt::format("rotated_latent: layer {} {}: no transform to rotate by", layer, to_string(target)));
  return in.shared<RotatedLatent>(layer, fmt::format("rotated/{}/{}", to_string(target), t.to_string()), [&] {
    const Dump& d = in.header();
    const Layer& l = in.layer(layer);
    const bool ckv = target == Target::CKV;
    return rotate_latent(layer_rotation(in, layer, target, t), ckv ? l.c_kv.data() : l.k_pe.data(), d.num_tokens(),
                         ckv ? d.attrs.kv_lora_rank : d.attrs.qk_rope_head_dim);
  });
}

QuantizedTensor quantize_dequantize_layer(const LayerAccess& in, int layer, Target target, const QuantSpec& spec,
                                          const Transform& t, float* out) {
  const Dump& d = in.header();
  const int64_t T = d.num_tokens(), D = target == Target::CKV ? d.attrs.kv_lora_rank : d.attrs.qk_rope_head_dim;
  if (t.kind == TransformKind::None) {
    const Layer& l = in.layer(layer);
    return quantize_dequantize(spec, target, target == Target::CKV ? l.c_kv.data() : l.k_pe.data(), T, D, d.seq_offsets,
                               out);
  }
  const std::shared_ptr<const RotatedLatent> xr = rotated_latent(in, layer, target, t);
  QuantizedTensor q = quantize_dequantize(spec, target, xr->x.data(), T, D, d.seq_offsets, out);
  xr->rotation->inverse(out, T, D);
  return q;
}

std::shared_ptr<const probes::SvdSplitFit> svd_split_fit(const LayerAccess& in, int layer, bool centered) {
  return in.shared<probes::SvdSplitFit>(layer, centered ? "svd.fit/centered" : "svd.fit/uncentered", [&] {
    const Dump& d = in.header();
    return probes::fit_svd_split(in.layer(layer).c_kv.data(), d.num_tokens(), d.attrs.kv_lora_rank, d.seq_offsets,
                                 centered);
  });
}

}  // namespace latentq
