// Transform stage before a quantizer (latentq/transform.h).
#include "latentq/transform.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

namespace latentq {

namespace {

[[noreturn]] void bad_transform(std::string_view s, const std::string& why) {
  throw std::invalid_argument("unknown transform '" + std::string(s) + "': " + why +
                              ". Valid forms: " + transform_forms());
}

// "expected had, had<N>, rot, klt or sklt": every row's name (and name<N> for a row with a block).
std::string expected_names() {
  std::vector<std::string> names;
  for (const TransformTraits& r : kTransforms) {
    if (r.kind == TransformKind::None) continue;
    names.emplace_back(r.name);
    if (r.block) names.push_back(std::string(r.name) + "<N>");
  }
  std::string out = "expected ";
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

template <typename I>
bool parse_uint(std::string_view t, I& v) {
  if (t.empty()) return false;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  return ec == std::errc() && p == t.data() + t.size();
}

bool is_pow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void check_rows(const char* what, int64_t T, int64_t D, int64_t want) {
  if (T < 0 || D != want)
    throw std::invalid_argument(std::string(what) + ": rows of " + std::to_string(D) + " elements (T = " +
                                std::to_string(T) + "), expected T >= 0 and rows of " + std::to_string(want));
}

}  // namespace

std::string transform_forms() {
  std::string out;
  for (const TransformTraits& r : kTransforms) {
    if (r.kind == TransformKind::None) continue;
    out += std::string(out.empty() ? "" : ", ") + r.name + (r.block ? "[N]" : "") + (r.seed ? "[-s<seed>]" : "") +
           " (" + r.what + ")";
  }
  return out + "; a full spec is '<transform>,<quantizer>', e.g. had,int4-asym-token";
}

Transform Transform::parse(std::string_view s) {
  Transform t;
  if (s.empty()) return t;
  std::string_view head = s, seed;
  if (const size_t p = s.find('-'); p != std::string_view::npos) {
    head = s.substr(0, p);
    seed = s.substr(p + 1);
    if (!seed.starts_with("s") || !parse_uint(seed.substr(1), t.seed))
      bad_transform(s, "the suffix must be -s<seed>, seed a non-negative 64-bit integer");
  }
  // The row whose name is the head, else a row with a block whose name starts it (had64).
  const TransformTraits* row = nullptr;
  for (const TransformTraits& r : kTransforms)
    if (r.kind != TransformKind::None && head == r.name) row = &r;
  if (!row)
    for (const TransformTraits& r : kTransforms)
      if (r.block && head.starts_with(r.name)) row = &r;
  if (!row) bad_transform(s, expected_names());
  t.kind = row->kind;
  if (!seed.empty() && !row->seed)
    bad_transform(s, std::string(row->name) + (fitted_transform(row->kind) ? " is fitted, it" : "") + " takes no seed");
  const std::string_view block = head.substr(std::string_view(row->name).size());
  if (!block.empty() && (!parse_uint(block, t.block) || !is_pow2(t.block) || t.block < 2))
    bad_transform(s, "the Hadamard block must be a power of two >= 2");
  return t;
}

std::string Transform::to_string() const {
  const TransformTraits& r = traits(kind);
  std::string s = r.name;
  if (block) s += std::to_string(block);
  if (seed) s += "-s" + std::to_string(seed);
  return s;
}

TransformedSpec TransformedSpec::parse(std::string_view s) {
  TransformedSpec ts;
  const size_t p = s.find(',');
  if (p == std::string_view::npos) {
    ts.spec = QuantSpec::parse(s);
    return ts;
  }
  if (s.find(',', p + 1) != std::string_view::npos || p == 0 || p + 1 == s.size())
    throw std::invalid_argument(
        "bad spec '" + std::string(s) +
        "': expected '<transform>,<quantizer>' (one comma, both parts non-empty) or '<quantizer>'");
  ts.transform = Transform::parse(s.substr(0, p));
  ts.spec = QuantSpec::parse(s.substr(p + 1));
  return ts;
}

std::string TransformedSpec::to_string() const {
  const std::string t = transform.to_string();
  return t.empty() ? spec.to_string() : t + "," + spec.to_string();
}

int64_t hadamard_block(int64_t D, int64_t requested) {
  const std::string dim = "dimension " + std::to_string(D);
  if (D <= 0) throw std::invalid_argument("Hadamard transform: " + dim + " must be positive");
  if (requested != 0) {
    if (!is_pow2(requested) || requested < 2)
      throw std::invalid_argument("Hadamard transform: block " + std::to_string(requested) +
                                  " is not a power of two >= 2 (" + dim + ")");
    if (D % requested != 0)
      throw std::invalid_argument("Hadamard transform: block " + std::to_string(requested) + " does not divide " + dim +
                                  "; pick a power of two that divides it");
    return requested;
  }
  const int64_t b = D & -D;  // largest power of two dividing D
  if (b < kMinAutoHadamardBlock)
    throw std::invalid_argument("Hadamard transform: the largest power of two dividing " + dim + " is " +
                                std::to_string(b) + ", below the useful minimum " +
                                std::to_string(kMinAutoHadamardBlock) + "; use had<N> explicitly or rot");
  return b;
}

std::vector<float> hadamard_signs(int64_t D, uint64_t seed) {
  std::vector<float> s(static_cast<size_t>(D < 0 ? 0 : D));
  for (int64_t i = 0; i < D; ++i) s[i] = (splitmix64(seed + static_cast<uint64_t>(i) + 1) & 1) ? -1.0f : 1.0f;
  return s;
}

void fwht_rows(float* X, int64_t T, int64_t D, int64_t block) {
  if (block < 1 || T < 0 || D % block != 0 || !is_pow2(block))
    throw std::invalid_argument("fwht_rows: block " + std::to_string(block) + " must be a power of two dividing D = " +
                                std::to_string(D) + " (T = " + std::to_string(T) + " >= 0)");
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(block)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b0 = 0; b0 < D; b0 += block) {
      float* x = X + t * D + b0;
      // The pairs (i, i + h) with bit h of i clear, as runs of h: lo = x[j0 .. j0 + h), hi = the h after it.
      // Every butterfly of a stage is independent and exact-order (a + c, a - c), so visiting them run by run
      // (contiguous, vectorizable) gives the bytes of the increasing-i order the header documents.
      for (int64_t h = 1; h < block; h <<= 1)
        for (int64_t j0 = 0; j0 < block; j0 += 2 * h) {
          float* __restrict lo = x + j0;
          float* __restrict hi = x + j0 + h;
          for (int64_t k = 0; k < h; ++k) {
            const float a = lo[k], c = hi[k];
            lo[k] = a + c;
            hi[k] = a - c;
          }
        }
      for (int64_t i = 0; i < block; ++i) x[i] *= norm;
    }
}

std::vector<float> haar_orthogonal(int64_t D, uint64_t seed) {
  if (D <= 0) throw std::invalid_argument("haar_orthogonal: dimension " + std::to_string(D) + " must be positive");
  const size_t n = static_cast<size_t>(D);
  std::vector<double> G(n * n);
  uint64_t state = seed;
  auto uniform = [&] {  // (0, 1]
    state = splitmix64(state);
    return (static_cast<double>(state >> 11) + 1.0) * 0x1.0p-53;
  };
  for (size_t i = 0; i < n * n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform())), a = 2.0 * M_PI * uniform();
    G[i] = r * std::cos(a);
    if (i + 1 < n * n) G[i + 1] = r * std::sin(a);
  }
  // Modified Gram-Schmidt on the rows, twice (re-orthogonalization); positive diagonal of R by
  // construction, so the result is Haar distributed.
  for (size_t i = 0; i < n; ++i) {
    double* gi = &G[i * n];
    for (int pass = 0; pass < 2; ++pass)
      for (size_t k = 0; k < i; ++k) {
        const double* gk = &G[k * n];
        double dot = 0;
        for (size_t j = 0; j < n; ++j) dot += gi[j] * gk[j];
        for (size_t j = 0; j < n; ++j) gi[j] -= dot * gk[j];
      }
    double nrm = 0;
    for (size_t j = 0; j < n; ++j) nrm += gi[j] * gi[j];
    nrm = std::sqrt(nrm);
    for (size_t j = 0; j < n; ++j) gi[j] /= nrm;
  }
  std::vector<float> R(n * n);
  for (size_t i = 0; i < n * n; ++i) R[i] = static_cast<float>(G[i]);
  return R;
}

Rotation Rotation::hadamard(int64_t D, int64_t block, uint64_t seed) {
  Rotation r;
  r.block_ = hadamard_block(D, block);
  r.D_ = D;
  r.s_ = hadamard_signs(D, seed);
  return r;
}

Rotation Rotation::dense(int64_t D, std::vector<float> R) {
  if (D <= 0 || R.size() != static_cast<size_t>(D) * static_cast<size_t>(D))
    throw std::invalid_argument("Rotation::dense: a [" + std::to_string(D) + ", " + std::to_string(D) +
                                "] matrix needs D > 0 and D*D values, got " + std::to_string(R.size()));
  Rotation r;
  r.D_ = D;
  r.R_ = std::move(R);
  r.Rt_.resize(r.R_.size());
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j) r.Rt_[j * D + i] = r.R_[i * D + j];
  return r;
}

Rotation Rotation::dense_invertible(int64_t D, std::vector<float> A, std::vector<float> A_inv) {
  if (A_inv.size() != A.size())
    throw std::invalid_argument("Rotation::dense_invertible: A has " + std::to_string(A.size()) + " values, its inverse " +
                                std::to_string(A_inv.size()));
  Rotation r = dense(D, std::move(A));
  r.Inv_.resize(A_inv.size());
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j) r.Inv_[j * D + i] = A_inv[i * D + j];
  r.Fold_ = std::move(A_inv);
  return r;
}

namespace {

// Rows of X [T, D] in place: x'_i = Σ_k M[k, i] x_k, each sum in float64 over k ascending from 0,
// rounded once to float. Register-blocked: R rows × 8 outputs live in vector accumulators while k runs
// over D, so the sums never leave registers; lanes are independent outputs (no reassociation) and each
// step is one rounded product and one rounded sum, so every output is the same double sum as the scalar
// loop's: acc = 0; for k ascending: acc = acc + double(M[k, i])·x_k.
using V4d = double __attribute__((vector_size(32)));
using V4f = float __attribute__((vector_size(16)));

// Outputs [i, i + 8) of R rows: out[r, i + l] = Σ_k M[k, i + l]·xin[r, k] in float64, k ascending, rounded
// once. xin [R, D]: the rows in float64 (exact); out with row stride D; P: M's columns i .. i + 7 in
// float64 (exact) as a contiguous [D, 8] panel (a column of M is D·4 bytes apart: with D a power of two
// its rows would fall into two L1 sets).
template <int R>
[[gnu::always_inline]] inline void dense_cols8(const double* P, const double* xin, float* out, int64_t D, int64_t i) {
  V4d acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = V4d{0.0, 0.0, 0.0, 0.0};
  for (int64_t k = 0; k < D; ++k) {
    V4d m0, m1;
    std::memcpy(&m0, P + k * 8, sizeof m0);
    std::memcpy(&m1, P + k * 8 + 4, sizeof m1);
    for (int r = 0; r < R; ++r) {
      const double x = xin[r * D + k];
      acc[r][0] += m0 * x;
      acc[r][1] += m1 * x;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < 4; ++l) {
      out[r * D + i + l] = static_cast<float>(acc[r][0][l]);
      out[r * D + i + 4 + l] = static_cast<float>(acc[r][1][l]);
    }
}

// The last D mod 8 outputs [i0, D) of R rows, scalar, the same sums in the same order.
template <int R>
[[gnu::always_inline]] inline void dense_tail(const float* M, const double* xin, float* out, int64_t D, int64_t i0) {
  for (int64_t i = i0; i < D; ++i) {
    double acc[R] = {};
    for (int64_t k = 0; k < D; ++k)
      for (int r = 0; r < R; ++r) acc[r] += static_cast<double>(M[k * D + i]) * xin[r * D + k];
    for (int r = 0; r < R; ++r) out[r * D + i] = static_cast<float>(acc[r]);
  }
}

// Rows of X [T, D] in tiles of kTile: each tile's rows are converted to float64 once, then for each panel
// of 8 outputs (32 KiB at D = 512) its rows are computed 4 at a time (4 × 8 accumulators in registers).
// The panels (M converted to float64 once per call, so the loop does no conversions) are streamed once
// per tile of kTile rows rather than once per 4 rows. Every output is still its own float64 sum over k
// ascending, so neither the tiling nor the conversion changes a bit.
[[gnu::always_inline]] inline void dense_rows_body(const float* M, float* X, int64_t T, int64_t D) {
  constexpr int64_t kTile = 36;
  std::vector<double> xin(static_cast<size_t>(kTile * D));
  const int64_t D8 = D / 8 * 8;
  std::vector<double> panels(static_cast<size_t>(D8 * D));  // M's values in float64 (exact), panel by panel
  for (int64_t b = 0; b < D8; b += 8)
    for (int64_t k = 0; k < D; ++k)
      for (int64_t l = 0; l < 8; ++l) panels[b * D + k * 8 + l] = static_cast<double>(M[k * D + b + l]);
  for (int64_t t0 = 0; t0 < T; t0 += kTile) {
    const int64_t rows = std::min(kTile, T - t0);
    for (int64_t j = 0; j < rows * D; ++j) xin[j] = static_cast<double>(X[t0 * D + j]);
    float* out = X + t0 * D;  // the tile's inputs are in xin: written in place
    for (int64_t i = 0; i < D8; i += 8) {
      const double* P = panels.data() + i * D;
      int64_t r0 = 0;
      for (; r0 + 6 <= rows; r0 += 6) dense_cols8<6>(P, xin.data() + r0 * D, out + r0 * D, D, i);
      switch (rows - r0) {
        case 5:
          dense_cols8<5>(P, xin.data() + r0 * D, out + r0 * D, D, i);
          break;
        case 4:
          dense_cols8<4>(P, xin.data() + r0 * D, out + r0 * D, D, i);
          break;
        case 3:
          dense_cols8<3>(P, xin.data() + r0 * D, out + r0 * D, D, i);
          break;
        case 2:
          dense_cols8<2>(P, xin.data() + r0 * D, out + r0 * D, D, i);
          break;
        case 1:
          dense_cols8<1>(P, xin.data() + r0 * D, out + r0 * D, D, i);
          break;
        default:
          break;
      }
    }
    if (D8 < D) {
      int64_t r0 = 0;
      for (; r0 + 4 <= rows; r0 += 4) dense_tail<4>(M, xin.data() + r0 * D, out + r0 * D, D, D8);
      for (; r0 < rows; ++r0) dense_tail<1>(M, xin.data() + r0 * D, out + r0 * D, D, D8);
    }
  }
}

// The same loops compiled for the baseline ISA (x86-64: SSE2, two double lanes) and with
// target("avx2") (four lanes). AVX2 here means no FMA (the target does not include it, and
// -ffp-contract=off holds): each product and each sum is rounded as in the loops above, so both give
// the same bits (Transform.DenseRotationIsTheFloat64SumInIndexOrder runs both).
void dense_rows_baseline(const float* M, float* X, int64_t T, int64_t D) { dense_rows_body(M, X, T, D); }
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void dense_rows_avx2(const float* M, float* X, int64_t T, int64_t D) {
  dense_rows_body(M, X, T, D);
}
#endif

/// X [T, D] row-major ← each row times M's rows: x'_i = Σ_k M[k, i]·x_k in float64, k in index order.
/// Runs the AVX2 build when quantize.h's CPU kernel selection is Avx2 (the default on CPUs with it).
void dense_rows(const float* M, float* X, int64_t T, int64_t D) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (active_cpu_kernel() == CpuKernel::Avx2) return dense_rows_avx2(M, X, T, D);
#endif
  dense_rows_baseline(M, X, T, D);
}

}  // namespace

Rotation Rotation::make(const Transform& t, int64_t D) {
  if (fitted_transform(t.kind))
    throw std::invalid_argument("transform '" + t.to_string() + "' of dimension " + std::to_string(D) +
                                " is fitted on the fit split: build it with " +
                                (traits(t.kind).orthogonal ? "Rotation::dense (" : "Rotation::dense_invertible (") +
                                t.to_string() + ") from the fitted basis (the study's fit_layer_rotation)");
  switch (t.kind) {
    case TransformKind::Hadamard:
      return hadamard(D, t.block, t.seed);
    case TransformKind::Random: {
      // A function of (D, seed) alone: built once per process (the study asks for the same matrix for
      // every layer), then copied.
      static std::mutex mu;
      static std::map<std::pair<int64_t, uint64_t>, std::vector<float>> built;
      std::vector<float> R;
      {
        const std::lock_guard<std::mutex> lock(mu);
        auto it = built.find({D, t.seed});
        if (it == built.end()) it = built.emplace(std::make_pair(D, t.seed), haar_orthogonal(D, t.seed)).first;
        R = it->second;
      }
      return dense(D, std::move(R));
    }
    case TransformKind::None:
      return {};
    default:  // the fitted kinds, refused above
      break;
  }
  throw std::logic_error("Rotation::make: transform '" + t.to_string() +
                         "' is built (kTransforms) but has no case here");
}

void Rotation::forward(float* X, int64_t T, int64_t D) const {
  if (identity()) return;
  check_rows("Rotation::forward", T, D, D_);
  if (block_) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < D; ++j) X[t * D + j] *= s_[j];
    fwht_rows(X, T, D, block_);
    return;
  }
  dense_rows(Rt_.data(), X, T, D);  // x'_i = Σ_j Rᵀ[j, i] x_j = Σ_j R_ij x_j
}

void Rotation::inverse(float* X, int64_t T, int64_t D) const {
  if (identity()) return;
  check_rows("Rotation::inverse", T, D, D_);
  if (block_) {
    fwht_rows(X, T, D, block_);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < D; ++j) X[t * D + j] *= s_[j];
    return;
  }
  // rotation: x_j = Σ_i R_ij x'_i; invertible: x_j = Σ_i (A⁻¹)ᵀ[i, j] x'_i = Σ_i A⁻¹_ji x'_i
  dense_rows(Inv_.empty() ? R_.data() : Inv_.data(), X, T, D);
}

void Rotation::fold(float* X, int64_t T, int64_t D) const {
  if (Fold_.empty()) return forward(X, T, D);
  check_rows("Rotation::fold", T, D, D_);
  dense_rows(Fold_.data(), X, T, D);  // w'_i = Σ_j A⁻¹_ji w_j = (A⁻ᵀ w)_i
}

std::vector<float> Rotation::inverse_matrix() const {
  if (!Fold_.empty()) return Fold_;
  const std::vector<float> R = matrix();
  std::vector<float> Rt(R.size());
  for (int64_t i = 0; i < D_; ++i)
    for (int64_t j = 0; j < D_; ++j) Rt[j * D_ + i] = R[i * D_ + j];
  return Rt;
}

std::vector<float> Rotation::matrix() const {
  if (!block_) return R_;
  // Row i of R = R·e_i's transpose; R is H·diag(s), so column j = forward(e_j).
  std::vector<float> M(static_cast<size_t>(D_ * D_));
  std::vector<float> e(static_cast<size_t>(D_));
  for (int64_t j = 0; j < D_; ++j) {
    std::fill(e.begin(), e.end(), 0.0f);
    e[j] = 1.0f;
    forward(e.data(), 1, D_);
    for (int64_t i = 0; i < D_; ++i) M[i * D_ + j] = e[i];
  }
  return M;
}

QuantizedTensor quantize_dequantize_rotated(const QuantSpec& spec, const Rotation& r, Target target, const float* X,
                                            int64_t T, int64_t D, std::span<const int64_t> seq_offsets, float* out) {
  if (r.identity()) return quantize_dequantize(spec, target, X, T, D, seq_offsets, out);
  std::vector<float> xr(X, X + static_cast<size_t>(T * D));
  r.forward(xr.data(), T, D);
  QuantizedTensor q = quantize_dequantize(spec, target, xr.data(), T, D, seq_offsets, out);
  r.inverse(out, T, D);
  return q;
}

}  // namespace latentq
