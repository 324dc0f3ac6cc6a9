// The public entry points of the CPU quantizer (latentq/quantize.h): quantize(), quantize_into(),
// dequantize() and the tensor's helpers, errors, diagnostics, engine records and accounting. The loops
// live under cpu/: the scalar reference (cpu/reference.cpp), the fused integer kernels
// (cpu/int_fused.h, cpu/int_baseline.cpp, cpu/int_avx2.cpp), the AVX2 block elements
// (cpu/block_avx2.cpp), and the kernel selection and thread splitting (cpu/dispatch.h, cpu/dispatch.cpp).
#include "latentq/quantize.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "cpu/dispatch.h"

namespace latentq {
namespace q = qmath;
namespace {

// How quantize() and dequantize() run each storage kind of the format descriptor (the table's `storage` field,
// latentq/spec.h): integer groups, bf16 elements, TurboQuant's rotated codebook rows (turboquant.h), fitted
// Lloyd-Max codebooks (lloyd_max.h), transform coding's per-component widths (transform_coding.h), or the block
// formats of blockfmt.h. The CPU kernel (set_cpu_kernel) picks the code inside each entry (cpu/dispatch.h).
Storage storage_of(Format f) { return traits(f).storage; }

struct StorageOps {
  // Fills qt (stored spec, rows, cols and zeroed codes set) from in.X, already checked for NaN/Inf.
  void (*quantize)(QuantizedTensor& qt, const Layout& L, const cpu::QuantizeInput& in);
  // Decodes qt into out [rows, cols] on `kernel`.
  void (*dequantize)(const QuantizedTensor& qt, float* out, CpuKernel kernel);
};
// Indexed by Storage. Int quantizes here with the reference loops only: the fused kernels (Baseline, Avx2)
// take the whole quantize() call before this table, since they check NaN/Inf while they encode and
// quantize_into() reuses a tensor's buffers through them.
constexpr StorageOps kStorageOps[] = {
    {cpu::quantize_int_reference, cpu::dequantize_int},
    {cpu::quantize_bf16, cpu::dequantize_bf16},
    {cpu::quantize_blocks, cpu::dequantize_blocks},
    {cpu::quantize_tq, cpu::dequantize_tq},
    {cpu::quantize_lm, cpu::dequantize_lm},
    {cpu::quantize_tc, cpu::dequantize_tc},
};
static_assert(std::size(kStorageOps) == static_cast<size_t>(Storage::Record), "one entry per stored Storage");
const StorageOps& ops_of(Format f) {
  assert(storage_of(f) != Storage::Record);  // a preset is quantized through its stored formats (stored_for)
  return kStorageOps[static_cast<int>(storage_of(f))];
}

}  // namespace

int64_t QuantizedTensor::row_bytes() const { return spec.format == Format::BF16 ? 2 * cols : layout().row_code_bytes; }
int64_t QuantizedTensor::row_group() const { return layout().block; }
int64_t QuantizedTensor::scales_per_row() const { return layout().blocks_per_row; }

float QuantizedTensor::scale_at(int64_t i) const { return cpu::get_scale(scales, i, spec.scale_dtype); }
float QuantizedTensor::offset_at(int64_t i) const { return cpu::get_scale(offsets, i, spec.scale_dtype); }
float QuantizedTensor::global_scale() const {
  return global.size() == 4 ? q::load_dtype(global.data(), ScaleDtype::F32) : 0.0f;
}

void validate_seq_offsets(std::span<const int64_t> seq_offsets, int64_t T) {
  if (seq_offsets.size() < 2 || seq_offsets.front() != 0 || seq_offsets.back() != T)
    throw std::invalid_argument("seq_offsets must run from 0 to T = " + std::to_string(T) +
                                " with at least one sequence, got " + std::to_string(seq_offsets.size()) + " entries" +
                                (seq_offsets.empty() ? std::string()
                                                     : " from " + std::to_string(seq_offsets.front()) + " to " +
                                                           std::to_string(seq_offsets.back())));
  for (size_t s = 0; s + 1 < seq_offsets.size(); ++s)
    if (seq_offsets[s + 1] < seq_offsets[s])
      throw std::invalid_argument("seq_offsets must be non-decreasing (sequence " + std::to_string(s) + ": " +
                                  std::to_string(seq_offsets[s]) + " > " + std::to_string(seq_offsets[s + 1]) + ")");
}

std::vector<int64_t> channel_groups(std::span<const int64_t> seq_offsets, int64_t T, int64_t group_size) {
  validate_seq_offsets(seq_offsets, T);
  if (group_size < 0) throw std::invalid_argument("the group size must be >= 0, got " + std::to_string(group_size));
  std::vector<int64_t> b{0};
  for (size_t s = 0; s + 1 < seq_offsets.size(); ++s) {
    const int64_t s0 = seq_offsets[s], s1 = seq_offsets[s + 1];
    if (s1 == s0) continue;  // empty sequence: no group
    const int64_t g = group_size > 0 ? group_size : (s1 - s0);
    // t + g is formed only while s1 − t > g, so it stays below s1: no overflow for any g.
    for (int64_t t = s0; s1 - t > g;) {
      t += g;
      b.push_back(t);
    }
    b.push_back(s1);
  }
  return b;
}

std::string group_name(const QuantizedTensor& qt, int64_t gi) {
  const Layout L = qt.layout();
  if (L.channel && !qt.group_bounds.empty()) {
    const int64_t g = gi / qt.cols, d = gi % qt.cols;
    return "tokens [" + std::to_string(qt.group_bounds[static_cast<size_t>(g)]) + ", " +
           std::to_string(qt.group_bounds[static_cast<size_t>(g) + 1]) + "), dimension " + std::to_string(d);
  }
  if (L.blocks_per_row > 0) {
    const int64_t t = gi / L.blocks_per_row, d0 = (gi % L.blocks_per_row) * L.block;
    return "token " + std::to_string(t) + ", dimensions [" + std::to_string(d0) + ", " +
           std::to_string(std::min(qt.cols, d0 + L.block)) + ")";
  }
  return "the whole tensor";
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
      if (spec.scale_dtype != ScaleDtype::F16 && spec.scale_dtype != ScaleDtype::F32)
        throw std::invalid_argument(what + "integer scales are fp16 or fp32");
      return;
    case Format::Fp8Tile:
      if (spec.group_size <= 0) throw std::invalid_argument(what + "the fp8 tile width must be > 0");
      break;
    case Format::Preset:
      if (spec.preset >= std::size(kPresets)) throw std::invalid_argument(what + "unknown preset");
      break;
    default:
      if (static_cast<int>(spec.format) >= static_cast<int>(std::size(kFormats)))
        throw std::invalid_argument(what + "unknown format");
      break;
  }
  // every other family has no free fields: the spec must be exactly what parse() gives for its name
  if (QuantSpec::parse(spec.to_string()) != spec)
    throw std::invalid_argument(what + "fields that QuantSpec::parse never produces for '" + spec.to_string() + "'");
}

std::string nonfinite_message(int64_t count, int64_t T, int64_t D) {
  return std::to_string(count) + " NaN/Inf values in the [" + std::to_string(T) + ", " + std::to_string(D) + "] input";
}

std::string overflow_message(const QuantSpec& spec, const char* what, float raw, const std::string& where) {
  const bool value = std::string_view(what) == "value";
  const char* dtype = value                        ? (spec.format == Format::BF16 ? "bf16" : "decoded float32")
                      : spec.format == Format::Int ? to_string(spec.scale_dtype)
                                                   : "fp16";
  const bool fixable = spec.format == Format::Int && spec.scale_dtype == ScaleDtype::F16;
  return std::string(what) + " " + std::to_string(raw) + " of " + where + " overflows the " + dtype + " storage of '" +
         spec.to_string() + "'" +
         (fixable                                ? "; use the -fp32 variant"
          : value && spec.format == Format::BF16 ? " (bf16 holds at most 3.3895e38)"
          : value                                ? ""
                                                 : " (the input range exceeds what the format can store)");
}

QuantizedTensor quantize(const QuantSpec& spec_in, Target target, const float* X, int64_t T, int64_t D,
                         std::span<const int64_t> seq_offsets) {
  if (T <= 0 || D <= 0)
    throw std::invalid_argument("cannot quantize an empty matrix [" + std::to_string(T) + ", " + std::to_string(D) +
                                "]");
  const CpuKernel kernel = active_cpu_kernel();
  QuantizedTensor qt;
  if (spec_in.format == Format::Int && kernel != CpuKernel::Reference) {
    cpu::quantize_int_fast(qt, spec_in, target, X, T, D, seq_offsets, kernel);
    return qt;
  }
  // NaN/Inf first: the error every path gives. TurboQuant on Avx2 finds them in its norm pass (a NaN/Inf makes a
  // row norm non-finite, and that error checks X first), so its errors before that pass check X here.
  const bool tq_checks = spec_in.format == Format::TurboQuant && kernel == CpuKernel::Avx2;
  const float amax_x = tq_checks ? -1.0f : cpu::check_finite(X, T, D, kernel);
  Layout L;
  try {
    validate_spec_fields(spec_in);
    validate_seq_offsets(seq_offsets, T);
    qt.spec = spec_in.stored_for(target);
    L = latentq::layout(qt.spec, D);  // throws for rows a format cannot store
  } catch (const std::invalid_argument&) {
    if (tq_checks) (void)cpu::check_finite(X, T, D, kernel);
    throw;
  }
  assert(L.block_format == (storage_of(qt.spec.format) == Storage::Block));
  qt.rows = T;
  qt.cols = D;
  cpu::assign_zeroed(qt.codes, static_cast<size_t>(T * qt.row_bytes()));
  ops_of(qt.spec.format).quantize(qt, L, {X, T, D, seq_offsets, kernel, amax_x});
  return qt;
}

void quantize_into(QuantizedTensor& qt, const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                   std::span<const int64_t> seq_offsets) {
  try {
    const CpuKernel k = active_cpu_kernel();
    if (spec.format != Format::Int || k == CpuKernel::Reference || T <= 0 || D <= 0) {
      qt = quantize(spec, target, X, T, D, seq_offsets);
      return;
    }
    cpu::quantize_int_fast(qt, spec, target, X, T, D, seq_offsets, k);
  } catch (...) {
    qt = QuantizedTensor{};
    throw;
  }
}

void dequantize(const QuantizedTensor& qt, float* out) {
  [[maybe_unused]] const int64_t rb = qt.row_bytes();  // throws, as layout(), for a tensor no format stores
  assert(static_cast<int64_t>(qt.codes.size()) == qt.rows * rb);
  ops_of(qt.spec.format).dequantize(qt, out, active_cpu_kernel());
}

QuantizedTensor quantize_dequantize(const QuantSpec& spec, Target target, const float* X, int64_t T, int64_t D,
                                    std::span<const int64_t> seq_offsets, float* out) {
  QuantizedTensor qt = quantize(spec, target, X, T, D, seq_offsets);
  dequantize(qt, out);
  return qt;
}

QuantDiagnostics diagnose(const QuantizedTensor& qt, const float* X) {
  QuantDiagnostics r;
  const QuantSpec& spec = qt.spec;
  const int64_t T = qt.rows, D = qt.cols;
  if (spec.format == Format::BF16 || spec.format == Format::TurboQuant || spec.format == Format::LloydMax ||
      spec.format == Format::TransformCoding)
    return r;  // no scale to underflow, no element format to saturate
  const Layout L = qt.layout();
  if (L.block_format) {  // saturation: the block quantizer's own count (its parameters, then count_saturated)
    if (!q::is_finite(q::saturation_threshold(L.desc))) return r;  // ggml blocks never saturate
    const int64_t nb = L.blocks_per_row > 0 ? L.blocks_per_row : 1, blk = L.desc.block;
    const float global = qt.global_scale();
    uint8_t sc[4], of[4];
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < nb; ++j) {
        const int64_t d0 = j * blk, n = std::min(D, d0 + blk) - d0;
        const float* x = X + t * D + d0;
        q::BlockStatus st;
        const q::BlockParams p = q::block_params(L.desc, x, static_cast<int>(n), global, sc, of, st);
        r.saturated += q::count_saturated(L.desc, p, x, static_cast<int>(n));
      }
    return r;
  }
  // integer groups: the true statistics against the stored (scale, offset)
  const bool asym = spec.scheme == Scheme::Asym;
  const float tiny = spec.scale_dtype == ScaleDtype::F16 ? 6.103515625e-05f : q::kFltMin;  // smallest normal
  auto check = [&](float mn, float mx, int64_t gi) {
    const float range = asym ? q::sub_rn(mx, mn) : q::max_num(q::abs_f(mn), q::abs_f(mx));
    const float sc = qt.scale_at(gi);
    if (range > 0.0f && sc < tiny) ++r.scale_underflow;
    if (asym &&
        std::abs(static_cast<double>(qt.offset_at(gi)) - static_cast<double>(mn)) > 0.5 * static_cast<double>(sc))
      ++r.offset_rounding;
  };
  auto fold = [&](int64_t t0, int64_t t1, int64_t d0, int64_t d1, int64_t gi) {
    float mn = X[t0 * D + d0], mx = mn;
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t d = d0; d < d1; ++d) {
        mn = q::min_num(mn, X[t * D + d]);
        mx = q::max_num(mx, X[t * D + d]);
      }
    check(mn, mx, gi);
  };
  switch (spec.granularity) {
    case Granularity::Tensor:
      fold(0, T, 0, D, 0);
      break;
    case Granularity::Channel: {
      // Each group's per-column min/max in one row-major pass over its tokens (the same values as a
      // fold down each column: min/max of finite values do not depend on the order, and check() gives
      // the same counts for either zero sign).
      std::vector<float> mn(static_cast<size_t>(D)), mx(static_cast<size_t>(D));
      for (size_t g = 0; g + 1 < qt.group_bounds.size(); ++g) {
        const int64_t t0 = qt.group_bounds[g], t1 = qt.group_bounds[g + 1];
        if (t1 <= t0) continue;
        (void)cpu::minmax_cols(X, t0, t1, D, mn.data(), mx.data());  // X is finite: it was quantized
        for (int64_t d = 0; d < D; ++d) check(mn[d], mx[d], static_cast<int64_t>(g) * D + d);
      }
      break;
    }
    case Granularity::Token:
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < L.blocks_per_row; ++j)
          fold(t, t + 1, j * L.block, std::min(D, (j + 1) * L.block), t * L.blocks_per_row + j);
      break;
  }
  return r;
}

void check_decodable(const QuantizedTensor& qt, const float* X) {
  std::vector<float> out(static_cast<size_t>(qt.rows * qt.cols));
  dequantize(qt, out.data());
  for (int64_t i = 0; i < qt.rows * qt.cols; ++i)
    if (!q::is_finite(out[i]))
      throw std::invalid_argument(
          overflow_message(qt.spec, "value", X[i],
                           "token " + std::to_string(i / qt.cols) + ", dimension " + std::to_string(i % qt.cols)) +
          ": its decoded value is beyond float32");
}

std::vector<uint8_t> pack_record(const QuantSpec& preset, const QuantizedTensor& ckv, const QuantizedTensor& kpe) {
  if (preset.format != Format::Preset)
    throw std::invalid_argument("pack_record: '" + preset.to_string() + "' is not an engine preset");
  const PresetTraits& P = kPresets[preset.preset];
  if (ckv.spec != preset.stored_for(Target::CKV) || kpe.spec != preset.stored_for(Target::KPE))
    throw std::invalid_argument(std::string("pack_record: ") + P.name + " stores c_kv as '" + P.ckv +
                                "' and k_pe as '" + P.kpe + "', got '" + ckv.spec.to_string() + "' and '" +
                                kpe.spec.to_string() + "'");
  if (ckv.rows != kpe.rows)
    throw std::invalid_argument("pack_record: c_kv has " + std::to_string(ckv.rows) + " tokens, k_pe " +
                                std::to_string(kpe.rows));
  if ((P.native_ckv && ckv.cols != P.native_ckv) || (P.native_kpe && kpe.cols != P.native_kpe))
    throw std::invalid_argument(std::string("pack_record: the ") + P.name + " record holds c_kv of " +
                                std::to_string(P.native_ckv) + " and k_pe of " + std::to_string(P.native_kpe) +
                                " dims, got " + std::to_string(ckv.cols) + " + " + std::to_string(kpe.cols) +
                                " (its bytes per token at other widths: record_bytes())");
  const int64_t T = ckv.rows, R = record_bytes(preset, ckv.cols, kpe.cols);
  const int64_t cb = ckv.row_bytes(), kb = kpe.row_bytes();
  const int64_t cs = static_cast<int64_t>(ckv.scales.size()) / T, ks = static_cast<int64_t>(kpe.scales.size()) / T;
  // Fp4AllScalesPad16Rope also stores the rope columns in c_kv's fp4 format: the engine quantizes the entry's
  // bf16-rounded row, which is what decoding the bf16 k_pe gives back exactly
  QuantizedTensor rope4;
  if (P.order == RecordOrder::Fp4AllScalesPad16Rope && T > 0) {
    std::vector<float> r(static_cast<size_t>(T * kpe.cols));
    dequantize(kpe, r.data());
    const int64_t offs[2] = {0, T};
    rope4 = quantize(ckv.spec, Target::CKV, r.data(), T, kpe.cols, offs);
  }
  std::vector<uint8_t> out(static_cast<size_t>(T * R), 0);
  for (int64_t t = 0; t < T; ++t) {
    uint8_t* o = out.data() + t * R;
    auto put = [&](const std::vector<uint8_t>& v, int64_t n) {
      std::memcpy(o, v.data() + t * n, static_cast<size_t>(n));
      o += n;
    };
    switch (P.order) {
      case RecordOrder::CodesScalesRope:
        put(ckv.codes, cb);
        put(ckv.scales, cs);
        put(kpe.codes, kb);
        put(kpe.scales, ks);
        break;
      case RecordOrder::CodesScalesPad16Rope:  // k_pe is bf16 there (no scales); the 16 pad bytes stay zero
        put(ckv.codes, cb);
        put(ckv.scales, cs);
        o += 16;
        put(kpe.codes, kb);
        put(kpe.scales, ks);
        break;
      case RecordOrder::CodesScalesAlign16Rope:  // k_pe is bf16 there; the zero pad puts it on a 16-byte boundary
        put(ckv.codes, cb);
        put(ckv.scales, cs);
        o = out.data() + t * R + (R - kb - ks);
        put(kpe.codes, kb);
        put(kpe.scales, ks);
        break;
      case RecordOrder::Fp4AllScalesPad16Rope: {  // the rope's fp4 copy beside c_kv's; 16 zero bytes; bf16 k_pe
        const int64_t rb = rope4.row_bytes(), rs = static_cast<int64_t>(rope4.scales.size()) / T;
        put(ckv.codes, cb);
        put(rope4.codes, rb);
        put(ckv.scales, cs);
        put(rope4.scales, rs);
        o += 16;
        put(kpe.codes, kb);
        put(kpe.scales, ks);
        break;
      }
      case RecordOrder::CodesRopeScalesPad8:  // k_pe is bf16 there (no scales); the pad stays zero
      case RecordOrder::CodesCodesScalesScales:
        put(ckv.codes, cb);
        put(kpe.codes, kb);
        put(ckv.scales, cs);
        put(kpe.scales, ks);
        break;
    }
    assert(o <= out.data() + (t + 1) * R);
  }
  return out;
}

Accounting account(const QuantizedTensor& qt) {
  const double bytes = static_cast<double>(qt.storage_bytes());
  return {8.0 * bytes / (static_cast<double>(qt.rows) * static_cast<double>(qt.cols)),
          bytes / static_cast<double>(qt.rows)};
}

int64_t record_pad_per_token(const QuantSpec& requested, Target target, int64_t D_ckv, int64_t D_kpe) {
  if (requested.format != Format::Preset || target != Target::CKV) return 0;
  // record_bytes less its parts (a preset's parts are per-token formats: their bytes per token are the layout's)
  const int64_t parts = layout(requested.stored_for(Target::CKV), D_ckv).bytes_per_token() +
                        layout(requested.stored_for(Target::KPE), D_kpe).bytes_per_token();
  return record_bytes(requested, D_ckv, D_kpe) - parts;
}

Accounting with_record_pad(Accounting a, const QuantSpec& requested, Target target, int64_t D_ckv, int64_t D_kpe) {
  const double pad = static_cast<double>(record_pad_per_token(requested, target, D_ckv, D_kpe));
  if (pad == 0) return a;
  a.bytes_per_token += pad;
  a.bits_per_element += 8.0 * pad / static_cast<double>(D_ckv);
  return a;
}

int64_t storage_bytes(const QuantSpec& spec, Target target, int64_t D, std::span<const int64_t> seq_offsets) {
  const QuantSpec stored = spec.stored_for(target);
  const Layout L = layout(stored, D);
  if (seq_offsets.empty()) throw std::invalid_argument("storage_bytes: seq_offsets is empty (expected [S+1])");
  const int64_t T = seq_offsets.back();
  validate_seq_offsets(seq_offsets, T);
  if (T == 0) return 0;
  int64_t bytes = T * L.bytes_per_token() + L.tensor_bytes;
  if (L.channel) {
    const int64_t groups = static_cast<int64_t>(channel_groups(seq_offsets, T, stored.group_size).size()) - 1;
    bytes += groups * D * L.scale_bytes * (L.offsets ? 2 : 1);
  }
  return bytes;
}

}  // namespace latentq
