// latentq._core.v4_attention: DeepSeek-V4's attention of one layer (latentq/attention/v4.h, the C++ engine the
// study's /attention_error runs) on numpy arrays, as a deepseek_v4 dump stores them.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "latentq/attention/v4.h"

namespace py = pybind11;
using namespace latentq::probes;

namespace {

using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using I32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

template <typename T>
std::span<const T> view(const py::array_t<T, py::array::c_style | py::array::forcecast>& a) {
  return {a.data(), static_cast<size_t>(a.size())};
}
template <typename T>
std::span<const T> view(const std::optional<py::array_t<T, py::array::c_style | py::array::forcecast>>& a) {
  return a ? view(*a) : std::span<const T>{};
}

// The one-layer V4 attention: see the docstring below.
template <typename Scalar>
py::tuple run_v4(const std::string& layer_type, const F32& q, const I32& q_rows, const I32& positions,
                 const I64& seq_offsets, const F32& window_kv, const F32& sinks, const F32& rope_cos,
                 const F32& rope_sin, double softmax_scale, int64_t sliding_window,
                 const std::optional<F32>& compressed_kv, const std::optional<I64>& compressed_span,
                 const std::optional<I64>& compressed_offsets, const std::optional<I64>& index_selected,
                 const std::optional<F32>& index_q, const std::optional<F32>& index_w,
                 const std::optional<F32>& index_k, int64_t index_topk, double index_softmax_scale) {
  if (q.ndim() != 3)
    throw py::value_error("v4_attention: q must be [Tq, H, D], got " + std::to_string(q.ndim()) + " dimensions");
  if (rope_cos.ndim() != 2) throw py::value_error("v4_attention: rope_cos must be [Tq, d_r/2]");
  V4Queries x;
  x.layer_type = parse_v4_layer_type(layer_type);
  x.num_heads = q.shape(1), x.head_dim = q.shape(2), x.rope_dim = 2 * rope_cos.shape(1);
  x.sliding_window = sliding_window, x.softmax_scale = softmax_scale;
  x.num_tokens = positions.size();
  x.seq_offsets = view(seq_offsets), x.positions = view(positions), x.q_rows = view(q_rows);
  x.q = view(q), x.sinks = view(sinks), x.rope_cos = view(rope_cos), x.rope_sin = view(rope_sin);
  x.compressed_offsets = view(compressed_offsets), x.compressed_span = view(compressed_span);
  AttentionResult<Scalar> r;
  {
    py::gil_scoped_release nogil;
    const V4Attention<Scalar> att(x);
    std::optional<KeySelection> sel;
    if (x.layer_type == V4LayerType::Csa && index_k) {
      V4IndexQueries iq;
      iq.n_heads = index_w ? (index_w->ndim() == 2 ? index_w->shape(1) : 0) : 0;
      iq.dim = index_k->ndim() == 2 ? index_k->shape(1) : 0;
      iq.topk = index_topk, iq.softmax_scale = index_softmax_scale;
      iq.index_q = view(index_q), iq.index_w = view(index_w);
      sel = att.select_topk(iq, view(index_k));
    } else if (x.layer_type == V4LayerType::Csa) {
      if (!index_selected || index_selected->ndim() != 2)
        throw std::invalid_argument("v4_attention: a csa layer needs index_selected [Tq, k] or index_q / index_w / "
                                    "index_k");
      sel = att.selection_from_picks(view(index_selected), index_selected->shape(1));
    }
    r = att.run(view(window_kv), view(compressed_kv),
                sel ? &*sel : nullptr, true);
  }
  py::array_t<Scalar> out({r.num_queries, r.num_heads, r.v_head_dim});
  std::memcpy(out.mutable_data(), r.out.data(), r.out.size() * sizeof(Scalar));
  // Shapes as vectors: array_t(ssize_t) gave a zero stride here.
  py::array_t<int64_t> nkeys(std::vector<py::ssize_t>{static_cast<py::ssize_t>(r.nkeys.size())});
  std::memcpy(nkeys.mutable_data(), r.nkeys.data(), r.nkeys.size() * sizeof(int64_t));
  py::array_t<Scalar> probs(std::vector<py::ssize_t>{static_cast<py::ssize_t>(r.probs.size())});
  std::memcpy(probs.mutable_data(), r.probs.data(), r.probs.size() * sizeof(Scalar));
  return py::make_tuple(out, nkeys, probs);
}

}  // namespace

void def_attention_v4(py::module_& m) {
  m.def(
      "v4_attention",
      [](const std::string& layer_type, const F32& q, const I32& q_rows, const I32& positions, const I64& seq_offsets,
         const F32& window_kv, const F32& sinks, const F32& rope_cos, const F32& rope_sin, double softmax_scale,
         int64_t sliding_window, const std::optional<F32>& compressed_kv, const std::optional<I64>& compressed_span,
         const std::optional<I64>& compressed_offsets, const std::optional<I64>& index_selected,
         const std::optional<F32>& index_q, const std::optional<F32>& index_w, const std::optional<F32>& index_k,
         int64_t index_topk, double index_softmax_scale, bool float64) {
        const auto f = float64 ? &run_v4<double> : &run_v4<float>;
        return f(layer_type, q, q_rows, positions, seq_offsets, window_kv, sinks, rope_cos, rope_sin, softmax_scale,
                 sliding_window, compressed_kv, compressed_span, compressed_offsets, index_selected, index_q, index_w,
                 index_k, index_topk, index_softmax_scale);
      },
      py::arg("layer_type"), py::arg("q"), py::arg("q_rows"), py::arg("positions"), py::arg("seq_offsets"),
      py::arg("window_kv"), py::arg("sinks"), py::arg("rope_cos"), py::arg("rope_sin"), py::arg("softmax_scale"),
      py::arg("sliding_window"), py::kw_only(), py::arg("compressed_kv") = py::none(),
      py::arg("compressed_span") = py::none(), py::arg("compressed_offsets") = py::none(),
      py::arg("index_selected") = py::none(), py::arg("index_q") = py::none(), py::arg("index_w") = py::none(),
      py::arg("index_k") = py::none(), py::arg("index_topk") = 0, py::arg("index_softmax_scale") = 0.0,
      py::arg("float64") = false,
      "DeepSeek-V4's attention of one layer (latentq/attention/v4.h; data/README.md \"DeepSeek-V4 caches\"), the\n"
      "arrays as a deepseek_v4 dump stores them: layer_type 'sliding' | 'csa' | 'hca'; q float32 [Tq, H, D] after\n"
      "RoPE, q_rows int32 [Tq], positions int32 [T], seq_offsets int64 [S+1], window_kv float32 [T, D], sinks [H],\n"
      "rope_cos / rope_sin [Tq, d_r/2]; CSA / HCA: compressed_kv [N, D], compressed_span int64 [N, 2],\n"
      "compressed_offsets int64 [S+1]; CSA: the selection from index_selected int64 [Tq, k] (-1: none), or, when\n"
      "index_k [N, c] is given, recomputed from index_q [Tq, n_h, c], index_w [Tq, n_h], index_k, index_topk and\n"
      "index_softmax_scale (the engine's top-k on that index_k). Returns (out [Tq, H, D] with its last d_r columns\n"
      "rotated back, nkeys int64 [Tq], probs [sum_i H * nkeys[i]]: row i's window keys, visible compressed entries\n"
      "and sink, per head), float32 (float64 with float64=True). Raises ValueError naming the array and the\n"
      "expected shape for inconsistent inputs, NaN/Inf, a bad selection.");
}
