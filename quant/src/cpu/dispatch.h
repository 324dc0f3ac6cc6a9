// quant/src/cpu/dispatch.h — private: the entry points of the CPU kernels, in one place. First what
// quantize.cpp calls, one quantize / dequantize pair per storage kind (its StorageOps table); then each
// ISA's entry points, which the drivers in dispatch.cpp pick by the selected CpuKernel (quantize.h):
//   Reference  reference.cpp     the plain loops (integer formats; bf16 on every kernel)
//   Baseline   int_baseline.cpp  the fused integer kernels (int_fused.h) for the baseline ISA
//   Avx2       int_avx2.cpp      the fused integer kernels with target("avx2,f16c"), the AVX2 dequantize
//              block_avx2.cpp    the AVX2 e4m3 / e2m1 / ggml block elements, the one-pass max|x|
//              codebook_avx2.cpp the rows of the codebook families (lm, tq, tc) once their tables are fitted
// The block formats run blockfmt.h's block functions on every kernel (dispatch.cpp, quantize_blocks).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels.h"
#include "latentq/lloyd_max.h"
#include "latentq/quantize.h"
#include "latentq/transform_coding.h"
#include "latentq/turboquant.h"

namespace latentq::cpu {

// ---- per storage kind (quantize.cpp) --------------------------------------------------------------

/// The input of one non-fused quantize() call: X [T, D] row-major float32 (checked for NaN/Inf), the
/// sequence boundaries [S+1], the kernel, and max|x| when check_finite's pass gave it (Avx2), else −1.
struct QuantizeInput {
  const float* X;
  int64_t T, D;
  std::span<const int64_t> seq_offsets;
  CpuKernel kernel;
  float amax;
};

/// Throws std::invalid_argument (nonfinite_message) if X [T, D] holds a NaN/Inf. Avx2 takes max|x| in the
/// same pass (abs_bits_max_avx2) and returns it; the other kernels return −1.
float check_finite(const float* X, int64_t T, int64_t D, CpuKernel kernel);

/// Integer formats on the fused kernels (kernel Baseline or Avx2), the whole of quantize() /
/// quantize_into() for them: validation, layout and the NaN/Inf check included (dispatch.cpp).
void quantize_int_fast(QuantizedTensor& qt, const QuantSpec& spec_in, Target target, const float* X, int64_t T,
                       int64_t D, std::span<const int64_t> seq_offsets, CpuKernel kernel);
/// Integer formats, reference loops (CpuKernel::Reference; reference.cpp).
void quantize_int_reference(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in);
/// Integer dequantize: the reference loops for Reference, else the fused kernels across threads.
void dequantize_int(const QuantizedTensor& qt, float* out, CpuKernel kernel);
/// bf16 on every kernel (reference.cpp).
void quantize_bf16(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in);
void dequantize_bf16(const QuantizedTensor& qt, float* out, CpuKernel kernel);
/// The block formats (blockfmt.h) on every kernel: rows split across threads (not under Reference), the
/// AVX2 element paths under Avx2 (dispatch.cpp).
void quantize_blocks(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in);
void dequantize_blocks(const QuantizedTensor& qt, float* out, CpuKernel kernel);

/// TurboQuant (turboquant.h) on every kernel: the scalar row loops and fwht_rows (turboquant.cpp).
void quantize_tq(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in);
void dequantize_tq(const QuantizedTensor& qt, float* out, CpuKernel kernel);
/// Lloyd-Max codebooks (lloyd_max.h) on every kernel: the fit, then the scalar row loops (lloyd_max.cpp).
void quantize_lm(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in);
void dequantize_lm(const QuantizedTensor& qt, float* out, CpuKernel kernel);
/// Transform coding (transform_coding.h) on every kernel: the record, then the scalar row loops
/// (transform_coding.cpp).
void quantize_tc(QuantizedTensor& qt, const Layout& L, const QuantizeInput& in);
void dequantize_tc(const QuantizedTensor& qt, float* out, CpuKernel kernel);

/// The rows of the codebook families once their tables are fitted (fit_quantizer and encode in fitted.h, and
/// quantize() after its fit): X [T, D] float32 into codes [T, rb] (rb: the layout's row_code_bytes) and back.
/// Avx2 runs codebook_avx2.cpp's rows; Reference and Baseline the scalar element math (codebook.h,
/// lloyd_max.h, turboquant.h, transform_coding.h). The bytes are the same on every kernel.
/// The encoders also check X for NaN/Inf (Avx2: in their one pass over X; else before it) and throw
/// std::invalid_argument (nonfinite_message) for one.
void lm_encode_rows(const LloydMaxTables& tab, const float* X, int64_t T, int64_t D, uint8_t* codes, CpuKernel kernel);
void lm_decode_rows(const LloydMaxTables& tab, const uint8_t* codes, int64_t T, int64_t D, float* out,
                    CpuKernel kernel);
void tc_encode_rows(const TcHostTables& tab, const float* X, int64_t T, int64_t D, int64_t rb, uint8_t* codes,
                    CpuKernel kernel);
void tc_decode_rows(const TcHostTables& tab, const uint8_t* codes, int64_t T, int64_t D, int64_t rb, float* out,
                    CpuKernel kernel);

/// The output size (bytes) from which the fused kernels write with non-temporal stores
/// (set_cpu_stream_min_bytes).
int64_t stream_min_bytes();

// ---- per ISA ---------------------------------------------------------------------------------------

// What one call of the fused integer kernel does: rows (tensor, token) or token groups (channel)
// [begin, end) of an already laid-out QuantizedTensor.
struct IntJob {
  QuantizedTensor* qt;
  const float* X;
  int64_t begin, end;
  float tensor_scale, tensor_offset;  // per-tensor: the stored parameters
  bool stream;                        // write the codes with non-temporal stores (kStreamMinBytes)
};

struct DecJob {
  const QuantizedTensor* qt;
  float* out;
  int64_t begin, end;  // rows (tensor, token) or token groups (channel)
};

// Reference (reference.cpp)
void dequantize_int_reference(const QuantizedTensor& qt, float* out);

// Baseline (int_baseline.cpp). int_quantize_*: returns 1 if a NaN/Inf was seen (the caller throws).
// minmax_span_*: min and max of x[0, n) as the reference's fold gives them; returns 1 for a NaN/Inf.
uint32_t int_quantize_baseline(const IntJob& job);
void int_dequantize_baseline(const DecJob& job);
uint32_t minmax_span_baseline(const float* x, int64_t n, float& mn, float& mx);

#if LQ_HAVE_AVX2_KERNEL
// Avx2, integer formats (int_avx2.cpp)
__attribute__((LQ_AVX2_TARGET)) uint32_t int_quantize_avx2(const IntJob& job);
__attribute__((LQ_AVX2_TARGET)) void int_dequantize_avx2(const DecJob& job);
__attribute__((LQ_AVX2_TARGET)) uint32_t minmax_span_avx2(const float* x, int64_t n, float& mn, float& mx);

// Avx2, block formats (block_avx2.cpp): the code bytes and decoded floats of blockfmt.h's scalar code.
/// codes[i] = e4m3(x[i] · k) (mul) or e4m3(x[i] / k), i < n.
__attribute__((LQ_AVX2_TARGET)) void encode_e4m3_avx2(const float* x, int64_t n, bool mul, float k, uint8_t* codes);
/// out[i] = e4m3_bits_to_f32(codes[i]) · s, i < n.
__attribute__((LQ_AVX2_TARGET)) void decode_e4m3_avx2(const uint8_t* codes, int64_t n, float s, float* out);
/// encode_block_bytes of one e2m1 block (MXFP4, NVFP4, fp4 tiles) with parameters p.
__attribute__((LQ_AVX2_TARGET)) void encode_e2m1_avx2(const q::BlockDesc& f, const q::BlockParams& p, const float* x,
                                                      int n, uint8_t* codes);
/// out[i] = e2m1_bits_to_f32(code i) · s, i < n.
__attribute__((LQ_AVX2_TARGET)) void decode_e2m1_avx2(const uint8_t* codes, int n, float s, float* out);
/// encode_block_bytes of one ggml block (q8_0, q4_0, q4_1) with parameters p.
__attribute__((LQ_AVX2_TARGET)) void encode_ggml_avx2(const q::BlockDesc& f, const q::BlockParams& p, const float* x,
                                                      int n, uint8_t* codes);
/// max over i < n of the bits of |x[i]|: max|x| for finite x; ≥ 0x7f800000 when a NaN/Inf is present.
__attribute__((LQ_AVX2_TARGET)) uint32_t abs_bits_max_avx2(const float* x, int64_t n);

// Avx2, the codebook families (codebook_avx2.cpp).
/// Codes of rows X [T, D]: index of x[t, d] = the count of midpoints mid[j·mid_stride + d] ≤ x, j < 2^bits − 1
/// (mid_stride D: a table per channel, [2^bits − 1, D]; 0: one codebook), packed LSB-first (codebook.h) into
/// codes [T, ceil(D·bits/8)]; bits 1..4. Returns whether X holds a NaN/Inf (checked in the same pass; the codes
/// are then to be discarded).
__attribute__((LQ_AVX2_TARGET)) bool codebook_encode_rows_avx2(const float* X, int64_t T, int64_t D, const float* mid,
                                                               int64_t mid_stride, int bits, uint8_t* codes);
/// out[t, d] = the centroid of the code c of (t, d): cent[c·D + d] (per_channel: a codebook per channel,
/// [2^bits, D]), else cent[c] (one codebook of 2^bits entries); bits 1..4.
__attribute__((LQ_AVX2_TARGET)) void codebook_decode_rows_avx2(const uint8_t* codes, int64_t T, int64_t D, int bits,
                                                               const float* cent, bool per_channel, float* out);
/// s[k] = Σ_i x_k[i]² over the eight rows x_k = X + k·D, each a sequential float32 chain in element order
/// (tq_row_norm's and tq_nc_inverse's sums); next [8, D]: rows to prefetch meanwhile (X's next eight), or null.
__attribute__((LQ_AVX2_TARGET)) void sum_squares_rows8_avx2(const float* X, int64_t D, float* s,
                                                            const float* next = nullptr);
/// The same sums of sixteen rows X [16, D] into s [16] (two chains interleaved); next [16, D]: rows to prefetch, or
/// null.
__attribute__((LQ_AVX2_TARGET)) void sum_squares_rows16_avx2(const float* X, int64_t D, float* s, const float* next);
/// TurboQuant's codes of rows X [T, D] (turboquant.h): y = fwht_rows of x / denom[t] (block a power of two ≥ 8
/// dividing D), codes of y among the 2^bits − 1 midpoints mid, packed into codes [T, ceil(D·bits/8)]; scratch [D]
/// (blocks above 64 elements). The same operations as the scalar loops, one block's registers at a time. next [T, D]:
/// rows to prefetch into L2 meanwhile (X's next T rows; with blocks of 64 elements), or null.
__attribute__((LQ_AVX2_TARGET)) void tq_encode_rows_avx2(const float* X, int64_t T, int64_t D, int64_t block,
                                                         const float* denom, const float* mid, int bits, uint8_t* codes,
                                                         float* scratch, const float* next);
/// x = fwht_rows of (x · a) · b (two) or x · a, one row x [D] in place; scratch [D] (blocks above 64).
__attribute__((LQ_AVX2_TARGET)) void tq_rotate_back_row_avx2(float* x, int64_t D, int64_t block, float a, float b,
                                                             bool two, float* scratch);
/// Transform coding's uniform rule per component (transform_coding.h): scale, offset [D], qmax = 2^w − 1,
/// width w, coded = −1 where w ≥ 1 else 0 (TcHostTables' arrays).
struct TcRowTables {
  const float* scale;
  const float* offset;
  const float* qmax;
  const int32_t* width;
  const int32_t* coded;
};
/// code[i] = encode_asym(x[i], scale[i], offset[i], w_i), i < D; returns whether x holds a NaN/Inf.
__attribute__((LQ_AVX2_TARGET)) bool tc_uniform_codes_avx2(const float* x, int64_t D, const TcRowTables& r,
                                                           uint8_t* code);
/// out[i] = decode_asym(code[i], scale[i], offset[i]) where w_i ≥ 1, else offset[i].
__attribute__((LQ_AVX2_TARGET)) void tc_uniform_decode_avx2(const uint8_t* code, int64_t D, const TcRowTables& r,
                                                            float* out);
/// The tables of tc_unpack_avx2 and tc_pack_avx2 for the component bit offsets o [D + 1] of a record, per
/// group of eight components: the byte of its first code, a vpshufb control giving each code the 4 bytes
/// from its own byte, the shift o_i mod 8 and the mask 2^w_i − 1 (unpack); each code's bit within the group,
/// o_i − o_(8g), and the group's bits (pack).
struct TcUnpack {
  std::vector<int32_t> base;
  std::vector<int8_t> ctrl;
  std::vector<int32_t> shift, mask;
  std::vector<int64_t> rel;
  std::vector<int32_t> group_bits;
  std::vector<int32_t> by_width;  ///< the components of the full groups, i < 8·floor(D/8), stably sorted by width
  /// -lm encode (tc_lm_thresholds): component i's code is the count of its 2^w_i − 1 thresholds tau[tau_at[i] + j]
  /// ≤ x − offset_i, no division; tau_at[i] = −1: divided (widths above 4, scales not positive and finite).
  std::vector<float> tau;
  std::vector<int32_t> tau_at;
};
void tc_unpack_tables(const int32_t* bit_offset, int64_t D, TcUnpack& u);
/// u.tau and u.tau_at for the -lm tables v (midpoints set) and widths w [D]: for a component of width 1..4 and a
/// positive finite scale s, threshold j is the least float d with div_rn(d, s) ≥ m_j (m_j its width's midpoint j):
/// the division is monotone in d, so d ≥ threshold ⇔ u = d / s ≥ m_j, for every float d (±Inf, and NaN failing both).
void tc_lm_thresholds(const qmath::TcTables& v, const int32_t* width, int64_t D, TcUnpack& u);
/// code[i] = bits [o_i, o_i + w_i) of a row copied into padded [row bytes + 16] (zero past the row), i < D.
__attribute__((LQ_AVX2_TARGET)) void tc_unpack_avx2(const uint8_t* padded, const TcUnpack& u, const int32_t* bit_offset,
                                                    int64_t D, uint8_t* code);
/// tc-lm's codes of eight rows X [8, D] (row stride D) with the tables v (midpoints set), the widths w [D] and
/// u.by_width: code [8, D] (row stride D), code[k·D + i] = tc_code(v, i, w_i, x_k[i]), 0 where w_i = 0. The eight
/// rows run in the eight lanes: an 8×8 transpose per eight components into col [8·D] (col[8i + k] = x_k[i]), the
/// components then coded in order of width (a component's width, scale and offset one broadcast; its code the
/// count of its width's midpoints ≤ u, every midpoint compared, as codebook_index; with u.tau_at[i] ≥ 0 the count
/// of its thresholds ≤ x − offset, tc_lm_thresholds), and transposed back.
/// next [8, D]: the rows to prefetch into L2 meanwhile, a few lines between runs of components (the next eight), or
/// null. Returns whether the rows hold a NaN/Inf.
__attribute__((LQ_AVX2_TARGET)) bool tc_lm_codes_rows8_avx2(const float* X, int64_t D, const qmath::TcTables& v,
                                                            const int32_t* width, const TcUnpack& u, const float* next,
                                                            float* col, uint8_t* code);
/// out [8, D] (row stride D) = tc_decode_code of the codes code [8, D] (tc_unpack_avx2's, row stride D; the offset
/// where w_i = 0), through col [8·D] as above, the centroid read by vpermps and a blend tree on the bits above 3;
/// the rows assembled in rows [8, D], then copied to out in one run (stream: with non-temporal stores, the caller
/// issues the sfence).
__attribute__((LQ_AVX2_TARGET)) void tc_lm_decode_rows8_avx2(const uint8_t* code, int64_t D, const qmath::TcTables& v,
                                                             const int32_t* width, const TcUnpack& u, float* col,
                                                             float* rows, bool stream, float* out);
/// out[0, n) = src[0, n) by non-temporal stores where out is 32-byte aligned (plain copies at the ends); the caller
/// issues the sfence.
__attribute__((LQ_AVX2_TARGET)) void stream_copy_avx2(const float* src, int64_t n, float* out);
/// The codes code[i] < 2^w_i (0 where w_i = 0) packed LSB-first at their widths into out [rb] (tc_encode_byte's
/// bytes), trailing bytes zero.
__attribute__((LQ_AVX2_TARGET)) void tc_pack_avx2(const uint8_t* code, const TcUnpack& u, const int32_t* bit_offset,
                                                  int64_t D, int64_t rb, uint8_t* out);
/// The block kinds each AVX2 element path covers.
bool e4m3_elements(const q::BlockDesc& f);
bool e2m1_elements(const q::BlockDesc& f);
bool ggml_elements(const q::BlockDesc& f);
#endif

}  // namespace latentq::cpu
