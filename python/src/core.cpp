// latentq._core, the compiled part of the `latentq` Python package (python/latentq/__init__.py
// re-exports its names): the C++ quantizers (latentq/quantize.h) on numpy arrays. Quantization and
// dequantization run the very same C++ reference code as the CLI, so a decode here is
// byte-identical to the C++ one.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "latentq/analysis/fit_transform.h"
#include "latentq/analysis/score_basis.h"
#include "latentq/decode_order.h"
#include "latentq/fit_layer.h"
#include "latentq/metrics.h"
#include "latentq/quantize.h"
#include "latentq/split.h"
#include "latentq/transform.h"
#include "latentq/turboquant.h"

namespace py = pybind11;
using namespace latentq;

void def_attention_v4(py::module_& m);  // attention_v4.cpp: DeepSeek-V4's attention (latentq/attention/v4.h)

namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

// Checks a [T, D] float32 matrix; raises ValueError naming the shape otherwise.
std::pair<int64_t, int64_t> matrix_shape(const F32Array& x) {
  if (x.ndim() != 2)
    throw py::value_error("expected a 2-D float32 array [T, D], got " + std::to_string(x.ndim()) + " dimensions");
  return {x.shape(0), x.shape(1)};
}

std::vector<int64_t> offsets_or_single(const std::optional<std::vector<int64_t>>& so, int64_t T) {
  return so ? *so : std::vector<int64_t>{0, T};
}

// The fitted transforms' names, from the table: "'klt,...' or 'sklt,...'".
std::string fitted_spec_forms() {
  std::string out;
  for (const TransformTraits& r : kTransforms)
    if (fitted_transform(r.kind)) out += std::string(out.empty() ? "'" : "' or '") + r.name + ",...";
  return out + "'";
}

// The basis of a transform as fit_layer_rotation / fit_rotation return it: for a rotation (the table's orthogonal)
// R float32 [D, D] row-major (x' = R @ x), else (A, A⁻¹) float32 [2, D, D] (x' = A @ x).
py::array_t<float> basis_array(const Rotation& r, const Transform& t) {
  const int64_t D = r.dim();
  const bool orth = traits(t.kind).orthogonal;
  py::array_t<float> out(orth ? std::vector<py::ssize_t>{D, D} : std::vector<py::ssize_t>{2, D, D});
  const std::vector<float> R = r.matrix();
  std::memcpy(out.mutable_data(), R.data(), R.size() * sizeof(float));
  if (!orth) {
    const std::vector<float> Ri = r.inverse_matrix();
    std::memcpy(out.mutable_data() + D * D, Ri.data(), Ri.size() * sizeof(float));
  }
  return out;
}

// The rotation of a transformed spec for rows of D elements: Rotation::make for a built transform (none, had,
// rot); for a fitted one the given basis as basis_array() gives it. Raises ValueError for a fitted spec without a
// basis, a basis with a built transform, or a basis of another shape.
Rotation spec_rotation(const TransformedSpec& ts, int64_t D, const std::optional<F32Array>& basis) {
  const std::string name = ts.to_string();
  if (!fitted_transform(ts.transform.kind)) {
    if (basis) throw py::value_error("'" + name + "': basis is only for a " + fitted_spec_forms() + " spec");
    return Rotation::make(ts.transform, D);
  }
  const bool orth = traits(ts.transform.kind).orthogonal;
  if (!basis)
    throw py::value_error("'" + name + "': a " + ts.transform.to_string() +
                          " spec needs its basis (basis=fit_layer_rotation(dump, layer, target, transform) of the "
                          "study's dump)");
  const std::string want = std::string(orth ? "[" : "[2, ") + std::to_string(D) + ", " + std::to_string(D) + "]";
  const bool ok = orth ? basis->ndim() == 2 && basis->shape(0) == D && basis->shape(1) == D
                       : basis->ndim() == 3 && basis->shape(0) == 2 && basis->shape(1) == D && basis->shape(2) == D;
  if (!ok) throw py::value_error("'" + name + "': basis must be float32 " + want + " for rows of " + std::to_string(D) +
                                 " elements");
  const float* b = basis->data();
  if (orth) return Rotation::dense(D, std::vector<float>(b, b + D * D));
  return Rotation::dense_invertible(D, std::vector<float>(b, b + D * D), std::vector<float>(b + D * D, b + 2 * D * D));
}

template <typename T>
py::array_t<T> to_numpy(const std::vector<uint8_t>& bytes, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  if (!bytes.empty()) std::memcpy(a.mutable_data(), bytes.data(), bytes.size());
  return a;
}

// Stored scale/offset bytes as a typed 1-D array: fp16 -> float16, fp32 -> float32, UE8M0/e4m3 -> uint8 raw bits.
py::object stored_values(const std::vector<uint8_t>& bytes, ScaleDtype d) {
  const py::ssize_t n = static_cast<py::ssize_t>(bytes.size()) / qmath::scale_dtype_bytes(d);
  switch (d) {
    case ScaleDtype::F16:
      return to_numpy<uint16_t>(bytes, {n}).attr("view")("float16");
    case ScaleDtype::F32:
      return to_numpy<float>(bytes, {n});
    default:
      return to_numpy<uint8_t>(bytes, {n});
  }
}

// The module's parts, one function each; PYBIND11_MODULE below calls them in this order.

// QuantizedTensor: the real storage of a quantized matrix, read-only from Python.
void def_quantized_tensor(py::module_& m) {
  py::class_<QuantizedTensor>(m, "QuantizedTensor",
                              "Real storage of a quantized [rows, cols] matrix (layout: latentq/quantize.h).")
      .def_property_readonly("spec", [](const QuantizedTensor& q) { return q.spec.to_string(); })
      .def_readonly("rows", &QuantizedTensor::rows)
      .def_readonly("cols", &QuantizedTensor::cols)
      .def_property_readonly(
          "codes",
          [](const QuantizedTensor& q) {
            return to_numpy<uint8_t>(q.codes, {q.rows, q.row_bytes()});
          },
          "uint8 [rows, row_bytes] packed codes (INT4: element 2k in the low nibble of byte k).")
      .def_property_readonly(
          "scales", [](const QuantizedTensor& q) { return stored_values(q.scales, q.spec.scale_dtype); },
          "1-D scales as stored: float16 / float32, or uint8 raw bits for UE8M0 and e4m3 scales\n"
          "([T * blocks_per_row] for per-token groups and block formats, [G * D] per-channel, [1] per-tensor).")
      .def_property_readonly(
          "offsets", [](const QuantizedTensor& q) { return stored_values(q.offsets, q.spec.scale_dtype); },
          "1-D offsets (asymmetric int and q4_1; empty otherwise), same dtype and layout as scales.")
      .def_property_readonly(
          "global_scale",
          [](const QuantizedTensor& q) {
            return to_numpy<float>(q.global, {static_cast<py::ssize_t>(q.global.size() / 4)});
          },
          "float32 [1] per-tensor scale (fp8-e4m3-tensor, nvfp4), float32 [0] otherwise.")
      .def_readonly("group_bounds", &QuantizedTensor::group_bounds)
      .def_property_readonly("storage_bytes", &QuantizedTensor::storage_bytes)
      .def_property_readonly("bits_per_element", [](const QuantizedTensor& q) { return account(q).bits_per_element; })
      .def_property_readonly("bytes_per_token", [](const QuantizedTensor& q) { return account(q).bytes_per_token; });
}

// Threads, quantize, dequantize and quantize_dequantize (transforms included).
void def_quantizers(py::module_& m) {
  m.def("set_cpu_threads", &set_cpu_threads, py::arg("n"),
        "Worker threads of the integer quantize/dequantize on matrices of at least 2^20 elements (the C++\n"
        "set_cpu_threads, latentq/quantize.h; default 1; n < 1 is taken as 1). The bytes do not depend on it.");
  m.def("cpu_threads", &cpu_threads, "The current set_cpu_threads value.");
  m.def(
      "quantize",
      [](const F32Array& x, const std::string& spec, const std::string& target,
         std::optional<std::vector<int64_t>> seq_offsets) {
        auto [T, D] = matrix_shape(x);
        const auto so = offsets_or_single(seq_offsets, T);
        py::gil_scoped_release nogil;
        return quantize(QuantSpec::parse(spec), parse_target(target), x.data(), T, D, so);
      },
      py::arg("x"), py::arg("spec"), py::arg("target") = "c_kv", py::arg("seq_offsets") = py::none(),
      "Quantize x: float32 [T, D] row-major (c_kv or k_pe). seq_offsets: int64 [S+1] sequence boundaries\n"
      "(per-channel groups never cross them; default one sequence). Returns a QuantizedTensor.\n"
      "Raises ValueError for an unknown spec/target, an empty matrix, NaN/Inf, or a scale overflowing fp16.");
  m.def(
      "dequantize",
      [](const QuantizedTensor& q) {
        py::array_t<float> out({q.rows, q.cols});
        float* o = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          dequantize(q, o);
        }
        return out;
      },
      py::arg("q"), "Decode a QuantizedTensor into float32 [rows, cols] (the C++ decode, bit for bit).");
  m.def(
      "quantize_dequantize",
      [](const F32Array& x, const std::string& spec, const std::string& target,
         std::optional<std::vector<int64_t>> seq_offsets, std::optional<F32Array> basis) {
        auto [T, D] = matrix_shape(x);
        const auto so = offsets_or_single(seq_offsets, T);
        const TransformedSpec ts = TransformedSpec::parse(spec);
        const Rotation r = spec_rotation(ts, D, basis);
        py::array_t<float> out({T, D});
        float* o = out.mutable_data();
        {
          py::gil_scoped_release nogil;
          quantize_dequantize_rotated(ts.spec, r, parse_target(target), x.data(), T, D, so, o);
        }
        return out;
      },
      py::arg("x"), py::arg("spec"), py::arg("target") = "c_kv", py::arg("seq_offsets") = py::none(),
      py::arg("basis") = py::none(),
      "Quantize then dequantize x float32 [T, D]; returns float32 [T, D]. Same errors as quantize().\n"
      "A transformed spec ('had,int4-asym-token', 'rot,mxfp4') quantizes the rotated rows and returns them\n"
      "un-rotated (the C++ quantize_dequantize_rotated). A fitted spec takes its basis as fit_layer_rotation returns\n"
      "it for the study's dump: 'klt,...' R float32 [D, D], 'sklt,...' (A, A^-1) float32 [2, D, D] (returned as\n"
      "A^-1 @ qd(A @ x)); ValueError without it or with another shape.");
}

// Rotations, engine records and the diagnostics of a quantized tensor.
void def_records(py::module_& m) {
  m.def(
      "rotation_matrix",
      [](const std::string& transform, int64_t d) {
        const std::vector<float> R = Rotation::make(Transform::parse(transform), d).matrix();
        if (R.empty()) throw std::invalid_argument("rotation_matrix: transform '" + transform + "' is the identity");
        py::array_t<float> out({d, d});
        std::memcpy(out.mutable_data(), R.data(), R.size() * sizeof(float));
        return out;
      },
      py::arg("transform"), py::arg("d"),
      "The orthogonal R float32 [d, d] of a transform ('had', 'had64-s3', 'rot', 'rot-s1'; latentq/transform.h):\n"
      "x' = R @ x. Raises ValueError for an unknown transform, a Hadamard block that does not fit d, or 'klt'\n"
      "(fitted on a dump's fit split by the C++ study).");
  m.def(
      "fit_rotation",
      [](const F32Array& x, const std::string& transform, std::optional<std::vector<int64_t>> seq_offsets,
         std::optional<F32Array> q, std::optional<F32Array> w, std::optional<std::vector<int32_t>> q_rows) {
        auto [T, D] = matrix_shape(x);
        const auto so = offsets_or_single(seq_offsets, T);
        const Transform t = Transform::parse(transform);
        if (t.kind == TransformKind::None) throw py::value_error("fit_rotation: no transform given ('')");
        const bool queries = fit_reads_queries(t.kind);
        if (queries && (!q || !q_rows || q->ndim() != 3))
          throw py::value_error("fit_rotation: " + t.to_string() +
                                " needs q [Tq, H, dq] float32 and q_rows [Tq] (and w for c_kv)");
        if (!queries && (q || w || q_rows))
          throw py::value_error("fit_rotation: q, w and q_rows are only for a transform fitted on the query rows, "
                                "not " + t.to_string());
        Rotation r;
        {
          py::gil_scoped_release nogil;
          Eigen::MatrixXd M;
          if (queries) {
            const auto qs = std::span<const float>(q->data(), static_cast<size_t>(q->size()));
            const auto ws = w ? std::span<const float>(w->data(), static_cast<size_t>(w->size())) : std::span<const float>{};
            M = probes::fit_score_metric(qs, ws, *q_rows, q->shape(1), q->shape(2), D, so, T);
          }
          r = probes::fit_rotation(t, x.data(), T, D, so, queries ? &M : nullptr);
        }
        return basis_array(r, t);
      },
      py::arg("x"), py::arg("transform"), py::arg("seq_offsets") = py::none(), py::arg("q") = py::none(),
      py::arg("w") = py::none(), py::arg("q_rows") = py::none(),
      "The transform fitted on one target x float32 [T, D] with sequences seq_offsets [S+1]\n"
      "(latentq/analysis/fit_transform.h fit_rotation): for 'klt' R float32 [D, D] (x' = R @ x), the eigenbasis of\n"
      "the fit split's uncentered second moment (latentq/split.h), rows by descending variance; for 'had' / 'rot' the\n"
      "fixed matrix of rotation_matrix; for 'sklt' float32 [2, D, D] = (A, A^-1), the score-metric KLT\n"
      "(latentq/analysis/score_basis.h) under the metric of the query rows in the fit split: q [Tq, H, dq]\n"
      "(q_nope for c_kv, with w = W_UK [H, dq, D]; q_pe for k_pe, w None), q_rows [Tq] their token indices.\n"
      "fit_layer_rotation gives the study's basis from its dump. Raises ValueError for bad seq_offsets, an empty\n"
      "fit split, NaN/Inf, no query row in the fit split, an unknown or empty transform.");
  m.def(
      "pack_record",
      [](const QuantizedTensor& ckv, const QuantizedTensor& kpe, const std::string& preset) {
        const std::vector<uint8_t> r = pack_record(QuantSpec::parse(preset), ckv, kpe);
        return to_numpy<uint8_t>(r, {ckv.rows, static_cast<py::ssize_t>(r.size()) / std::max<int64_t>(ckv.rows, 1)});
      },
      py::arg("q_ckv"), py::arg("q_kpe"), py::arg("preset"),
      "The engine's per-token record of a preset (e.g. 'flashmla-v32-fp8') from c_kv and k_pe quantized with it:\n"
      "uint8 [T, record_bytes]. Raises ValueError for a spec mismatch or widths the engine record does not hold.");
  m.def(
      "record_bytes",
      [](const std::string& preset, int64_t d_ckv, int64_t d_kpe) {
        return record_bytes(QuantSpec::parse(preset), d_ckv, d_kpe);
      },
      py::arg("preset"), py::arg("d_ckv"), py::arg("d_kpe"),
      "Bytes per token of a preset's record at these widths (one layer).");
  m.def(
      "diagnose",
      [](const QuantizedTensor& q, const F32Array& x) {
        auto [T, D] = matrix_shape(x);
        if (T != q.rows || D != q.cols) throw py::value_error("x must be the [rows, cols] matrix q was quantized from");
        const QuantDiagnostics d = diagnose(q, x.data());
        return py::dict(py::arg("scale_underflow") = d.scale_underflow, py::arg("offset_rounding") = d.offset_rounding,
                        py::arg("saturated") = d.saturated);
      },
      py::arg("q"), py::arg("x"),
      "Precision lost silently under the format's conventions: groups whose scale underflowed to zero/subnormal,\n"
      "asymmetric groups whose stored offset is off the min by more than half a step, saturated values.");
}

// The decode-order cache model (latentq/decode_order.h).
void def_decode_order(py::module_& m) {
  m.def(
      "token_split",
      [](const std::vector<int64_t>& seq_offsets) {
        if (seq_offsets.empty()) throw py::value_error("token_split: seq_offsets is empty");
        const probes::TokenSplit s = probes::fit_heldout_split(seq_offsets, seq_offsets.back());
        return py::make_tuple(s.fit, s.heldout);
      },
      py::arg("seq_offsets"),
      "The fit / held-out token split of sequences seq_offsets [S+1] (latentq/split.h fit_heldout_split, the one\n"
      "rule the SVD probe, the bounds and the fitted quantizers use): (fit, heldout), each a list of [begin, end)\n"
      "token ranges. Raises ValueError for bad seq_offsets or an empty split.");
  m.def(
      "decode_token_group",
      [](const std::string& spec) { return decode_token_group(TransformedSpec::parse(spec).spec); }, py::arg("spec"),
      "G of a spec in the decode-order cache model (latentq/decode_order.h): group_size of a per-channel integer\n"
      "spec with group_size > 0, else 1.");
  m.def(
      "decode_scale_is_causal",
      [](const std::string& spec) { return decode_scale_is_causal(TransformedSpec::parse(spec).spec); },
      py::arg("spec"),
      "False when the spec's scale spans the sequence (per-tensor, channel-g0, nvfp4, fp8-e4m3-tensor).");
  m.def(
      "decode_order",
      [](const std::string& mode) {
        const DecodeOrder o = DecodeOrder::parse(mode);
        return py::make_tuple(o.residual, o.sink, o.prefill);
      },
      py::arg("mode"),
      "(residual R, sink S, prefill P) of a cache-mode label: 'prefill-at-once' is (0, 0, 0), 'decode-r<R>-s<S>-p<P>'\n"
      "its three ints (latentq/decode_order.h DecodeOrder::parse, the one grammar; canonical labels only). Raises\n"
      "ValueError naming a malformed label.");
  m.def(
      "decode_order_mask",
      [](const std::string& mode, int64_t L, int64_t G) {
        const DecodeOrder o = DecodeOrder::parse(mode);
        if (L < 0 || G < 1) throw py::value_error("decode_order_mask: need L >= 0 and G >= 1");
        py::array_t<bool> out({L, L});
        bool* m = out.mutable_data();
        for (int64_t t = 0; t < L; ++t)
          for (int64_t j = 0; j < L; ++j) m[t * L + j] = j <= t && o.reads_quantized(t, j, G);
        return out;
      },
      py::arg("mode"), py::arg("L"), py::arg("G"),
      "bool [L, L]: entry (t, j) is True iff the query at position t reads key j (j <= t) from the quantized cache\n"
      "under `mode` ('prefill-at-once' or 'decode-r<R>-s<S>-p<P>'; DecodeOrder::reads_quantized), for token group G.\n"
      "Raises ValueError for a malformed mode.");
  m.def(
      "decode_order_cache_bytes",
      [](const std::string& spec, const std::string& target, int64_t D, const std::vector<int64_t>& seq_offsets,
         const std::string& mode, int64_t D_kpe) {
        const QuantSpec s = TransformedSpec::parse(spec).spec;
        const Target t = parse_target(target);
        if (s.format == Format::Preset && t == Target::CKV && D_kpe <= 0)
          throw std::invalid_argument("decode_order_cache_bytes: " + spec +
                                      " is an engine preset: give D_kpe, the layer's k_pe width (its record's pad, "
                                      "counted with c_kv, depends on it)");
        return decode_order_cache_bytes(s, t, D, seq_offsets, DecodeOrder::parse(mode), D_kpe);
      },
      py::arg("spec"), py::arg("target"), py::arg("D"), py::arg("seq_offsets"), py::arg("mode"), py::arg("D_kpe") = 0,
      "Bytes (int) of one target's decode-order cache of D columns once every sequence of seq_offsets [S+1] is\n"
      "decoded to its end (latentq/decode_order.h decode_order_cache_bytes, the accounting /attention_position\n"
      "uses): the attention sink, the residual window and the incomplete token group in bf16 at 2*D bytes, the\n"
      "complete groups with their metadata (a rotation stores nothing), an engine preset's c_kv with its record's\n"
      "pad (D_kpe: the layer's k_pe width, required then). Raises ValueError for a malformed spec, target or mode,\n"
      "bad seq_offsets, or a width the format's layout refuses.");
  m.def(
      "decode_order_latents",
      [](const F32Array& x, const std::string& spec, const std::string& mode, const std::string& target,
         std::optional<std::vector<int64_t>> seq_offsets, std::optional<F32Array> basis) {
        auto [T, D] = matrix_shape(x);
        const auto so = offsets_or_single(seq_offsets, T);
        const DecodeOrder o = DecodeOrder::parse(mode);
        const TransformedSpec ts = TransformedSpec::parse(spec);
        const Rotation r = spec_rotation(ts, D, basis);
        py::array_t<float> q({T, D}), b({T, D});
        {
          py::gil_scoped_release nogil;
          decode_order_quantize(ts.spec, r, parse_target(target), x.data(), T, D, so, o, q.mutable_data());
          round_bf16(x.data(), T * D, b.mutable_data());
        }
        return py::make_tuple(q, b);
      },
      py::arg("x"), py::arg("spec"), py::arg("mode"), py::arg("target") = "c_kv", py::arg("seq_offsets") = py::none(),
      py::arg("basis") = py::none(),
      "The decode-order cache of x float32 [T, D] (latentq/decode_order.h decode_order_quantize): returns\n"
      "(quantized [T, D], bf16 [T, D]); row j of a sequence is read from `quantized` by the query at t iff\n"
      "decode_order_mask(mode, L, decode_token_group(spec))[t, j]. `basis` as in quantize_dequantize. Same\n"
      "errors as quantize_dequantize.");
}

// Error metrics of a reconstruction.
void def_metrics(py::module_& m) {
  m.def(
      "error_metrics",
      [](const F32Array& x, const F32Array& x_hat) {
        auto [T, D] = matrix_shape(x);
        auto [T2, D2] = matrix_shape(x_hat);
        if (T != T2 || D != D2 || T == 0 || D == 0)
          throw py::value_error("x and x_hat must have the same non-empty [T, D] shape");
        const ErrorMetrics e = error_metrics(x.data(), x_hat.data(), T, D);
        return py::dict(py::arg("rel_fro") = e.rel_fro, py::arg("mse") = e.mse, py::arg("sqnr_db") = e.sqnr_db,
                        py::arg("max_abs_err") = e.max_abs_err, py::arg("cos_mean") = e.cos_mean);
      },
      py::arg("x"), py::arg("x_hat"),
      "rel_fro, mse, sqnr_db, max_abs_err, cos_mean of x_hat against x (float32 [T, D]).");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "latentq: quantizers of the MLA latent KV cache (c_kv [T, kv_lora_rank], k_pe [T, qk_rope_head_dim]).\n"
      "Spec strings as in the C++ CLI, e.g. 'int4-asym-channel-g32', 'fp8-e4m3-tile128-pow2', 'mxfp4', 'q4_0', 'bf16'.";
  py::register_exception<std::invalid_argument>(m, "LatentqError", PyExc_ValueError);

  m.def("spec_grammar", &spec_grammar, "The valid quantizer spec forms.");
  m.def(
      "tq_codebook",
      [](int64_t D, int bits) {
        const qmath::TqCodebook& cb = tq_codebook(D, bits);
        return std::vector<float>(cb.centroid, cb.centroid + cb.levels);
      },
      py::arg("D"), py::arg("bits"),
      "TurboQuant's float32 centroids [2^bits], ascending, for rows of D elements (latentq/turboquant.h:\n"
      "vLLM's solve_lloyd_max on N(0, 1/D)). Raises ValueError for D <= 0 or bits outside 1..4.");
  m.def(
      "canonical_spec", [](const std::string& s) { return TransformedSpec::parse(s).to_string(); },
      "Canonical form of a spec string, '<quantizer>' or '<transform>,<quantizer>' (latentq/transform.h).\n"
      "Raises ValueError (listing the valid forms) for an unknown spec or transform.");

  m.def(
      "format_rows",
      [] {
        py::list rows;
        for (const FormatRow& r : format_rows())
          rows.append(py::dict(py::arg("name") = r.name, py::arg("family") = r.family, py::arg("engine") = r.engine,
                               py::arg("record_bytes") = r.record_bytes,
                               py::arg("bits_per_element") = r.bits_per_element, py::arg("causal") = r.causal,
                               py::arg("shapes") = r.shapes, py::arg("source") = r.source,
                               py::arg("reference") = r.reference));
        return rows;
      },
      "The format table (latentq/spec.h format_rows()): one dict per example spec and engine preset with name,\n"
      "family, engine (the engine and setting that ship it for MLA, '' when none), record_bytes (one token of\n"
      "c_kv 512 + k_pe 64, per-matrix bytes left out; -1: a width the format refuses), bits_per_element,\n"
      "causal, shapes, source and reference (the test against code latentq did not write).");

  m.def(
      "transform_rows",
      [] {
        py::list rows;
        for (const TransformTraits& r : kTransforms) {
          if (r.kind == TransformKind::None) continue;
          const char* fit = r.fit == TransformFit::Built    ? ""
                            : r.fit == TransformFit::Latent ? "latent"
                                                            : "latent+queries";
          rows.append(py::dict(py::arg("name") = r.name, py::arg("block") = r.block, py::arg("seed") = r.seed,
                               py::arg("fitted") = fitted_transform(r.kind), py::arg("fit_reads") = fit,
                               py::arg("orthogonal") = r.orthogonal, py::arg("what") = r.what));
        }
        return rows;
      },
      "The transform table (latentq/transform.h kTransforms): one dict per transform with name ('had', 'klt', ...),\n"
      "block and seed (whether it takes had<N> / -s<seed>), fitted (fitted on the dump: its spec needs a basis),\n"
      "fit_reads ('' built, 'latent' the target alone, 'latent+queries' also the layer's query rows and W_UK),\n"
      "orthogonal (basis R [D, D]; else (A, A^-1) [2, D, D]) and what.");
  m.def(
      "fit_layer_rotation",
      [](const std::string& dump, int layer, const std::string& target, const std::string& transform) {
        const Transform t = Transform::parse(transform);
        if (t.kind == TransformKind::None) throw py::value_error("fit_layer_rotation: no transform given ('')");
        const Target tg = parse_target(target);
        Rotation r;
        {
          py::gil_scoped_release nogil;
          r = fit_layer_rotation(std::filesystem::path(dump), layer, tg, t);
        }
        return basis_array(r, t);
      },
      py::arg("dump"), py::arg("layer"), py::arg("target"), py::arg("transform"),
      "The basis the study fits for transform ('klt', 'sklt', ...; latentq.transform_rows()) on one layer's target\n"
      "('c_kv' or 'k_pe') of the latentq-dump/1 file `dump` (latentq/fit_layer.h fit_layer_rotation: the C++ study's\n"
      "own fit, reading what the transform's fit needs): R float32 [D, D] (x' = R @ x) for a rotation, (A, A^-1)\n"
      "float32 [2, D, D] otherwise; D = kv_lora_rank for c_kv, qk_rope_head_dim for k_pe. The `basis` of\n"
      "quantize_dequantize / decode_order_latents. Raises ValueError naming the file for a layer not in it, a dump\n"
      "without query rows for a fit that reads them, bad content; RuntimeError for a missing or unreadable file.");
  m.def(
      "fit_layer_missing",
      [](const std::string& dump, const std::string& transform, std::optional<std::vector<int>> layers) {
        return fit_layer_missing(std::filesystem::path(dump), layers.value_or(std::vector<int>{}),
                                 Transform::parse(transform));
      },
      py::arg("dump"), py::arg("transform"), py::arg("layers") = py::none(),
      "Why the dump cannot give transform's basis on `layers` (ints; None: every layer of the file), '' when\n"
      "nothing is known to stop it: for a fit that reads the query rows, the first layer without them\n"
      "('<dump> has no query rows in /layers/002, which sklt fits on'). Reads no values. RuntimeError for a\n"
      "missing or unreadable file.");

  def_quantized_tensor(m);
  def_quantizers(m);
  def_records(m);
  def_decode_order(m);
  def_metrics(m);
  def_attention_v4(m);
}
