// Storage accounting (bits per element, bytes per token, metadata included) for known layouts,
// hand-computed, and the errors quantize() throws for bad input.
#include "test_helpers.h"

#include <random>

namespace {
using namespace lqtest;

std::vector<float> ramp(int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37) % 101) * 0.125f - 6.0f;
  return v;
}

struct Acct {
  const char* spec;
  Target target;
  int64_t T, D;
  std::vector<int64_t> seq;
  int64_t bytes;  // total storage, hand-computed
  double bytes_per_token, bits_per_element;
};

TEST(Accounting, KnownLayouts) {
  const Acct cases[] = {
      // codes 64 tokens × 128·4/8 = 64 B = 4096 B; 2 token groups × 128 channels × (fp16 scale + fp16
      // offset) = 2·128·4 = 1024 B; 5120 B / 64 = 80 B/token; 5120·8 / (64·128) = 5 bits.
      {"int4-asym-channel-g32", Target::CKV, 64, 128, {0, 64}, 5120, 80.0, 5.0},
      // -fp32: metadata 2·128·8 = 2048 B -> 6144 B, 96 B/token, 6 bits.
      {"int4-asym-channel-g32-fp32", Target::CKV, 64, 128, {0, 64}, 6144, 96.0, 6.0},
      // 8192 B of codes + one fp16 scale: 8194 B, 128.03125 B/token, 65552/8192 = 8.001953125 bits.
      {"int8-sym-tensor", Target::CKV, 64, 128, {0, 64}, 8194, 128.03125, 8.001953125},
      // per token: 128·2/8 = 32 B codes + 4 groups × (2 + 2) B = 48 B; 48·8/128 = 3 bits.
      {"int2-asym-token-g32", Target::CKV, 4, 128, {0, 4}, 192, 48.0, 3.0},
      // vLLM fp8_ds_mla c_kv: 512 fp8 bytes + 4 tiles × 4 B fp32 scales = 528 B/token, 8.25 bits.
      {"fp8-e4m3-tile128-fp32", Target::CKV, 3, 512, {0, 3}, 3 * 528, 528.0, 8.25},
      {"flashmla-v32-fp8", Target::CKV, 3, 512, {0, 3}, 3 * 528, 528.0, 8.25},
      // The FlashMLA preset keeps k_pe in bf16: 64 × 2 = 128 B/token, 16 bits.  528 + 128 = 656 B/token/layer.
      {"flashmla-v32-fp8", Target::KPE, 3, 64, {0, 3}, 3 * 128, 128.0, 16.0},
      // MODEL1-style UE8M0 scale bytes: 512 + 8 tiles of 64 × 1 B = 520 B/token.
      {"fp8-e4m3-tile64-pow2-ue8m0", Target::CKV, 3, 512, {0, 3}, 3 * 520, 520.0, 520.0 * 8 / 512},
      // ggml at the 512 + 64 = 576 row (blocks never straddle c_kv and k_pe): q8_0 34 B per 32 -> 612 per
      // 576; q4_0 18 B per 32 -> 324; q4_1 20 B per 32 -> 360.
      {"q8_0", Target::CKV, 2, 576, {0, 2}, 2 * 612, 612.0, 8.5},
      {"q4_0", Target::CKV, 2, 576, {0, 2}, 2 * 324, 324.0, 4.5},
      {"q4_1", Target::CKV, 2, 576, {0, 2}, 2 * 360, 360.0, 5.0},
      // OCP MX: codes + one E8M0 byte per 32: mxfp8 512 + 16 = 528, mxfp4 256 + 16 = 272 B/token.
      {"mxfp8", Target::CKV, 3, 512, {0, 3}, 3 * 528, 528.0, 8.25},
      {"mxfp4", Target::CKV, 3, 512, {0, 3}, 3 * 272, 272.0, 4.25},
      // NVFP4: 256 B codes + 32 e4m3 block scales = 288 B/token, plus one fp32 per-tensor scale (4 B per matrix).
      {"nvfp4", Target::CKV, 4, 512, {0, 4}, 4 * 288 + 4, 289.0, (4 * 288 + 4) * 8.0 / (4 * 512)},
      // per-tensor fp8: 1 B per element + 4 B per matrix.
      {"fp8-e4m3-tensor", Target::CKV, 4, 512, {0, 4}, 4 * 512 + 4, 513.0, (4 * 512 + 4) * 8.0 / (4 * 512)},
      {"fp8-e4m3-tensor-s1", Target::KPE, 4, 64, {0, 4}, 4 * 64 + 4, 65.0, (4 * 64 + 4) * 8.0 / (4 * 64)},
      {"bf16", Target::CKV, 5, 128, {0, 5}, 5 * 256, 256.0, 16.0},
      // llama.cpp-like blocks of 32 along the 576 row: q8_0 576 + 18·2 = 612 B; q4_0 288 + 36 = 324 B.
      {"int8-sym-token-g32", Target::CKV, 2, 576, {0, 2}, 2 * 612, 612.0, 612.0 * 8 / 576},
      {"int4-sym-token-g32", Target::CKV, 2, 576, {0, 2}, 2 * 324, 324.0, 4.5},
      // A single decode token in a per-channel group: 32 B codes + 128·(2+2) B metadata = 544 B,
      // 34 bits per element: the metadata is counted, not hidden.
      {"int2-asym-channel-g32", Target::CKV, 1, 128, {0, 1}, 544, 544.0, 34.0},
      // tiny-mla dump shape: 4 sequences × 512 tokens, 16 groups each -> 64 groups × 128 × 4 B = 32768 B
      // + 2048 × 32 B codes = 65536 B -> 98304 B, 48 B/token, 3 bits (KIVI's "about 3 bits" at INT2, G=32).
      {"int2-asym-channel-g32", Target::CKV, 2048, 128, {0, 512, 1024, 1536, 2048}, 98304, 48.0, 3.0},
      // Three uneven sequences with g32: ceil(40/32) + ceil(1/32) + ceil(23/32) = 2 + 1 + 1 = 4 groups;
      // codes 64 × 64 = 4096 B, metadata 4·128·4 = 2048 B -> 6144 B, 96 B/token, 6 bits.
      {"int4-asym-channel-g32", Target::CKV, 64, 128, {0, 40, 41, 64}, 6144, 96.0, 6.0},
      // Odd D: 33 int4 codes take 17 bytes; int2-sym-tensor on 7×33: 7·9 + 2 = 65 B.
      {"int4-asym-token", Target::CKV, 7, 33, {0, 7}, 7 * (17 + 4), 21.0, 21.0 * 8 / 33},
      {"int2-sym-tensor", Target::CKV, 7, 33, {0, 7}, 65, 65.0 / 7, 65.0 * 8 / (7 * 33)},
  };
  for (const Acct& c : cases) {
    SCOPED_TRACE(std::string(c.spec) + (c.target == Target::KPE ? " on k_pe" : "") + " [" + std::to_string(c.T) + ", " +
                 std::to_string(c.D) + "]");
    const std::vector<float> X = ramp(c.T * c.D);
    const QuantizedTensor q = quant(c.spec, X, c.T, c.D, c.seq, c.target);
    EXPECT_EQ(q.storage_bytes(), c.bytes);
    EXPECT_EQ(latentq::storage_bytes(QuantSpec::parse(c.spec), c.target, c.D, c.seq), c.bytes);
    const latentq::Accounting a = latentq::account(q);
    EXPECT_DOUBLE_EQ(a.bytes_per_token, c.bytes_per_token);
    EXPECT_DOUBLE_EQ(a.bits_per_element, c.bits_per_element);
  }
  // FlashMLA / vLLM fp8_ds_mla total for one layer: c_kv 512 + k_pe 64 = 656 bytes per token.
  const std::vector<float> ckv = ramp(2 * 512), kpe = ramp(2 * 64);
  for (const char* preset : {"flashmla-v32-fp8", "vllm-fp8-ds-mla"}) {
    SCOPED_TRACE(preset);
    const double total = latentq::account(quant(preset, ckv, 2, 512)).bytes_per_token +
                         latentq::account(quant(preset, kpe, 2, 64, {}, Target::KPE)).bytes_per_token;
    EXPECT_EQ(total, 656.0);
    EXPECT_EQ(latentq::record_bytes(QuantSpec::parse(preset), 512, 64), 656);
  }
  // the other engine records, at DeepSeek's 512 + 64 and at the 448 + 64 they were made for
  EXPECT_EQ(latentq::record_bytes(QuantSpec::parse("flashmla-model1-fp8"), 448, 64), 584);  // 448 + 128 + 7 + 1 pad
  EXPECT_EQ(latentq::record_bytes(QuantSpec::parse("flashmla-model1-fp8"), 512, 64), 648);  // 512 + 128 + 8
  EXPECT_EQ(latentq::record_bytes(QuantSpec::parse("flashmla-v41-fp8"), 448, 64), 528);     // 512 + 16
  EXPECT_EQ(latentq::record_bytes(QuantSpec::parse("flashmla-v41-fp8"), 512, 64), 594);     // 576 + 18
}

// storage_bytes() is the layout's count of what quantize() stores: equal for every format family, on random
// shapes and sequence splits (fixed seed; the case is printed on failure).
TEST(Accounting, StorageBytesIsWhatQuantizeStores) {
  const char* specs[] = {"int8-asym-tensor",
                         "int4-sym-tensor-fp32",
                         "int4-asym-channel-g16",
                         "int2-sym-channel",
                         "int8-asym-channel-g32-fp32",
                         "int4-asym-token",
                         "int2-sym-token-g8",
                         "bf16",
                         "fp8-e4m3-tile64-pow2-ue8m0",
                         "fp8-e4m3-tile128-fp32",
                         "fp8-e4m3-tensor",
                         "mxfp8",
                         "mxfp4",
                         "nvfp4",
                         "q8_0",
                         "q4_0",
                         "q4_1",
                         "flashmla-v32-fp8",
                         "vllm-fp8-ds-mla",
                         "fp4-e2m1-tile16-e4m3-rcp",
                         "tq2",
                         "tq3",
                         "tq4-nc",
                         "vllm-turboquant-3bit-nc",
                         "vllm-turboquant-k8v4",
                         "lm2-tensor",
                         "lm3-channel",
                         "lm4-channel-g5",
                         "tc3",
                         "tc2.5-lm"};
  std::mt19937_64 rng(20261202);
  for (int it = 0; it < 60; ++it) {
    const int64_t D = 32 * (1 + static_cast<int64_t>(rng() % 6));  // multiples of 32: every family's blocks fit
    const int64_t S = 1 + static_cast<int64_t>(rng() % 3);
    std::vector<int64_t> seq = {0};
    for (int64_t s = 0; s < S; ++s) seq.push_back(seq.back() + static_cast<int64_t>(rng() % 41));
    if (seq.back() == 0) seq.back() = 1;
    const int64_t T = seq.back();
    const std::vector<float> X = ramp(T * D);
    for (const char* spec : specs)
      for (const Target t : {Target::CKV, Target::KPE}) {
        SCOPED_TRACE(::testing::Message()
                     << "seed 20261202 iteration " << it << ": " << spec << " on " << latentq::to_string(t) << " [" << T
                     << ", " << D << "], " << S << " sequences");
        const QuantizedTensor q = quant(spec, X, T, D, seq, t);
        EXPECT_EQ(latentq::storage_bytes(QuantSpec::parse(spec), t, D, seq), q.storage_bytes());
      }
  }
  EXPECT_EQ(latentq::storage_bytes(QuantSpec::parse("nvfp4"), Target::CKV, 64, std::vector<int64_t>{0, 0}), 0);
  EXPECT_THROW(latentq::storage_bytes(QuantSpec::parse("q4_0"), Target::CKV, 40, std::vector<int64_t>{0, 2}),
               std::invalid_argument);  // ggml blocks never straddle: D must be a multiple of 32
}

// ---- errors -------------------------------------------------------------------------------------

// Runs f, expects std::invalid_argument whose message contains every needle.
template <class F>
void expect_invalid(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "'" << n << "' not in: " << m;
  }
}

TEST(Errors, EmptyMatrix) {
  const std::vector<float> X(4, 1.0f);
  const QuantSpec s = QuantSpec::parse("int8-asym-tensor");
  const std::vector<int64_t> seq0 = {0, 0}, seq1 = {0, 1};
  expect_invalid([&] { latentq::quantize(s, Target::CKV, X.data(), 0, 4, seq0); }, {"empty", "[0, 4]"});
  expect_invalid([&] { latentq::quantize(s, Target::CKV, X.data(), 1, 0, seq1); }, {"empty", "[1, 0]"});
}

TEST(Errors, NonFiniteInputCounted) {
  std::vector<float> X = ramp(3 * 4);
  X[1] = std::numeric_limits<float>::quiet_NaN();
  X[6] = std::numeric_limits<float>::infinity();
  X[11] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(latentq::count_nonfinite(X.data(), 12), 3);
  for (const char* spec : {"int4-asym-channel-g32", "int8-sym-tensor", "bf16", "fp8-e4m3-tile4-pow2",
                           "fp8-e4m3-tile2-fp32", "fp8-e4m3-tensor", "mxfp8", "mxfp4", "nvfp4", "flashmla-v32-fp8"}) {
    SCOPED_TRACE(spec);
    expect_invalid([&] { quant(spec, X, 3, 4); }, {"3 NaN/Inf", "[3, 4]"});
  }
  X[6] = 1.0f;
  X[11] = 1.0f;
  expect_invalid([&] { quant("int2-sym-token", X, 3, 4); }, {"1 NaN/Inf"});
}

TEST(Errors, BadSeqOffsetsForPerChannel) {
  const std::vector<float> X = ramp(6 * 2);
  const std::vector<std::vector<int64_t>> bad = {{0, 5}, {1, 6}, {0, 7}, {0}, {6}};
  for (const auto& seq : bad) {
    SCOPED_TRACE(::testing::PrintToString(seq));
    expect_invalid([&] { quant("int4-asym-channel-g2", X, 6, 2, seq); }, {"seq_offsets", "T = 6"});
  }
  expect_invalid([&] { quant("int4-asym-channel", X, 6, 2, {0, 4, 3, 6}); }, {"non-decreasing", "sequence 1"});
  const std::vector<int64_t> none;
  expect_invalid([&] { latentq::quantize(QuantSpec::parse("int8-sym-channel"), Target::CKV, X.data(), 6, 2, none); },
                 {"seq_offsets"});
  expect_invalid([&] { latentq::channel_groups(std::vector<int64_t>{0, 3}, 4, 0); }, {"T = 4"});
}

TEST(Errors, ScaleOverflowsFp16NamesTheValueAndSuggestsFp32) {
  // int2-sym-tensor: scale = absmax / 1 = 1e6 > 65504 (fp16 max).
  const std::vector<float> X = {1e6f, -1e6f, 5e5f, 0.0f};
  expect_invalid([&] { quant("int2-sym-tensor", X, 1, 4); }, {"scale", "1000000", "int2-sym-tensor", "-fp32"});
  // -fp32 accepts it: scale 1e6 stored exactly, codes 3, 1, 0.5->0 (u 2), 2, decodes ±1e6, 0, 0.
  const QuantizedTensor q = quant("int2-sym-tensor-fp32", X, 1, 4);
  EXPECT_EQ(le32f(q.scales), (std::vector<float>{1e6f}));
  EXPECT_EQ(unpack_codes(q), (std::vector<uint32_t>{3, 1, 2, 2}));
  EXPECT_EQ(decode(q), (std::vector<float>{1e6f, -1e6f, 0.0f, 0.0f}));
  // Per-group: the message names the group.
  expect_invalid(
      [&] {
        quant("int8-asym-token", {0, 1, 0, 1e8f}, 2, 2);
      },
      {"scale", "token 1, dimensions [0, 2)", "-fp32"});
  // per-channel: the group is named as (token range, dimension), not a flat index
  expect_invalid(
      [&] {
        quant("int8-sym-channel-g2", {0, 1, 0, 1e8f, 0, 0}, 3, 2);
      },
      {"scale", "tokens [0, 2), dimension 1", "-fp32"});
}

TEST(Errors, OffsetOverflowsFp16) {
  // offset = min = -1e5 < -65504; the scale 100/255 itself is fine.
  expect_invalid([&] { quant("int8-asym-tensor", {-1e5f, -1e5f + 100.0f}, 1, 2); }, {"offset", "-100000", "-fp32"});
  const QuantizedTensor q = quant("int8-asym-tensor-fp32", {-1e5f, -1e5f + 100.0f}, 1, 2);
  EXPECT_EQ(le32f(q.offsets), (std::vector<float>{-1e5f}));
}

TEST(Errors, Fp32RangeOverflowIsRejectedNotStored) {
  // max − min = 6e38 overflows float32 itself: an error, not an inf scale; no -fp32 advice.
  try {
    quant("int8-asym-tensor-fp32", {-3e38f, 3e38f}, 1, 2);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("overflows"), std::string::npos) << m;
    EXPECT_EQ(m.find("use the -fp32"), std::string::npos) << m;
  }
}

TEST(Errors, HandBuiltInvalidSpecsRejected) {
  const std::vector<float> X = ramp(2 * 8);
  const std::vector<int64_t> seq = {0, 2};
  for (int bits : {0, 1, 3, 16}) {
    QuantSpec s = QuantSpec::parse("int4-asym-token");
    s.bits = bits;
    SCOPED_TRACE("bits " + std::to_string(bits));
    expect_invalid([&] { latentq::quantize(s, Target::CKV, X.data(), 2, 8, seq); }, {"bits"});
  }
  QuantSpec g = QuantSpec::parse("int4-asym-channel");
  g.group_size = -4;
  expect_invalid([&] { latentq::quantize(g, Target::CKV, X.data(), 2, 8, seq); }, {"group size"});
  QuantSpec f = QuantSpec::parse("fp8-e4m3-tile128-pow2");
  f.group_size = 0;
  expect_invalid([&] { latentq::quantize(f, Target::CKV, X.data(), 2, 8, seq); }, {"tile"});
}

TEST(Errors, HandBuiltBlockSpecsWithFreeFieldsRejected) {
  // Block formats have no free fields: a hand-built spec whose fields parse() never gives for its name
  // (an fp8 tile left with fp16 scales, an mxfp4 with fp16 scales) is refused, not stored in a layout
  // that scale_at() would misread.
  const std::vector<float> X = ramp(2 * 130);
  const std::vector<int64_t> seq = {0, 2};
  QuantSpec f;
  f.format = Format::Fp8Tile;
  f.group_size = 128;
  f.rule = latentq::ScaleRule::Pow2;
  ASSERT_EQ(f.scale_dtype, ScaleDtype::F16);
  expect_invalid([&] { latentq::quantize(f, Target::CKV, X.data(), 2, 130, seq); }, {"never produces"});
  QuantSpec m = QuantSpec::parse("mxfp4");
  m.scale_dtype = ScaleDtype::F16;
  expect_invalid([&] { latentq::quantize(m, Target::CKV, X.data(), 2, 130, seq); }, {"never produces"});
}

}  // namespace
