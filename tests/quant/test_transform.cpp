// The transform stage (latentq/transform.h): grammar, the Hadamard block rule, the FWHT by hand,
// seeded orthogonality properties of every rotation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "latentq/quantize.h"
#include "latentq/transform.h"
#include "test_helpers.h"

using namespace latentq;

namespace {

void expect_throw_containing(auto&& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no exception, expected one containing '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// What an unknown transform's error names, from the table: every row's name (name<N> after it for a row with a
// block), in table order, the last after " or ": "expected had, had<N>, rot, klt or sklt" today. A row added to
// kTransforms joins it without a test edit.
std::string expected_names_of_the_table() {
  std::vector<std::string> names;
  for (const TransformTraits& r : kTransforms) {
    if (r.kind == TransformKind::None) continue;
    names.emplace_back(r.name);
    if (r.block) names.push_back(std::string(r.name) + "<N>");
  }
  std::string out = "expected " + names.front();
  for (size_t i = 1; i < names.size(); ++i) out += (i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

std::vector<float> random_rows(int64_t T, int64_t D, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * D));
  for (float& v : x) v = n(rng);
  return x;
}

}  // namespace

TEST(Transform, ParseAndCanonicalString) {
  EXPECT_EQ(TransformedSpec::parse("had,int4-asym-token").to_string(), "had,int4-asym-token");
  EXPECT_EQ(TransformedSpec::parse("had64,q4_0").to_string(), "had64,q4_0");
  EXPECT_EQ(TransformedSpec::parse("rot,mxfp4").to_string(), "rot,mxfp4");
  EXPECT_EQ(TransformedSpec::parse("rot-s0,mxfp4").to_string(), "rot,mxfp4");  // seed 0 is the default
  EXPECT_EQ(TransformedSpec::parse("had-s7,int4-asym-channel-g32-fp16").to_string(), "had-s7,int4-asym-channel-g32");
  EXPECT_EQ(TransformedSpec::parse("klt,int4-asym-channel-g32").to_string(), "klt,int4-asym-channel-g32");
  EXPECT_EQ(TransformedSpec::parse("sklt,tc3-lm").to_string(), "sklt,tc3-lm");
  EXPECT_EQ(Transform::parse("sklt").kind, TransformKind::ScoreKlt);
  EXPECT_TRUE(fitted_transform(TransformKind::ScoreKlt) && fitted_transform(TransformKind::Klt));
  EXPECT_FALSE(fitted_transform(TransformKind::Hadamard) || fitted_transform(TransformKind::Random));
  EXPECT_EQ(TransformedSpec::parse("int8-sym-tensor").to_string(), "int8-sym-tensor");
  const TransformedSpec t = TransformedSpec::parse("had128-s3,flashmla-v32-fp8");
  EXPECT_EQ(t.transform.kind, TransformKind::Hadamard);
  EXPECT_EQ(t.transform.block, 128);
  EXPECT_EQ(t.transform.seed, 3u);
  EXPECT_EQ(t.spec, QuantSpec::parse("flashmla-v32-fp8"));
  EXPECT_EQ(TransformedSpec::parse("int8-sym-tensor").transform.kind, TransformKind::None);
}

TEST(Transform, ParseErrorsNameTheString) {
  expect_throw_containing([] { Transform::parse("had3"); }, "'had3'");
  expect_throw_containing([] { Transform::parse("had1"); }, "power of two >= 2");
  expect_throw_containing([] { Transform::parse("had0"); }, "power of two >= 2");
  expect_throw_containing([] { Transform::parse("hadx"); }, "'hadx'");
  expect_throw_containing([] { Transform::parse("rot-7"); }, "-s<seed>");
  expect_throw_containing([] { Transform::parse("klt-s1"); }, "takes no seed");
  expect_throw_containing([] { Transform::parse("sklt-s2"); }, "sklt is fitted, it takes no seed");
  expect_throw_containing([] { Transform::parse("pca"); }, expected_names_of_the_table());
  EXPECT_TRUE(expected_names_of_the_table().starts_with("expected had, had<N>, rot, klt"))  // the rows of today
      << expected_names_of_the_table();
  expect_throw_containing([] { TransformedSpec::parse("had,,int4-asym-token"); }, "one comma");
  expect_throw_containing([] { TransformedSpec::parse(",int4-asym-token"); }, "both parts non-empty");
  expect_throw_containing([] { TransformedSpec::parse("had,"); }, "both parts non-empty");
  expect_throw_containing([] { TransformedSpec::parse("had,int5-asym-token"); }, "int5-asym-token");
}

// The table drives the grammar: every row's name parses to its kind and prints back, takes a seed and a block
// exactly where its row says so; the forms text is the row list (hand-written below: the text before the table),
// and the error for an unknown transform ends with it.
TEST(Transform, TableDrivesTheGrammarAndTheForms) {
  const std::string forms = transform_forms();
  for (const TransformTraits& r : kTransforms) {
    const std::string name = r.name;
    SCOPED_TRACE("row '" + name + "'");
    const Transform t = Transform::parse(name);
    EXPECT_EQ(t.kind, r.kind);
    EXPECT_EQ(t.to_string(), name);
    EXPECT_EQ(fitted_transform(r.kind), r.fit != TransformFit::Built);
    EXPECT_EQ(fit_reads_queries(r.kind), r.fit == TransformFit::Queries);
    if (r.kind == TransformKind::None) continue;
    EXPECT_NE(forms.find(name + (r.block ? "[N]" : "") + (r.seed ? "[-s<seed>]" : "") + " ("), std::string::npos);
    if (r.seed) {
      EXPECT_EQ(Transform::parse(name + "-s5").seed, 5u);
      EXPECT_EQ(Transform::parse(name + "-s5").to_string(), name + "-s5");
    } else {
      expect_throw_containing([&] { Transform::parse(name + "-s5"); }, name);
      expect_throw_containing([&] { Transform::parse(name + "-s5"); }, "takes no seed");
    }
    if (r.block)
      EXPECT_EQ(Transform::parse(name + "64").block, 64);
    else
      expect_throw_containing([&] { Transform::parse(name + "64"); }, expected_names_of_the_table());
  }
  // The rows of today, by hand (the text before the table), then any row added after them, then the spec's form.
  EXPECT_TRUE(forms.starts_with(
      "had[N][-s<seed>] (randomized Hadamard, N a power of two >= 2 dividing the dimension; default: the largest power "
      "of two dividing it, refused below 16), rot[-s<seed>] (seeded Haar random orthogonal), klt (PCA basis of the "
      "fit split), sklt (score-metric KLT of the fit split and its query rows)"))
      << forms;
  EXPECT_TRUE(forms.ends_with("; a full spec is '<transform>,<quantizer>', e.g. had,int4-asym-token")) << forms;
  expect_throw_containing([] { Transform::parse("pca"); },
                          "'pca': " + expected_names_of_the_table() + ". Valid forms: " + forms);
  EXPECT_TRUE(traits(TransformKind::Klt).orthogonal);
  EXPECT_FALSE(traits(TransformKind::ScoreKlt).orthogonal);  // sklt's A is invertible, not orthogonal
  EXPECT_EQ(traits(TransformKind::Klt).fit, TransformFit::Latent);
  EXPECT_EQ(traits(TransformKind::ScoreKlt).fit, TransformFit::Queries);
  expect_throw_containing([] { Rotation::make(Transform::parse("sklt"), 16); }, "is fitted on the fit split");
}

TEST(Transform, HadamardBlockRule) {
  EXPECT_EQ(hadamard_block(512, 0), 512);
  EXPECT_EQ(hadamard_block(576, 0), 64);  // 512 + 64 = 9 * 64
  EXPECT_EQ(hadamard_block(96, 0), 32);
  EXPECT_EQ(hadamard_block(384, 0), 128);
  EXPECT_EQ(hadamard_block(128, 0), 128);
  EXPECT_EQ(hadamard_block(32, 0), 32);
  EXPECT_EQ(hadamard_block(576, 32), 32);
  EXPECT_EQ(hadamard_block(6, 2), 2);  // an explicit small block is the user's choice
  expect_throw_containing([] { hadamard_block(100, 0); }, "dimension 100");  // 100 = 25 * 4
  expect_throw_containing([] { hadamard_block(576, 128); }, "does not divide dimension 576");
  expect_throw_containing([] { hadamard_block(64, 24); }, "not a power of two");
  expect_throw_containing([] { hadamard_block(0, 0); }, "dimension 0");
}

TEST(Transform, FwhtHandComputed) {
  // [1, 2, 3, 4]: h=1 -> [3, -1, 7, -1]; h=2 -> [10, -2, -4, 0]; times 1/sqrt(4) = 0.5.
  std::vector<float> x{1, 2, 3, 4, -1, 0, 0, 0};
  fwht_rows(x.data(), 2, 4, 4);
  EXPECT_EQ(x, (std::vector<float>{5, -1, -2, 0, -0.5f, -0.5f, -0.5f, -0.5f}));
  // Block 2 on one row of 4: pairs (1,2) and (3,4) -> (3,-1), (7,-1), times float(1/sqrt(2)).
  std::vector<float> y{1, 2, 3, 4};
  fwht_rows(y.data(), 1, 4, 2);
  const float n = static_cast<float>(1.0 / std::sqrt(2.0));
  EXPECT_EQ(y, (std::vector<float>{3 * n, -1 * n, 7 * n, -1 * n}));
  expect_throw_containing(
      [] {
        std::vector<float> z(6);
        fwht_rows(z.data(), 1, 6, 4);
      },
      "D = 6");
}

TEST(Transform, HadamardSignsAreSeeded) {
  const std::vector<float> a = hadamard_signs(512, 0), b = hadamard_signs(512, 0), c = hadamard_signs(512, 1);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int neg = 0;
  for (float v : a) {
    EXPECT_TRUE(v == 1.0f || v == -1.0f);
    neg += v < 0;
  }
  EXPECT_GT(neg, 512 / 2 - 64);  // ~Binomial(512, 1/2): mean 256, sd 11
  EXPECT_LT(neg, 512 / 2 + 64);
}

// Every rotation: forward preserves the row norm, inverse(forward(x)) = x, matrix() is R with R·Rᵀ = I,
// and forward agrees with R·x. Seeded: rows from mt19937 seed 5, T = 7.
TEST(Transform, RotationsAreOrthogonalAndInvertible) {
  for (const auto& [name, D] : std::vector<std::pair<std::string, int64_t>>{
           {"had", 128}, {"had", 576}, {"had32-s9", 96}, {"rot", 32}, {"rot-s4", 64}}) {
    SCOPED_TRACE(name + " D=" + std::to_string(D) + " T=7 seed=5");
    const Rotation r = Rotation::make(Transform::parse(name), D);
    const int64_t T = 7;
    const std::vector<float> x0 = random_rows(T, D, 5);
    std::vector<float> x = x0;
    r.forward(x.data(), T, D);
    const std::vector<float> R = r.matrix();
    for (int64_t t = 0; t < T; ++t) {
      double n0 = 0, n1 = 0;
      for (int64_t j = 0; j < D; ++j) {
        n0 += double(x0[t * D + j]) * x0[t * D + j];
        n1 += double(x[t * D + j]) * x[t * D + j];
        double rx = 0;
        for (int64_t k = 0; k < D; ++k) rx += double(R[j * D + k]) * x0[t * D + k];
        EXPECT_NEAR(rx, x[t * D + j], 1e-5 * std::sqrt(n0 / D) * 4);
      }
      EXPECT_NEAR(std::sqrt(n1 / n0), 1.0, 1e-6);
    }
    for (int64_t i = 0; i < D; ++i)
      for (int64_t k = 0; k < D; ++k) {
        double dot = 0;
        for (int64_t j = 0; j < D; ++j) dot += double(R[i * D + j]) * R[k * D + j];
        ASSERT_NEAR(dot, i == k ? 1.0 : 0.0, 1e-6) << "row " << i << " col " << k;
      }
    r.inverse(x.data(), T, D);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], x0[i], 2e-6f * (1 + std::abs(x0[i])));
  }
}

// The dense rotation's documented arithmetic, bit for bit: each output a float64 sum in index order
// (the scalar loops of the definition) rounded once, whatever the tiling of rows (tiles of 36 rows in
// groups of 6: T = 72 two whole tiles, 77, 41, 37 a tile and a tail; groups of 6 with tails of 1 to 5 rows:
// T = 1, 8, 9, 10, 19, 41, 77, 6 whole) and of outputs (blocks of 8: D = 5, 7 all tail; 33, 9; 24, 40,
// 64, 576 whole blocks), under every CPU kernel selection (Reference and Baseline run the baseline
// build of the loops, Avx2 the AVX2 one where the CPU has it; kernel= 1, 2, 3 in the trace).
TEST(Transform, DenseRotationIsTheFloat64SumInIndexOrder) {
  for (const CpuKernel k : available_cpu_kernels())
    for (const auto& [T, D] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 5}, {8, 33}, {19, 64}, {19, 576}, {9, 7}, {6, 40}, {10, 64}, {77, 64}, {41, 24}, {72, 9}, {37, 40}}) {
      const ScopedCpuKernel kernel(k);
      const uint32_t seed = static_cast<uint32_t>(11 + T + D);
      SCOPED_TRACE("T=" + std::to_string(T) + " D=" + std::to_string(D) + " seed=" + std::to_string(seed) +
                   " kernel=" + std::to_string(static_cast<int>(k)));
      const Rotation r = Rotation::dense(D, haar_orthogonal(D, seed));
      const std::vector<float> R = r.matrix();
      const std::vector<float> x0 = random_rows(T, D, seed);
      std::vector<float> fwd(x0.size()), inv(x0.size());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < D; ++i) {
          double f = 0, b = 0;
          for (int64_t j = 0; j < D; ++j) {
            f += static_cast<double>(R[i * D + j]) * x0[t * D + j];  // x'_i = Σ_j R_ij x_j
            b += static_cast<double>(R[j * D + i]) * x0[t * D + j];  // x_i = Σ_j R_ji x'_j
          }
          fwd[t * D + i] = static_cast<float>(f);
          inv[t * D + i] = static_cast<float>(b);
        }
      std::vector<float> x = x0;
      r.forward(x.data(), T, D);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], fwd[i]) << "forward, element " << i;
      x = x0;
      r.inverse(x.data(), T, D);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], inv[i]) << "inverse, element " << i;
    }
}

TEST(Transform, HaarIsSeededAndNotTheIdentity) {
  EXPECT_EQ(haar_orthogonal(16, 1), haar_orthogonal(16, 1));
  EXPECT_NE(haar_orthogonal(16, 1), haar_orthogonal(16, 2));
  const std::vector<float> R = haar_orthogonal(64, 0);
  double diag = 0;
  for (int64_t i = 0; i < 64; ++i) diag += std::abs(R[i * 64 + i]);
  EXPECT_LT(diag / 64, 0.5);  // E|R_ii| ~ sqrt(2/(pi*64)) = 0.1 for a Haar matrix
}

TEST(Transform, RotationErrors) {
  expect_throw_containing([] { Rotation::make(Transform::parse("klt"), 64); }, "fit split");
  expect_throw_containing([] { Rotation::make(Transform::parse("sklt"), 64); }, "Rotation::dense_invertible (sklt)");
  expect_throw_containing([] { Rotation::dense_invertible(2, std::vector<float>(4), std::vector<float>(3)); },
                          "its inverse 3");
  expect_throw_containing([] { Rotation::make(Transform::parse("had"), 100); }, "dimension 100");
  expect_throw_containing([] { Rotation::dense(4, std::vector<float>(15)); }, "got 15");
  const Rotation r = Rotation::make(Transform::parse("had"), 64);
  expect_throw_containing(
      [&] {
        std::vector<float> x(32);
        r.forward(x.data(), 1, 32);
      },
      "rows of 64");
  EXPECT_TRUE(Rotation::make(Transform{}, 64).identity());
}

// sklt's invertible map by hand: A = [[2, 0], [1, 1]], A⁻¹ = [[0.5, 0], [-0.5, 1]] (exact in float32).
// x = (1, 2): forward A·x = (2, 3), inverse gives x back; the weights' side w = (3, 4): A⁻ᵀ·w = (-0.5, 4), and
// (A⁻ᵀw)·(Ax) = -1 + 12 = 11 = w·x. A rotation's fold is its forward map.
TEST(Transform, InvertibleMapForwardInverseAndFoldByHand) {
  const Rotation a = Rotation::dense_invertible(2, {2, 0, 1, 1}, {0.5f, 0, -0.5f, 1});
  EXPECT_FALSE(a.orthogonal());
  std::vector<float> x = {1, 2};
  a.forward(x.data(), 1, 2);
  EXPECT_EQ(x, (std::vector<float>{2, 3}));
  a.inverse(x.data(), 1, 2);
  EXPECT_EQ(x, (std::vector<float>{1, 2}));
  std::vector<float> w = {3, 4};
  a.fold(w.data(), 1, 2);
  EXPECT_EQ(w, (std::vector<float>{-0.5f, 4}));
  EXPECT_EQ(a.inverse_matrix(), (std::vector<float>{0.5f, 0, -0.5f, 1}));
  const Rotation h = Rotation::make(Transform::parse("had"), 16);
  EXPECT_TRUE(h.orthogonal());
  std::vector<float> u = random_rows(3, 16, 5), v = u;
  h.fold(u.data(), 3, 16);
  h.forward(v.data(), 3, 16);
  EXPECT_EQ(u, v);
  const std::vector<float> R = h.matrix(), Rt = h.inverse_matrix();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) EXPECT_EQ(Rt[j * 16 + i], R[i * 16 + j]);
}

// A seeded well-conditioned A = Q·diag(s) (Q Haar, s in [0.5, 2]) and its float64 inverse: forward∘inverse is the
// identity and every dot product w·x survives (fold w)·(forward x), to float32 rounding times cond(A) = 4.
TEST(Transform, InvertibleMapKeepsDotProducts) {
  const int64_t D = 24, T = 7;
  const std::vector<float> Q = haar_orthogonal(D, 11);
  std::vector<float> A(D * D), Ai(D * D);
  for (int64_t i = 0; i < D; ++i)
    for (int64_t j = 0; j < D; ++j) {
      const double s = 0.5 + 1.5 * static_cast<double>(j) / static_cast<double>(D - 1);
      A[i * D + j] = static_cast<float>(Q[i * D + j] * s);  // A = Q·diag(s): A⁻¹ = diag(1/s)·Qᵀ
      Ai[j * D + i] = static_cast<float>(Q[i * D + j] / s);
    }
  const Rotation a = Rotation::dense_invertible(D, A, Ai);
  const std::vector<float> x0 = random_rows(T, D, 21), w0 = random_rows(T, D, 22);
  std::vector<float> x = x0, w = w0;
  a.forward(x.data(), T, D);
  a.fold(w.data(), T, D);
  for (int64_t t = 0; t < T; ++t) {
    double before = 0, after = 0, norm = 0;
    for (int64_t j = 0; j < D; ++j) {
      before += double(x0[t * D + j]) * w0[t * D + j];
      after += double(x[t * D + j]) * w[t * D + j];
      norm += std::fabs(double(x0[t * D + j]) * w0[t * D + j]);
    }
    EXPECT_NEAR(after, before, 4e-6 * norm) << "seed 21/22, D " << D << ", row " << t;
  }
  a.inverse(x.data(), T, D);
  for (int64_t i = 0; i < T * D; ++i) EXPECT_NEAR(x[i], x0[i], 4e-6 * (1 + std::fabs(x0[i]))) << "element " << i;
}
