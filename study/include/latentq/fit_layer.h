// latentq/fit_layer.h — the one fit of a transform from a dump: fit_layer_rotation reads what the transform's row
// of the table says its fit needs (latentq/transform.h kTransforms, TransformFit: the target's latent; for Queries
// also the layer's query rows, q_nope with W_UK for c_kv, q_pe for k_pe) and fits it with probes::fit_rotation
// (latentq/analysis/fit_transform.h). The study calls it on the layers it holds (latentq/layer_shared.h); the
// Python module calls it on a dump path (latentq.fit_layer_rotation), so the e2e step injects the study's basis.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "latentq/dump.h"
#include "latentq/quantize.h"
#include "latentq/transform.h"

namespace latentq {

/// The transform `t` of layer l's target (c_kv or k_pe) in `dump`: fit_rotation of its latent, and for a fit that
/// reads the query rows (fit_reads_queries) the score metric of its fit-split query rows (probes::fit_score_metric:
/// q_nope and W_UK for c_kv, q_pe for k_pe); Rotation::make for a built transform. Throws std::invalid_argument
/// naming the dump, layer and target for such a fit on a layer loaded without its attention datasets, and as
/// fit_rotation / fit_score_metric.
Rotation fit_layer_rotation(const Dump& dump, const Layer& l, Target target, const Transform& t);

/// The same, read from the file `dump`: layer `layer`, with its attention datasets only when t's fit reads the query
/// rows (load_dump, validated as the study validates it). Throws as load_dump (the path, layer and dataset named: a
/// layer not in the file) and as above (a dump without query rows for such a fit).
Rotation fit_layer_rotation(const std::filesystem::path& dump, int layer, Target target, const Transform& t);

/// Why `dump` cannot give t's fit on `layers` (every layer of the file when empty), or "" when nothing is known to
/// stop it: for a fit that reads the query rows, the first of those layers without them ("<dump> has no query rows
/// in /layers/002, which sklt fits on"). Reads no values. Throws as layers_without_query_rows.
std::string fit_layer_missing(const std::filesystem::path& dump, const std::vector<int>& layers, const Transform& t);

}  // namespace latentq
