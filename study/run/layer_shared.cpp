// The per-layer shared values of latentq/layer_shared.h.
#include "latentq/layer_shared.h"

#include <fmt/format.h>

#include <stdexcept>

#include "latentq/analysis/svd_probe.h"

namespace latentq {

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
    return rotate_latent(layer_rotation(in, layer, target, t), l.rows(target).data(),
                         l.num_rows(target, d.seq_offsets), d.attrs.width(target));
  });
}

QuantizedTensor quantize_dequantize_layer(const LayerAccess& in, int layer, Target target, const QuantSpec& spec,
                                          const Transform& t, float* out) {
  const Dump& d = in.header();
  const std::vector<int64_t>& rows = in.layer(layer).row_offsets(target, d.seq_offsets);  // V4's entries: N rows
  const int64_t T = rows.back(), D = d.attrs.width(target);
  if (t.kind == TransformKind::None)
    return quantize_dequantize(spec, target, in.layer(layer).rows(target).data(), T, D, rows, out);
  const std::shared_ptr<const RotatedLatent> xr = rotated_latent(in, layer, target, t);
  QuantizedTensor q = quantize_dequantize(spec, target, xr->x.data(), T, D, rows, out);
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
