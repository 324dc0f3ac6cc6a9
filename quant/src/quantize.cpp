// The CPU reference quantizer. Plain loops over the element math of latentq/qmath.h; written so
// the compiler vectorizes the inner loops (no FMA contraction, see CMakeLists.txt).
#include "latentq/quantize.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>

namespace latentq {
namespace q = qmath;
namespace {

int64_t scale_bytes(ScaleDtype d) { return d == ScaleDtype::F16 ? 2 : 4; }

void put_scale(std::vector<uint8_t>& buf, int64_t i, float v, ScaleDtype d) {
  if (d == ScaleDtype::F16) {
    const uint16_t h = q::f32_to_f16_bits(v);
    std::memcpy(buf.data() + 2 * i, &h, 2);
  } else {
    std::memcpy(buf.data() + 4 * i, &v, 4);
  }
}

float get_scale(const std::vector<uint8_t>& buf, int64_t i, ScaleDtype d) {
  if (d == ScaleDtype::F16) {
    uint16_t h;
    std::memcpy(&h, buf.data() + 2 * i, 2);
    return q::f16_bits_to_f32(h);
  }
  float v;
  std::memcpy(&v, buf.data() + 4 * i, 4);
  return v;
}

// Stored (scale, offset) of a group from its statistics; checks the storage dtype did not overflow.
q::ScaleOffset group_params(const QuantSpec& spec, float mn, float mx, int64_t gi) {
  auto params = [&](ScaleDtype d) {
    return spec.scheme == Scheme::Sym ? q::sym_params(q::max_num(q::abs_f(mn), q::abs_f(mx)), spec.bits, d)
                                      : q::asym_params(mn, mx, spec.bits, d);
  };
  const q::ScaleOffset p = params(spec.scale_dtype);
  if (!q::is_finite(p.scale) || !q::is_finite(p.offset)) {
    const q::ScaleOffset raw = params(ScaleDtype::F32);  // unrounded, for the message
    if (!q::is_finite(p.scale)) throw std::invalid_argument(overflow_message(spec, false, raw.scale, gi));
    throw std::invalid_argument(overflow_message(spec, true, raw.offset, gi));
  }
  return p;
}

// Encode n elements of x with per-element (scale, offset) pointers advanced by `Step` (0: one
// group for the whole span, 1: one per element) into byte codes u[n]. Step is a template argument
// so both loops vectorize (Step 0: the compiler hoists the scale > 0 test out of the loop).
template <bool Sym, int Step>
void encode_span(const float* x, int64_t n, const float* scale, const float* offset, int bits, uint8_t* u) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = scale[i * Step];
    if constexpr (Sym) u[i] = static_cast<uint8_t>(q::encode_sym(x[i], s, bits));
    else u[i] = static_cast<uint8_t>(q::encode_asym(x[i], s, offset[i * Step], bits));
  }
}

// Pack D byte codes u[D] at `bits` per code into out[packed_row_bytes(D, bits)], order per qmath.h.
void pack_row(const uint8_t* u, int64_t D, int bits, uint8_t* out) {
  const int64_t nb = q::packed_row_bytes(D, bits);
  if (bits == 8) {
    std::memcpy(out, u, static_cast<size_t>(D));
    return;
  }
  const int per = 8 / bits;
  const int64_t full = D / per;
  if (bits == 4) {
    for (int64_t k = 0; k < full; ++k) out[k] = static_cast<uint8_t>(u[2 * k] | (u[2 * k + 1] << 4));
  } else {
    for (int64_t k = 0; k < full; ++k)
      out[k] = static_cast<uint8_t>(u[4 * k] | (u[4 * k + 1] << 2) | (u[4 * k + 2] << 4) | (u[4 * k + 3] << 6));
  }
  if (full < nb) {  // partial last byte: remaining codes, zero padding bits
    uint8_t b = 0;
    for (int64_t j = 0; full * per + j < D; ++j) b = static_cast<uint8_t>(b | (u[full * per + j] << (bits * j)));
    out[full] = b;
  }
}

void unpack_row(const uint8_t* in, int64_t D, int bits, uint8_t* u) {
  if (bits == 8) {
    std::memcpy(u, in, static_cast<size_t>(D));
    return;
  }
  const int per = 8 / bits;
  const int64_t full = D / per;
  if (bits == 4) {  // whole bytes first (vectorizes), then the partial last byte
    for (int64_t k = 0; k < full; ++k) {
      u[2 * k] = static_cast<uint8_t>(in[k] & 0xf);
      u[2 * k + 1] = static_cast<uint8_t>(in[k] >> 4);
    }
  } else {
    for (int64_t k = 0; k < full; ++k) {
      u[4 * k] = static_cast<uint8_t>(in[k] & 3);
      u[4 * k + 1] = static_cast<uint8_t>((in[k] >> 2) & 3);
      u[4 * k + 2] = static_cast<uint8_t>((in[k] >> 4) & 3);
      u[4 * k + 3] = static_cast<uint8_t>(in[k] >> 6);
    }
  }
  const uint8_t mask = static_cast<uint8_t>((1 << bits) - 1);
  for (int64_t i = full * per; i < D; ++i) u[i] = static_cast<uint8_t>((in[i / per] >> (bits * (i % per))) & mask);
}

}  // namespace

int64_t QuantizedTensor::row_bytes() const {
  switch (spec.format) {
    case Format::BF16: return 2 * cols;
    case Format::Fp8Tile: return cols;
    case Format::Int: break;
  }
  return q::packed_row_bytes(cols, spec.bits);
}

int64_t QuantizedTensor::row_group() const {
  if (spec.format == Format::Fp8Tile || (spec.format == Format::Int && spec.granularity == Granularity::Token))
    return spec.group_size > 0 ? std::min(spec.group_size, cols) : cols;
  return 0;
}

int64_t QuantizedTensor::scales_per_row() const {
  const int64_t g = row_group();
  return g > 0 ? (cols + g - 1) / g : 0;
}

float QuantizedTensor::scale_at(int64_t i) const { return get_scale(scales, i, spec.scale_dtype); }
float QuantizedTensor::offset_at(int64_t i) const { return get_scale(offsets, i, spec.scale_dtype); }

std::vector<int64_t> channel_groups(std::span<const int64_t> seq_offsets, int64_t T, int64_t group_size) {
  if (seq_offsets.size() < 2 || seq_offsets.front() != 0 || seq_offsets.back() != T)
    throw std::invalid_argument("seq_offsets must run from 0 to T = " + std::to_string(T) + " with at least one sequence");
  std::vector<int64_t> b{0};
  for (size_t s = 0; s + 1 < seq_offsets.size(); ++s) {
    const int64_t s0 = seq_offsets[s], s1 = seq_offsets[s + 1];
    if (s1 < s0) throw std::invalid_argument("seq_offsets must be non-decreasing (sequence " + std::to_string(s) + ")");
    if (s1 == s0) continue;  // empty sequence: no group
    const int64_t g = group_size > 0 ? group_size : (s1 - s0);
    for (int64_t t = s0 + g; t < s1; t += g) b.push_back(t);
    b.push_back(s1);
  }
  return b;
}

int64_t count_nonfinite(const float* x, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += !q::is_finite(x[i]);
  return c;
}

void validate_spec_fields(const QuantSpec& spec) {
  const std::string what = "invalid quantizer spec fields (format " + std::to_string(static_cast<int>(spec.format)) +
                           ", bits " + std::to_string(spec.bits) + ", group_size " + std::to_string(spec.group_size) +
                           "): ";
  switch (spec.format) {
    case Format::Int:
      if (spec.bits != 2 && spec.bits != 4 && spec.bits != 8)
        throw std::invalid_argument(what + "integer specs need bits 2, 4 or 8; build specs with QuantSpec::parse");
      if (spec.group_size < 0) throw std::invalid_argument(what + "the group size must be >= 0");
      return;
    case Format::Fp8Tile:
      if (spec.group_size <= 0) throw std::invalid_argument(what + "the fp8 tile width must be > 0");
      return;
    case Format::BF16: return;
  }
  throw std::invalid_argument(what + "unknown format");
}

std::string nonfinite_message(int64_t count, int64_t T, int64_t D) {
  return std::to_string(count) + " NaN/Inf values in the [" + std::to_string(T) + ", " + std::to_string(D) + "] input";
}

std::string overflow_message(const QuantSpec& spec, bool offset, float raw, int64_t group) {
  return std::string(offset ? "offset" : "scale") + " " + std::to_string(raw) + " of group " + std::to_string(group) +
         " overflows the " + to_string(spec.scale_dtype) + " storage of '" + spec.to_string() + "'" +
         (spec.scale_dtype == ScaleDtype::F16 ? "; use the -fp32 variant" : " (the input range exceeds float32)");
}

QuantizedTensor quantize(const QuantSpec& spec_in, Target target, const float* X, int64_t T, int64_t D,
                         std::span<const int64_t> seq_offsets) {
  if (T <= 0 || D <= 0)
    throw std::invalid_argument("cannot quantize an empty matrix [" + std::to_string(T) + ", " + std::to_string(D) + "]");
  if (const int64_t bad = count_nonfinite(X, T * D)) throw std::invalid_argument(nonfinite_message(bad, T, D));
  validate_spec_fields(spec_in);
  QuantizedTensor qt;
  qt.spec = spec_in.stored_for(target);
  // fp8 tile scales are always stored as float32 (see below); record that so scale_at() reads them right.
  if (qt.spec.format == Format::Fp8Tile) qt.spec.scale_dtype = ScaleDtype::F32;
  const QuantSpec& spec = qt.spec;
  qt.rows = T;
  qt.cols = D;
  const int64_t rb = qt.row_bytes();
  qt.codes.assign(static_cast<size_t>(T * rb), 0);

  if (spec.format == Format::BF16) {
    for (int64_t i = 0; i < T * D; ++i) {
      const uint16_t b = q::f32_to_bf16_bits(X[i]);
      std::memcpy(qt.codes.data() + 2 * i, &b, 2);
    }
    return qt;
  }
  if (spec.format == Format::Fp8Tile) {
    const int64_t tile = qt.row_group(), nt = qt.scales_per_row();
    qt.scales.assign(static_cast<size_t>(T * nt * 4), 0);
    for (int64_t t = 0; t < T; ++t) {
      const float* x = X + t * D;
      for (int64_t j = 0; j < nt; ++j) {
        const int64_t d0 = j * tile, d1 = std::min(D, d0 + tile);
        float amax = 0.0f;
        for (int64_t d = d0; d < d1; ++d) amax = q::max_num(amax, q::abs_f(x[d]));
        const float s = q::fp8_tile_scale(amax);
        put_scale(qt.scales, t * nt + j, s, ScaleDtype::F32);
        for (int64_t d = d0; d < d1; ++d) qt.codes[t * rb + d] = q::encode_fp8(x[d], s);
      }
    }
    return qt;
  }

  // ---- integer formats ----
  const bool sym = spec.scheme == Scheme::Sym;
  const bool asym = !sym;
  const int bits = spec.bits;
  const int64_t sb = scale_bytes(spec.scale_dtype);
  std::vector<uint8_t> u(static_cast<size_t>(D));
  // codes of x[0, n) into u[0, n): one (scale, offset) for the span (step 0) or one per element (step 1)
  auto encode = [&](const float* x, int64_t n, const float* sc, const float* of, int step, uint8_t* uo) {
    if (step == 0) {
      if (sym) encode_span<true, 0>(x, n, sc, of, bits, uo);
      else encode_span<false, 0>(x, n, sc, of, bits, uo);
    } else {
      if (sym) encode_span<true, 1>(x, n, sc, of, bits, uo);
      else encode_span<false, 1>(x, n, sc, of, bits, uo);
    }
  };
  auto encode_row = [&](const float* x, const float* sc, const float* of, int step, uint8_t* out) {
    encode(x, D, sc, of, step, u.data());
    pack_row(u.data(), D, bits, out);
  };

  switch (spec.granularity) {
    case Granularity::Tensor: {
      float mn = X[0], mx = X[0];
      for (int64_t i = 0; i < T * D; ++i) {
        mn = q::min_num(mn, X[i]);
        mx = q::max_num(mx, X[i]);
      }
      const q::ScaleOffset p = group_params(spec, mn, mx, 0);
      qt.scales.assign(static_cast<size_t>(sb), 0);
      put_scale(qt.scales, 0, p.scale, spec.scale_dtype);
      if (asym) {
        qt.offsets.assign(static_cast<size_t>(sb), 0);
        put_scale(qt.offsets, 0, p.offset, spec.scale_dtype);
      }
      for (int64_t t = 0; t < T; ++t) encode_row(X + t * D, &p.scale, &p.offset, 0, qt.codes.data() + t * rb);
      return qt;
    }
    case Granularity::Channel: {
      qt.group_bounds = channel_groups(seq_offsets, T, spec.group_size);
      const int64_t G = static_cast<int64_t>(qt.group_bounds.size()) - 1;
      qt.scales.assign(static_cast<size_t>(G * D * sb), 0);
      if (asym) qt.offsets.assign(static_cast<size_t>(G * D * sb), 0);
      std::vector<float> mn(static_cast<size_t>(D)), mx(static_cast<size_t>(D)), sc(static_cast<size_t>(D)),
          of(static_cast<size_t>(D));
      for (int64_t g = 0; g < G; ++g) {
        const int64_t t0 = qt.group_bounds[g], t1 = qt.group_bounds[g + 1];
        std::copy(X + t0 * D, X + t0 * D + D, mn.begin());
        std::copy(X + t0 * D, X + t0 * D + D, mx.begin());
        for (int64_t t = t0 + 1; t < t1; ++t) {
          const float* x = X + t * D;
          for (int64_t d = 0; d < D; ++d) {
            mn[d] = q::min_num(mn[d], x[d]);
            mx[d] = q::max_num(mx[d], x[d]);
          }
        }
        for (int64_t d = 0; d < D; ++d) {
          const q::ScaleOffset p = group_params(spec, mn[d], mx[d], g * D + d);
          sc[d] = p.scale;
          of[d] = p.offset;
          put_scale(qt.scales, g * D + d, p.scale, spec.scale_dtype);
          if (asym) put_scale(qt.offsets, g * D + d, p.offset, spec.scale_dtype);
        }
        for (int64_t t = t0; t < t1; ++t) encode_row(X + t * D, sc.data(), of.data(), 1, qt.codes.data() + t * rb);
      }
      return qt;
    }
    case Granularity::Token: {
      const int64_t nt = qt.scales_per_row(), g = qt.row_group();
      qt.scales.assign(static_cast<size_t>(T * nt * sb), 0);
      if (asym) qt.offsets.assign(static_cast<size_t>(T * nt * sb), 0);
      for (int64_t t = 0; t < T; ++t) {
        const float* x = X + t * D;
        for (int64_t j = 0; j < nt; ++j) {
          const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
          float mn = x[d0], mx = x[d0];
          for (int64_t d = d0; d < d1; ++d) {
            mn = q::min_num(mn, x[d]);
            mx = q::max_num(mx, x[d]);
          }
          const q::ScaleOffset p = group_params(spec, mn, mx, t * nt + j);
          put_scale(qt.scales, t * nt + j, p.scale, spec.scale_dtype);
          if (asym) put_scale(qt.offsets, t * nt + j, p.offset, spec.scale_dtype);
          encode(x + d0, d1 - d0, &p.scale, &p.offset, 0, u.data() + d0);  // the group's codes
        }
        pack_row(u.data(), D, bits, qt.codes.data() + t * rb);
      }
      return qt;
    }
  }
  assert(false && "unreachable granularity");
  return qt;
}

void dequantize(const QuantizedTensor& qt, float* out) {
  const QuantSpec& spec = qt.spec;
  const int64_t T = qt.rows, D = qt.cols, rb = qt.row_bytes();
  assert(static_cast<int64_t>(qt.codes.size()) == T * rb);
  if (spec.format == Format::BF16) {
    for (int64_t i = 0; i < T * D; ++i) {
      uint16_t b;
      std::memcpy(&b, qt.codes.data() + 2 * i, 2);
      out[i] = q::bf16_bits_to_f32(b);
    }
    return;
  }
  if (spec.format == Format::Fp8Tile) {
    const int64_t tile = qt.row_group(), nt = qt.scales_per_row();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) out[t * D + d] = q::decode_fp8(qt.codes[t * rb + d], qt.scale_at(t * nt + d / tile));
    return;
  }
  const bool sym = spec.scheme == Scheme::Sym;
  const int bits = spec.bits;
  std::vector<uint8_t> u(static_cast<size_t>(D));
  std::vector<float> sc(static_cast<size_t>(D)), of(static_cast<size_t>(D), 0.0f);
  auto decode_row = [&](int64_t t) {
    unpack_row(qt.codes.data() + t * rb, D, bits, u.data());
    float* o = out + t * D;
    if (sym)
      for (int64_t d = 0; d < D; ++d) o[d] = q::decode_sym(u[d], sc[d], bits);
    else
      for (int64_t d = 0; d < D; ++d) o[d] = q::decode_asym(u[d], sc[d], of[d]);
  };
  switch (spec.granularity) {
    case Granularity::Tensor:
      std::fill(sc.begin(), sc.end(), qt.scale_at(0));
      if (!sym) std::fill(of.begin(), of.end(), qt.offset_at(0));
      for (int64_t t = 0; t < T; ++t) decode_row(t);
      return;
    case Granularity::Channel: {
      const int64_t G = static_cast<int64_t>(qt.group_bounds.size()) - 1;
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t d = 0; d < D; ++d) {
          sc[d] = qt.scale_at(g * D + d);
          if (!sym) of[d] = qt.offset_at(g * D + d);
        }
        for (int64_t t = qt.group_bounds[g]; t < qt.group_bounds[g + 1]; ++t) decode_row(t);
      }
      return;
    }
    case Granularity::Token: {
      const int64_t nt = qt.scales_per_row(), g = qt.row_group();
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < nt; ++j) {  // each group's stored (scale, offset) over its columns
          const int64_t d0 = j * g, d1 = std::min(D, d0 + g);
          std::fill(sc.begin() + d0, sc.begin() + d1, qt.scale_at(t * nt + j));
          if (!sym) std::fill(of.begin() + d0, of.begin() + d1, qt.offset_at(t * nt + j));
        }
        decode_row(t);
      }
      return;
    }
  }
}

QuantizedTensor quantize_dequantize(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                                    std::span<const int64_t> seq_offsets, float* out) {
  QuantizedTensor qt = quantize(spec, target, X, T, D, seq_offsets);
  dequantize(qt, out);
  return qt;
}

Accounting account(const QuantizedTensor& qt) {
  const double bytes = static_cast<double>(qt.storage_bytes());
  return {8.0 * bytes / (static_cast<double>(qt.rows) * static_cast<double>(qt.cols)),
          bytes / static_cast<double>(qt.rows)};
}

}  // namespace latentq
