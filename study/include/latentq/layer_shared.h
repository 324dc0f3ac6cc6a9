// latentq/layer_shared.h — values made once per held layer and shared by the cells that read it (the latent
// cells and the probe cells alike): a target's rotation (transform stage), its rotated copy, a quantize +
// dequantize behind a transform, and the c_kv fit of the SVD basis. Each lives in the layer's shared store
// (LayerAccess::shared) and is dropped with the layer (latentq/layer_store.h).
#pragma once

#include <memory>

#include "latentq/analysis/svd_probe.h"
#include "latentq/fit_layer.h"
#include "latentq/probe_registry.h"
#include "latentq/quantize.h"
#include "latentq/study.h"
#include "latentq/transform.h"

namespace latentq {

/// The rotation of transform `t` for one layer's target (c_kv or k_pe), as fit_layer_rotation (latentq/fit_layer.h)
/// builds it (klt: the PCA basis of the layer's fit split; rot: the seeded Haar matrix; had: the FWHT): fitted
/// once per (layer, target, transform) while the layer is held and shared by the probe cells that
/// quantize through it (/attention_error, /attention_check's fold, /attention_position). The identity
/// for TransformKind::None. Throws as fit_layer_rotation.
std::shared_ptr<const Rotation> layer_rotation(const LayerAccess& in, int layer, Target target, const Transform& t);
/// The layer's c_kv or k_pe rotated by layer_rotation(in, layer, target, t) (with that rotation): made once
/// per (layer, target, transform) while the layer is held and shared by the latent cells and the probe
/// cells that quantize behind t, so each (layer, target, transform) is rotated forward once. Memory: one
/// [T, D] float32 matrix per transform while the layer is held. Throws std::invalid_argument for
/// TransformKind::None (nothing to rotate), and as layer_rotation.
std::shared_ptr<const RotatedLatent> rotated_latent(const LayerAccess& in, int layer, Target target,
                                                    const Transform& t);
/// quantize_dequantize_rotated(spec, *layer_rotation(in, layer, target, t), target, the layer's c_kv or k_pe,
/// ...) into out [T, D] (row-major float32), the forward rotation taken from rotated_latent(): the same
/// values. Returns the stored tensor. Throws as quantize() and rotated_latent().
QuantizedTensor quantize_dequantize_layer(const LayerAccess& in, int layer, Target target, const QuantSpec& spec,
                                          const Transform& t, float* out);
/// The layer's c_kv fit of the SVD basis (probes::fit_svd_split, centered or not): made once per (layer,
/// centering) while the layer is held and shared by the SVD probe, the shared-basis probe's per-layer side
/// and the svd-rank attention cells. Throws as fit_svd_split.
std::shared_ptr<const probes::SvdSplitFit> svd_split_fit(const LayerAccess& in, int layer, bool centered);

}  // namespace latentq
