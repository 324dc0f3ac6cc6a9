// Hand-computed quantization of tiny matrices: every granularity (tensor, channel, token) x scheme
// (sym, asym) x bits (8, 4, 2). Inputs are chosen so every scale and offset is exact in fp16 (the
// fp16 rounding itself is tested in test_quantize_formats.cpp, FormatsFp16Rounding), so each
// expected code is a plain round-half-to-even of (x - offset) / scale, clamped; the arithmetic is
// written next to each case.
//
// Conventions (qmath.h): sym scale = absmax / (2^(b-1) - 1), code u = q + 2^(b-1);
// asym scale = (max - min) / (2^b - 1), offset = min, u = q. Packing: INT4 element 2k in the low
// nibble of byte k, INT2 element 4k+j at bits 2j..2j+1, rows padded with zero bits.
#include "test_helpers.h"

namespace {
using namespace lqtest;

struct Want {
  std::vector<uint32_t> u;      // unpacked codes [T*D]
  std::vector<uint8_t> packed;  // raw code bytes [T*row_bytes]
  std::vector<double> scales;   // stored scales, layout order
  std::vector<double> offsets;  // stored offsets (asym), layout order; empty for sym
  std::vector<float> xhat;      // decoded values [T*D]
  std::vector<int64_t> bounds;  // channel: token-group boundaries; else empty
};

void check(const std::string& spec, const std::vector<float>& X, int64_t T, int64_t D, const Want& w,
           std::vector<int64_t> seq = {}) {
  SCOPED_TRACE(spec + " [" + std::to_string(T) + ", " + std::to_string(D) + "]");
  const QuantizedTensor q = quant(spec, X, T, D, seq);
  ASSERT_EQ(q.spec, QuantSpec::parse(spec));
  ASSERT_EQ(q.rows, T);
  ASSERT_EQ(q.cols, D);
  EXPECT_EQ(q.group_bounds, w.bounds);
  ASSERT_EQ(q.codes.size(), w.packed.size());
  for (size_t i = 0; i < w.packed.size(); ++i) EXPECT_EQ(int(q.codes[i]), int(w.packed[i])) << "code byte " << i;
  EXPECT_EQ(unpack_codes(q), w.u);
  ASSERT_EQ(q.scales.size(), 2 * w.scales.size());  // fp16
  EXPECT_EQ(stored_values(q.scales, ScaleDtype::F16), w.scales);
  ASSERT_EQ(q.offsets.size(), 2 * w.offsets.size());
  EXPECT_EQ(stored_values(q.offsets, ScaleDtype::F16), w.offsets);
  const std::vector<float> xh = decode(q);
  ASSERT_EQ(xh.size(), w.xhat.size());
  for (size_t i = 0; i < xh.size(); ++i) EXPECT_EQ(xh[i], w.xhat[i]) << "element " << i << " (x = " << X[i] << ")";
}

// ---- per-tensor ---------------------------------------------------------------------------------

TEST(HandTensor, Int8Sym) {
  // absmax 127 -> scale 127/127 = 1. q = rne(x): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2,
  // -3.5 -> -4, 100.25 -> 100, -0.25 -> 0, 126.5 -> 126, 3.5 -> 4.  u = q + 128.
  const std::vector<float> X = {127, -127, 0, 0.5f, 1.5f, 2.5f, -2.5f, -3.5f, 100.25f, -0.25f, 126.5f, 3.5f};
  Want w;
  w.u = {255, 1, 128, 128, 130, 130, 126, 124, 228, 128, 254, 132};
  w.packed.assign(w.u.begin(), w.u.end());
  w.scales = {1.0};
  w.xhat = {127, -127, 0, 0, 2, 2, -2, -4, 100, 0, 126, 4};
  check("int8-sym-tensor", X, 3, 4, w);
}

TEST(HandTensor, Int8Asym) {
  // min -1, max 254 -> scale 255/255 = 1, offset -1. q = rne(x + 1):
  // 0.5 -> 1.5 -> 2, 1.5 -> 2.5 -> 2, 10.25 -> 11.25 -> 11, 100.5 -> 101.5 -> 102, 101.5 -> 102.5 -> 102,
  // -0.5 -> 0.5 -> 0, 253.5 -> 254.5 -> 254.  x̂ = q - 1.
  const std::vector<float> X = {-1, 254, 0.5f, 1.5f, 3, 10.25f, 100.5f, 101.5f, -0.5f, 200, 253.5f, 7};
  Want w;
  w.u = {0, 255, 2, 2, 4, 11, 102, 102, 0, 201, 254, 8};
  w.packed.assign(w.u.begin(), w.u.end());
  w.scales = {1.0};
  w.offsets = {-1.0};
  w.xhat = {-1, 254, 1, 1, 3, 10, 101, 101, -1, 200, 253, 7};
  check("int8-asym-tensor", X, 3, 4, w);
}

TEST(HandTensor, Int4Sym) {
  // absmax 3.5 -> scale 3.5/7 = 0.5. x/0.5 = 7,-7,2.5,-2.5 | 3.5,0.5,-1.5,0 | 4,-6,1,6.5
  // q = 7,-7,2,-2 | 4,0,-2,0 | 4,-6,1,6;  u = q + 8 = 15,1,10,6 | 12,8,6,8 | 12,2,9,14.
  // Bytes: 15|1<<4 = 0x1f, 10|6<<4 = 0x6a | 0x8c, 0x86 | 0x2c, 0xe9.
  const std::vector<float> X = {3.5f, -3.5f, 1.25f, -1.25f, 1.75f, 0.25f, -0.75f, 0, 2, -3, 0.5f, 3.25f};
  Want w;
  w.u = {15, 1, 10, 6, 12, 8, 6, 8, 12, 2, 9, 14};
  w.packed = {0x1f, 0x6a, 0x8c, 0x86, 0x2c, 0xe9};
  w.scales = {0.5};
  w.xhat = {3.5f, -3.5f, 1, -1, 2, 0, -1, 0, 2, -3, 0.5f, 3};
  check("int4-sym-tensor", X, 3, 4, w);
}

TEST(HandTensor, Int4Asym) {
  // min -2, max 5.5 -> scale 7.5/15 = 0.5, offset -2. (x+2)/0.5 = 0,15,4,0.5 | 6.5,9.5,3.5,12 | 10,14.5,0,5.5
  // q = 0,15,4,0 | 6,10,4,12 | 10,14,0,6.  Bytes 0xf0,0x04 | 0xa6,0xc4 | 0xea,0x60.  x̂ = -2 + q/2.
  const std::vector<float> X = {-2, 5.5f, 0, -1.75f, 1.25f, 2.75f, -0.25f, 4, 3, 5.25f, -2, 0.75f};
  Want w;
  w.u = {0, 15, 4, 0, 6, 10, 4, 12, 10, 14, 0, 6};
  w.packed = {0xf0, 0x04, 0xa6, 0xc4, 0xea, 0x60};
  w.scales = {0.5};
  w.offsets = {-2.0};
  w.xhat = {-2, 5.5f, 0, -2, 1, 3, 0, 4, 3, 5, -2, 1};
  check("int4-asym-tensor", X, 3, 4, w);
}

TEST(HandTensor, Int2Sym) {
  // absmax 2 -> scale 2/1 = 2. x/2 = 1,-1,0.5,-0.5 | 0.75,-0.75,0.125,0 | 0.45,-0.55,1,0.55
  // q = 1,-1,0,0 | 1,-1,0,0 | 0,-1,1,1;  u = q + 2 = 3,1,2,2 | 3,1,2,2 | 2,1,3,3.
  // Byte = u0 | u1<<2 | u2<<4 | u3<<6: 3+4+32+128 = 0xa7 | 0xa7 | 2+4+48+192 = 0xf6.
  const std::vector<float> X = {2, -2, 1, -1, 1.5f, -1.5f, 0.25f, 0, 0.9f, -1.1f, 2, 1.1f};
  Want w;
  w.u = {3, 1, 2, 2, 3, 1, 2, 2, 2, 1, 3, 3};
  w.packed = {0xa7, 0xa7, 0xf6};
  w.scales = {2.0};
  w.xhat = {2, -2, 0, 0, 2, -2, 0, 0, 0, -2, 2, 2};
  check("int2-sym-tensor", X, 3, 4, w);
}

TEST(HandTensor, Int2Asym) {
  // min -1.5, max 1.5 -> scale 3/3 = 1, offset -1.5. x + 1.5 = 0,3,0.5,1.5 | 2.5,1,2.4,0.6 | 3,0,1.49,2.51
  // q = 0,3,0,2 | 2,1,2,1 | 3,0,1,3.  Bytes: 0+12+0+128 = 0x8c | 2+4+32+64 = 0x66 | 3+0+16+192 = 0xd3.
  const std::vector<float> X = {-1.5f, 1.5f, -1, 0, 1, -0.5f, 0.9f, -0.9f, 1.5f, -1.5f, -0.01f, 1.01f};
  Want w;
  w.u = {0, 3, 0, 2, 2, 1, 2, 1, 3, 0, 1, 3};
  w.packed = {0x8c, 0x66, 0xd3};
  w.scales = {1.0};
  w.offsets = {-1.5};
  w.xhat = {-1.5f, 1.5f, -1.5f, 0.5f, 0.5f, -0.5f, 0.5f, -0.5f, 1.5f, -1.5f, -0.5f, 1.5f};
  check("int2-asym-tensor", X, 3, 4, w);
}

// ---- per-channel --------------------------------------------------------------------------------

TEST(HandChannel, Int8SymWholeSequence) {
  // Columns (3 tokens, one sequence, one group):
  //   d0 [127, -1.5, 2.5]    absmax 127  -> scale 1:   q 127, -2, 2
  //   d1 [-63.5, 0.75, 1.25] absmax 63.5 -> scale 0.5: q -127, 1.5->2, 2.5->2
  //   d2 [0, 0, 0]           all zero    -> scale 0:   q 0 (u 128), decodes to exactly 0
  //   d3 [254, 3, -5]        absmax 254  -> scale 2:   q 127, 1.5->2, -2.5->-2
  const std::vector<float> X = {127, -63.5f, 0, 254, -1.5f, 0.75f, 0, 3, 2.5f, 1.25f, 0, -5};
  Want w;
  w.u = {255, 1, 128, 255, 126, 130, 128, 130, 130, 130, 128, 126};
  w.packed.assign(w.u.begin(), w.u.end());
  w.scales = {1, 0.5, 0, 2};
  w.xhat = {127, -63.5f, 0, 254, -2, 1, 0, 4, 2, 1, 0, -4};
  w.bounds = {0, 3};
  check("int8-sym-channel", X, 3, 4, w);
}

TEST(HandChannel, Int8AsymPartialLastGroup) {
  // g = 3 on T = 5: groups [0,3) and the partial [3,5), each with its own statistics.
  //   d0: [0, 255, 100.5 | 10, 10]   g0 scale 1, offset 0: q 0, 255, 100.5->100;
  //                                   g1 max == min: scale 0, offset 10, q 0, decodes to 10.
  //   d1: [-1, 509, 2 | -4, 27.875]  g0 scale 510/255 = 2, offset -1: q 0, 255, 3/2 = 1.5->2 (x̂ 3);
  //                                   g1 scale 31.875/255 = 0.125, offset -4: q 0, 255.
  const std::vector<float> X = {0, -1, 255, 509, 100.5f, 2, 10, -4, 10, 27.875f};
  Want w;
  w.u = {0, 0, 255, 255, 100, 2, 0, 0, 0, 255};
  w.packed.assign(w.u.begin(), w.u.end());
  w.scales = {1, 2, 0, 0.125};
  w.offsets = {0, -1, 10, -4};
  w.xhat = {0, -1, 255, 509, 100, 3, 10, -4, 10, 27.875f};
  w.bounds = {0, 3, 5};
  check("int8-asym-channel-g3", X, 5, 2, w);
}

TEST(HandChannel, Int4Sym) {
  //   d0 [7, -3.5, 2.5]     scale 7/7 = 1:     q 7, -3.5->-4, 2.5->2
  //   d1 [3.5, -1.25, 0.25] scale 3.5/7 = 0.5: q 7, -2.5->-2, 0.5->0
  // u = q + 8: rows (15,15), (4,6), (10,8) -> one byte per row: 0xff, 0x64, 0x8a.
  const std::vector<float> X = {7, 3.5f, -3.5f, -1.25f, 2.5f, 0.25f};
  Want w;
  w.u = {15, 15, 4, 6, 10, 8};
  w.packed = {0xff, 0x64, 0x8a};
  w.scales = {1, 0.5};
  w.xhat = {7, 3.5f, -4, -1, 2, 0};
  w.bounds = {0, 3};
  check("int4-sym-channel", X, 3, 2, w);
}

TEST(HandChannel, Int4AsymTwoSequences) {
  // seq_offsets {0, 2, 5}: groups [0,2) and [2,5) (group_size 0 = whole sequence, never across).
  //   seq 0: d0 [0, 15]            scale 1, offset 0: q 0, 15
  //          d1 [2, 2]             zero range: scale 0, offset 2, decodes to 2
  //   seq 1: d0 [-3, 4.5, 0.25]    scale 7.5/15 = 0.5, offset -3: q 0, 15, 3.25/0.5 = 6.5->6 (x̂ 0)
  //          d1 [1, 8.5, 4.75]     scale 0.5, offset 1: q 0, 15, 3.75/0.5 = 7.5->8 (x̂ 5)
  // A group spanning both sequences would have d0 range [-3, 15] and different codes.
  // Bytes (d0 | d1<<4): 0x00, 0x0f, 0x00, 0xff, 0x86.
  const std::vector<float> X = {0, 2, 15, 2, -3, 1, 4.5f, 8.5f, 0.25f, 4.75f};
  Want w;
  w.u = {0, 0, 15, 0, 0, 0, 15, 15, 6, 8};
  w.packed = {0x00, 0x0f, 0x00, 0xff, 0x86};
  w.scales = {1, 0, 0.5, 0.5};
  w.offsets = {0, 2, -3, 1};
  w.xhat = {0, 2, 15, 2, -3, 1, 4.5f, 8.5f, 0, 5};
  w.bounds = {0, 2, 5};
  check("int4-asym-channel", X, 5, 2, w, {0, 2, 5});
  // The same with a group size larger than each sequence: one group per sequence, same bytes.
  Want w2 = w;
  check("int4-asym-channel-g64", X, 5, 2, w2, {0, 2, 5});
}

TEST(HandChannel, Int2SymPartialGroup) {
  // g = 2 on T = 3: groups [0,2) and [2,3).
  //   d0 [4, -1 | -3]  g0 scale 4: q 1, -0.25->0;  g1 scale 3: q -1
  //   d1 [-2, 1 | 0]   g0 scale 2: q -1, 0.5->0;   g1 all zero: scale 0, q 0
  // u = q + 2: rows (3,1), (2,2), (1,2) -> u0 | u1<<2: 7, 10, 9 (bits 4-7 are zero padding).
  const std::vector<float> X = {4, -2, -1, 1, -3, 0};
  Want w;
  w.u = {3, 1, 2, 2, 1, 2};
  w.packed = {7, 10, 9};
  w.scales = {4, 2, 3, 0};
  w.xhat = {4, -2, 0, 0, -3, 0};
  w.bounds = {0, 2, 3};
  check("int2-sym-channel-g2", X, 3, 2, w);
}

TEST(HandChannel, Int2AsymThreeUnevenSequences) {
  // seq_offsets {0, 1, 4, 6}: groups [0,1), [1,4), [4,6).
  //   d0: seq0 [5]            single token: scale 0, offset 5 (x̂ 5)
  //       seq1 [0, 3, 1.5]    scale 1, offset 0: q 0, 3, 1.5->2
  //       seq2 [-1, 2]        scale 1, offset -1: q 0, 3
  //   d1: seq0 [-0.25]        scale 0, offset -0.25
  //       seq1 [1, -2, 0.5]   scale 1, offset -2: q 3, 0, 2.5->2 (x̂ 0)
  //       seq2 [0.75, 0.75]   scale 0, offset 0.75
  // Bytes (d0 | d1<<2): 0, 12, 3, 10, 0, 3.
  const std::vector<float> X = {5, -0.25f, 0, 1, 3, -2, 1.5f, 0.5f, -1, 0.75f, 2, 0.75f};
  Want w;
  w.u = {0, 0, 0, 3, 3, 0, 2, 2, 0, 0, 3, 0};
  w.packed = {0, 12, 3, 10, 0, 3};
  w.scales = {0, 0, 1, 1, 1, 0};
  w.offsets = {5, -0.25, 0, -2, -1, 0.75};
  w.xhat = {5, -0.25f, 0, 1, 3, -2, 2, 0, -1, 0.75f, 2, 0.75f};
  w.bounds = {0, 1, 4, 6};
  check("int2-asym-channel", X, 6, 2, w, {0, 1, 4, 6});
}

TEST(HandChannel, GroupsNeverSpanSequences) {
  const std::vector<int64_t> seq = {0, 3, 3, 8, 9};  // lengths 3, 0, 5, 1
  EXPECT_EQ(latentq::channel_groups(seq, 9, 0), (std::vector<int64_t>{0, 3, 8, 9}));
  EXPECT_EQ(latentq::channel_groups(seq, 9, 2), (std::vector<int64_t>{0, 2, 3, 5, 7, 8, 9}));
  EXPECT_EQ(latentq::channel_groups(seq, 9, 4), (std::vector<int64_t>{0, 3, 7, 8, 9}));
  EXPECT_EQ(latentq::channel_groups(seq, 9, 100), (std::vector<int64_t>{0, 3, 8, 9}));
  EXPECT_EQ(latentq::channel_groups(std::vector<int64_t>{0, 7}, 7, 3), (std::vector<int64_t>{0, 3, 6, 7}));
  EXPECT_EQ(latentq::channel_groups(std::vector<int64_t>{0, 1}, 1, 32), (std::vector<int64_t>{0, 1}));
}

// ---- per-token ----------------------------------------------------------------------------------

TEST(HandToken, Int8Sym) {
  //   t0 [127, -2.5, 0.5]        scale 1:    q 127, -2, 0     -> u 255, 126, 128
  //   t1 [0, 0, 0]               scale 0:    q 0              -> u 128, x̂ exactly 0
  //   t2 [-31.75, 0.125, 0.375]  scale 0.25: q -127, 0.5->0, 1.5->2 -> u 1, 128, 130
  const std::vector<float> X = {127, -2.5f, 0.5f, 0, 0, 0, -31.75f, 0.125f, 0.375f};
  Want w;
  w.u = {255, 126, 128, 128, 128, 128, 1, 128, 130};
  w.packed.assign(w.u.begin(), w.u.end());
  w.scales = {1, 0, 0.25};
  w.xhat = {127, -2, 0, 0, 0, 0, -31.75f, 0, 0.5f};
  check("int8-sym-token", X, 3, 3, w);
}

TEST(HandToken, Int8AsymPartialLastGroup) {
  // g = 3 on D = 4: groups [0,3) and the partial [3,4).
  //   t0 [0, 255, 100.5 | 7]    g0 scale 1, offset 0: q 0, 255, 100;   g1 scale 0, offset 7
  //   t1 [-2, 508, 3 | -0.5]    g0 scale 2, offset -2: q 0, 255, 5/2 = 2.5->2 (x̂ 2); g1 scale 0, offset -0.5
  const std::vector<float> X = {0, 255, 100.5f, 7, -2, 508, 3, -0.5f};
  Want w;
  w.u = {0, 255, 100, 0, 0, 255, 2, 0};
  w.packed.assign(w.u.begin(), w.u.end());
  w.scales = {1, 0, 2, 0};
  w.offsets = {0, 7, -2, -0.5};
  w.xhat = {0, 255, 100, 7, -2, 508, 2, -0.5f};
  check("int8-asym-token-g3", X, 2, 4, w);
}

TEST(HandToken, Int4SymOddDimPartialGroup) {
  // g = 2 on D = 5: groups [0,2), [2,4), [4,5).
  //   t0 [7, -1.5 | 3.5, 1.25 | -0.875]  scales 1, 0.5, 0.125: q 7, -2 | 7, 2.5->2 | -7
  //      u 15, 6, 15, 10, 1 -> bytes 15|6<<4 = 0x6f, 15|10<<4 = 0xaf, 0x01 (high nibble padding 0)
  //   t1 [0, 0 | -7, 3.5 | 0]            scales 0, 1, 0: q 0, 0 | -7, 3.5->4 | 0
  //      u 8, 8, 1, 12, 8 -> 0x88, 0xc1, 0x08
  const std::vector<float> X = {7, -1.5f, 3.5f, 1.25f, -0.875f, 0, 0, -7, 3.5f, 0};
  Want w;
  w.u = {15, 6, 15, 10, 1, 8, 8, 1, 12, 8};
  w.packed = {0x6f, 0xaf, 0x01, 0x88, 0xc1, 0x08};
  w.scales = {1, 0.5, 0.125, 0, 1, 0};
  w.xhat = {7, -2, 3.5f, 1, -0.875f, 0, 0, -7, 4, 0};
  check("int4-sym-token-g2", X, 2, 5, w);
}

TEST(HandToken, Int4AsymOddDim) {
  //   t0 [-1, 6.5, 2.25]  scale 7.5/15 = 0.5, offset -1: q 0, 15, 3.25/0.5 = 6.5->6 (x̂ 2)
  //                       bytes 0|15<<4 = 0xf0, 0x06 (padding nibble 0)
  //   t1 [4, 4, 4]        scale 0, offset 4: all q 0, x̂ 4
  const std::vector<float> X = {-1, 6.5f, 2.25f, 4, 4, 4};
  Want w;
  w.u = {0, 15, 6, 0, 0, 0};
  w.packed = {0xf0, 0x06, 0x00, 0x00};
  w.scales = {0.5, 0};
  w.offsets = {-1, 4};
  w.xhat = {-1, 6.5f, 2, 4, 4, 4};
  check("int4-asym-token", X, 2, 3, w);
}

TEST(HandToken, Int2SymOddDim) {
  //   t0 [2, -1, 1, -2, 0.5]     scale 2: x/2 = 1, -0.5, 0.5, -1, 0.25 -> q 1, 0, 0, -1, 0
  //      u 3, 2, 2, 1, 2 -> byte0 3|2<<2|2<<4|1<<6 = 107 = 0x6b, byte1 0x02 (6 padding bits 0)
  //   t1 [-3, 1.5, 1.6, -1.4, 0] scale 3: x/3 = -1, 0.5, 0.53, -0.47, 0 -> q -1, 0, 1, 0, 0
  //      u 1, 2, 3, 2, 2 -> 1|2<<2|3<<4|2<<6 = 185 = 0xb9, 0x02
  const std::vector<float> X = {2, -1, 1, -2, 0.5f, -3, 1.5f, 1.6f, -1.4f, 0};
  Want w;
  w.u = {3, 2, 2, 1, 2, 1, 2, 3, 2, 2};
  w.packed = {0x6b, 0x02, 0xb9, 0x02};
  w.scales = {2, 3};
  w.xhat = {2, 0, 0, -2, 0, -3, 0, 3, 0, 0};
  check("int2-sym-token", X, 2, 5, w);
}

TEST(HandToken, Int2AsymPartialLastGroup) {
  // g = 4 on D = 6: groups [0,4), [4,6).
  //   [0, 3, 1.5, 2.5 | 10, 10.75]  g0 scale 1, offset 0: q 0, 3, 1.5->2, 2.5->2
  //                                 g1 scale 0.75/3 = 0.25, offset 10: q 0, 3
  //   bytes: 0|3<<2|2<<4|2<<6 = 172 = 0xac, 0|3<<2 = 0x0c
  const std::vector<float> X = {0, 3, 1.5f, 2.5f, 10, 10.75f};
  Want w;
  w.u = {0, 3, 2, 2, 0, 3};
  w.packed = {0xac, 0x0c};
  w.scales = {1, 0.25};
  w.offsets = {0, 10};
  w.xhat = {0, 3, 2, 2, 10, 10.75f};
  check("int2-asym-token-g4", X, 1, 6, w);
}

TEST(HandToken, GroupLargerThanAxisIsOneGroup) {
  const std::vector<float> X = {-1, 6.5f, 2.25f, 4, 4, 4};
  const QuantizedTensor a = quant("int4-asym-token", X, 2, 3), b = quant("int4-asym-token-g100", X, 2, 3);
  EXPECT_EQ(b.row_group(), 3);
  EXPECT_EQ(b.scales_per_row(), 1);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.offsets, b.offsets);
}

// ---- zero-range and degenerate groups -----------------------------------------------------------

TEST(HandDegenerate, ConstantGroupDecodesToStoredOffset) {
  // 1000.3 is not an fp16 value: spacing at 1000 is 0.5, so the stored offset is 1000.5 (0x63d1).
  // max == min: scale 0, every code 0, every element decodes to exactly the stored offset.
  for (const char* spec : {"int8-asym-tensor", "int4-asym-token", "int2-asym-channel", "int2-asym-channel-g1"}) {
    SCOPED_TRACE(spec);
    const std::vector<float> X(6, 1000.3f);
    const QuantizedTensor q = quant(spec, X, 2, 3);
    for (uint16_t h : le16(q.offsets)) EXPECT_EQ(h, 0x63d1);
    for (uint16_t h : le16(q.scales)) EXPECT_EQ(h, 0x0000);
    for (uint32_t u : unpack_codes(q)) EXPECT_EQ(u, 0u);
    for (float v : decode(q)) EXPECT_EQ(v, 1000.5f);
  }
}

TEST(HandDegenerate, AllZeroSymGroupDecodesToZero) {
  for (const char* spec : {"int8-sym-tensor", "int4-sym-channel", "int2-sym-token-g2", "int4-sym-channel-g1"}) {
    SCOPED_TRACE(spec);
    const std::vector<float> X(6, 0.0f);
    const QuantizedTensor q = quant(spec, X, 2, 3);
    const uint32_t mid = 1u << (q.spec.bits - 1);
    for (uint16_t h : le16(q.scales)) EXPECT_EQ(h, 0x0000);
    EXPECT_TRUE(q.offsets.empty());
    for (uint32_t u : unpack_codes(q)) EXPECT_EQ(u, mid);
    for (float v : decode(q)) EXPECT_EQ(bits_of(v), 0u);  // +0, not NaN
  }
}

TEST(HandDegenerate, RangeBelowFp16ResolutionGivesScaleZero) {
  // asym: range 2^-20 -> scale 2^-20/255 ≈ 3.7e-9 < 2^-25 (half the smallest fp16 subnormal) -> 0.
  // Everything decodes to the offset 1; no division by zero, no inf/NaN.
  {
    const QuantizedTensor q = quant("int8-asym-tensor", {1.0f, 1.0f + 0x1p-20f}, 1, 2);
    EXPECT_EQ(le16(q.scales)[0], 0x0000);
    EXPECT_EQ(decode(q), (std::vector<float>{1.0f, 1.0f}));
    // -fp32 keeps the scale: codes 0 and 255, x̂ = 1 + 255·fl(2^-20/255).
    const QuantizedTensor q32 = quant("int8-asym-tensor-fp32", {1.0f, 1.0f + 0x1p-20f}, 1, 2);
    const float s = 0x1p-20f / 255.0f;
    EXPECT_EQ(le32f(q32.scales)[0], s);
    EXPECT_EQ(unpack_codes(q32), (std::vector<uint32_t>{0, 255}));
    EXPECT_EQ(decode(q32)[1], 1.0f + 255.0f * s);
  }
  // sym: absmax 1e-9 -> scale 7.9e-12 -> fp16 0 -> codes 128, x̂ 0.
  {
    const QuantizedTensor q = quant("int8-sym-tensor", {1e-9f, -1e-9f}, 1, 2);
    EXPECT_EQ(le16(q.scales)[0], 0x0000);
    EXPECT_EQ(unpack_codes(q), (std::vector<uint32_t>{128, 128}));
    EXPECT_EQ(decode(q), (std::vector<float>{0.0f, 0.0f}));
  }
}

TEST(HandDegenerate, SubnormalFp16ScaleIsExact) {
  // absmax 127·2^-20 -> scale 2^-20 = 16·2^-24, an fp16 subnormal (0x0010). x = k·2^-20 decode exactly.
  const std::vector<float> X = {127 * 0x1p-20f, -5 * 0x1p-20f, 2.5f * 0x1p-20f, 0};
  const QuantizedTensor q = quant("int8-sym-tensor", X, 1, 4);
  EXPECT_EQ(le16(q.scales)[0], 0x0010);
  EXPECT_EQ(unpack_codes(q), (std::vector<uint32_t>{255, 123, 130, 128}));
  EXPECT_EQ(decode(q), (std::vector<float>{127 * 0x1p-20f, -5 * 0x1p-20f, 2 * 0x1p-20f, 0}));
}

}  // namespace
