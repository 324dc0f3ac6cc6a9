// latentq/codebook.h — the element math shared by the scalar-codebook formats, TurboQuant (turboquant.h)
// and the fitted Lloyd-Max codebooks (`lm<b>-…`, quantize.h): the nearest-centroid index through the
// sorted midpoints, and the LSB-first packing of b-bit indices. `__host__ __device__`: the CPU quantizer and
// the CUDA kernels call the same functions.
//
// Packing: element i's index occupies bits [i·b, i·b + b) of its row, LSB-first across bytes (byte k holds
// bits 8k .. 8k + 7, the lowest-numbered bit in the least significant place): at 4 bits element 2k is the low
// nibble of byte k (as INT4 in qmath.h), at 2 bits element 4k + j is bits 2j..2j+1 of byte k (as INT2), at
// 3 bits every 8 indices form one 24-bit little-endian word. Trailing bits are zero.
#pragma once

#include <cstdint>

#include "latentq/qmath.h"

namespace latentq::qmath {

/// The index of value y in a codebook of `levels` ascending centroids with midpoints mid[levels − 1]: the
/// number of midpoints m_j ≤ y (a value on a midpoint goes to the upper centroid).
LQ_HD uint32_t codebook_index(const float* mid, int levels, float y) {
  uint32_t k = 0;
  for (int j = 0; j + 1 < levels; ++j) k += (y >= mid[j]) ? 1u : 0u;
  return k;
}

/// Bits [bit, bit + bits) (bits ≤ 8) of an LSB-first packed row: a code of any width at any bit offset
/// (transform_coding.h's rows of per-component widths).
LQ_HD uint32_t lsb_get_bits(const uint8_t* row, int bit, int bits) {
  const int byte = bit >> 3, shift = bit & 7;
  uint32_t w = row[byte];
  if (shift + bits > 8) w |= static_cast<uint32_t>(row[byte + 1]) << 8;  // a code across two bytes
  return (w >> shift) & ((1u << bits) - 1u);
}

/// Index i (b ≤ 8 bits) of an LSB-first packed row.
LQ_HD uint32_t lsb_get_code(const uint8_t* row, int i, int bits) { return lsb_get_bits(row, i * bits, bits); }

/// Byte k of the LSB-first packed row of D indices code_of(i), b bits each (trailing bits zero). Bytes are
/// independent: any split of a row's bytes among callers gives the same codes.
template <class CodeOf>
LQ_HD uint8_t lsb_encode_byte(int D, int bits, int k, const CodeOf& code_of) {
  const int lo = 8 * k;
  uint32_t out = 0;
  for (int i = lo / bits; i < D && i * bits < lo + 8; ++i) {
    const int shift = i * bits - lo;  // negative: the code started in the byte before
    const uint32_t c = code_of(i);
    out |= shift >= 0 ? (c << shift) : (c >> -shift);
  }
  return static_cast<uint8_t>(out & 0xffu);
}

}  // namespace latentq::qmath
