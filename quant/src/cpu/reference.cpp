// quant/src/cpu/reference.cpp — CpuKernel::Reference, the base case: plain loops over the element math of
// latentq/qmath.h, written so the compiler vectorizes the inner loops (no FMA contraction, see
// CMakeLists.txt). The integer formats run here under Reference; bf16 runs here on every kernel. Also
// the storage helpers every kernel shares (assign_zeroed, group_params, store_tensor_params).
#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "dispatch.h"

namespace latentq::cpu {

// v = n zero bytes. A buffer of at least 32 MiB that has to grow is allocated anew and advised for transparent
// huge pages (madvise MADV_HUGEPAGE on its page-aligned interior, as numpy does for its arrays) before the
// zero fill first touches it: glibc maps every block above its largest mmap threshold (32 MiB) fresh, and each
// 4 KiB page fault is costly on a VM (faulting in and filling 134 MB took 66 ms with 4 KiB pages, 14 ms
// advised, on the 2-vCPU Zen 4 KVM machine); smaller blocks come back from the heap already faulted in. Where
// transparent huge pages are off ("never") or elsewhere than Linux it is a plain assign. The bytes are the same.
void assign_zeroed(std::vector<uint8_t>& v, size_t n) {
#if defined(__linux__)
  if (n >= (size_t{32} << 20) && v.capacity() < n) {
    std::vector<uint8_t> w;
    w.reserve(n);
    const uintptr_t a = (reinterpret_cast<uintptr_t>(w.data()) + 4095) & ~uintptr_t{4095};
    const uintptr_t e = (reinterpret_cast<uintptr_t>(w.data()) + n) & ~uintptr_t{4095};
    if (e > a) (void)madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
    v.swap(w);
  }
#endif
  v.assign(n, 0);
}

// Stored (scale, offset) of a group from its statistics; checks the storage dtype did not overflow.
q::ScaleOffset group_params(const QuantizedTensor& qt, float mn, float mx, int64_t gi) {
  const QuantSpec& spec = qt.spec;
  auto params = [&](ScaleDtype d) {
    return spec.scheme == Scheme::Sym ? q::sym_params(q::max_num(q::abs_f(mn), q::abs_f(mx)), spec.bits, d)
                                      : q::asym_params(mn, mx, spec.bits, d);
  };
  const q::ScaleOffset p = params(spec.scale_dtype);
  if (!q::is_finite(p.scale) || !q::is_finite(p.offset)) {
    const q::ScaleOffset raw = params(ScaleDtype::F32);  // unrounded, for the message
    if (!q::is_finite(p.scale))
      throw std::invalid_argument(overflow_message(spec, "scale", raw.scale, group_name(qt, gi)));
    throw std::invalid_argument(overflow_message(spec, "offset", raw.offset, group_name(qt, gi)));
  }
  return p;
}

// The per-tensor group of an integer spec: its (scale, offset) from the matrix's min/max, stored as
// the only entry of qt.scales (and of qt.offsets when asymmetric). Throws as group_params().
q::ScaleOffset store_tensor_params(QuantizedTensor& qt, float mn, float mx) {
  const QuantSpec& spec = qt.spec;
  const q::ScaleOffset p = group_params(qt, mn, mx, 0);
  const size_t sb = static_cast<size_t>(q::scale_dtype_bytes(spec.scale_dtype));
  qt.scales.assign(sb, 0);
  put_scale(qt.scales, 0, p.scale, spec.scale_dtype);
  if (spec.scheme == Scheme::Asym) {
    qt.offsets.assign(sb, 0);
    put_scale(qt.offsets, 0, p.offset, spec.scale_dtype);
  }
  return p;
}

namespace {

// Encode n elements of x with per-element (scale, offset) pointers advanced by `Step` (0: one
// group for the whole span, 1: one per element) into byte codes u[n]. Step is a template argument
// so both loops vectorize (Step 0: the compiler hoists the scale > 0 test out of the loop).
template <bool Sym, int Step>
void encode_span(const float* x, int64_t n, const float* scale, const float* offset, int bits, uint8_t* u) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = scale[i * Step];
    if constexpr (Sym)
      u[i] = static_cast<uint8_t>(q::encode_sym(x[i], s, bits));
    else
      u[i] = static_cast<uint8_t>(q::encode_asym(x[i], s, offset[i * Step], bits));
  }
}

}  // namespace

void quantize_int_reference(QuantizedTensor& qt, const Layout&, const QuantizeInput& in) {
  const QuantSpec& spec = qt.spec;
  const float* X = in.X;
  const int64_t T = in.T, D = in.D, rb = qt.row_bytes();
  const std::span<const int64_t> seq_offsets = in.seq_offsets;
  const bool sym = spec.scheme == Scheme::Sym;
  const bool asym = !sym;
  const int bits = spec.bits;
  const int64_t sb = q::scale_dtype_bytes(spec.scale_dtype);
  std::vector<uint8_t> u(static_cast<size_t>(D));
  // codes of x[0, n) into u[0, n): one (scale, offset) for the span (step 0) or one per element (step 1)
  auto encode = [&](const float* x, int64_t n, const float* sc, const float* of, int step, uint8_t* uo) {
    if (step == 0) {
      if (sym)
        encode_span<true, 0>(x, n, sc, of, bits, uo);
      else
        encode_span<false, 0>(x, n, sc, of, bits, uo);
    } else {
      if (sym)
        encode_span<true, 1>(x, n, sc, of, bits, uo);
      else
        encode_span<false, 1>(x, n, sc, of, bits, uo);
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
      const q::ScaleOffset p = store_tensor_params(qt, mn, mx);
      for (int64_t t = 0; t < T; ++t) encode_row(X + t * D, &p.scale, &p.offset, 0, qt.codes.data() + t * rb);
      return;
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
          const q::ScaleOffset p = group_params(qt, mn[d], mx[d], g * D + d);
          sc[d] = p.scale;
          of[d] = p.offset;
          put_scale(qt.scales, g * D + d, p.scale, spec.scale_dtype);
          if (asym) put_scale(qt.offsets, g * D + d, p.offset, spec.scale_dtype);
        }
        for (int64_t t = t0; t < t1; ++t) encode_row(X + t * D, sc.data(), of.data(), 1, qt.codes.data() + t * rb);
      }
      return;
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
          const q::ScaleOffset p = group_params(qt, mn, mx, t * nt + j);
          put_scale(qt.scales, t * nt + j, p.scale, spec.scale_dtype);
          if (asym) put_scale(qt.offsets, t * nt + j, p.offset, spec.scale_dtype);
          encode(x + d0, d1 - d0, &p.scale, &p.offset, 0, u.data() + d0);  // the group's codes
        }
        pack_row(u.data(), D, bits, qt.codes.data() + t * rb);
      }
      return;
    }
  }
  assert(false && "unreachable granularity");
}

void dequantize_int_reference(const QuantizedTensor& qt, float* out) {
  const QuantSpec& spec = qt.spec;
  const int64_t T = qt.rows, D = qt.cols, rb = qt.row_bytes();
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

void quantize_bf16(QuantizedTensor& qt, const Layout&, const QuantizeInput& in) {
  const QuantSpec& spec = qt.spec;
  const float* X = in.X;
  const int64_t T = in.T, D = in.D;
  for (int64_t i = 0; i < T * D; ++i) {
    const uint16_t b = q::f32_to_bf16_bits(X[i]);
    if ((b & 0x7fffu) == 0x7f80u)  // a finite float32 beyond bf16's range rounds to ±inf
      throw std::invalid_argument(overflow_message(
          spec, "value", X[i], "token " + std::to_string(i / D) + ", dimension " + std::to_string(i % D)));
    std::memcpy(qt.codes.data() + 2 * i, &b, 2);
  }
}

void dequantize_bf16(const QuantizedTensor& qt, float* out, CpuKernel) {
  const int64_t T = qt.rows, D = qt.cols;
  for (int64_t i = 0; i < T * D; ++i) {
    uint16_t b;
    std::memcpy(&b, qt.codes.data() + 2 * i, 2);
    out[i] = q::bf16_bits_to_f32(b);
  }
}

}  // namespace latentq::cpu
