// libFuzzer harness: quantizer spec strings (latentq/spec.h QuantSpec::parse, latentq/transform.h
// Transform::parse and TransformedSpec::parse). The input is the string. Properties:
//   - each parse returns or throws std::invalid_argument whose message quotes the string (or the part
//     of it that is wrong);
//   - a parsed spec's canonical string parses back to the same spec and is its own canonical string;
//   - what a config can then do with the spec does not crash: its layout and bytes per token for a
//     few row lengths, a preset's record bytes, the Hadamard block, and quantize_dequantize (rotated
//     for a Hadamard transform) of a small fixed matrix, whose output is finite.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "latentq/quantize.h"
#include "latentq/spec.h"
#include "latentq/transform.h"

namespace {
using namespace latentq;

// The message of a refused string names it, or the part that was refused (the transform or the
// quantizer of "<transform>,<quantizer>"). Strings with a NUL are not checked (what() stops there).
bool names_input(std::string_view msg, std::string_view s) {
  if (s.find('\0') != std::string_view::npos) return true;
  if (msg.find(s) != std::string_view::npos) return true;
  const size_t p = s.find(',');
  return p != std::string_view::npos &&
         (msg.find(s.substr(0, p)) != std::string_view::npos || msg.find(s.substr(p + 1)) != std::string_view::npos);
}

template <class F>
bool parses(F&& f, std::string_view s, const char* what) {
  try {
    f();
    return true;
  } catch (const std::invalid_argument& e) {
    if (!names_input(e.what(), s))
      lqfuzz::fail(std::string(what) + ": the message does not name the input: " + e.what());
  }
  return false;
}

// A small matrix with an outlier channel, two sequences (for per-channel groups).
struct Sample {
  static constexpr int64_t T = 5;
  std::vector<float> x;
  std::vector<int64_t> seq_offsets{0, 2, T};
  explicit Sample(int64_t D) : x(static_cast<size_t>(T * D)) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i)) * (i % 7 == 3 ? 40.0f : 1.5f);
  }
};

void exercise(const TransformedSpec& ts) {
  const QuantSpec& q = ts.spec;
  if (q.format == Format::Preset) (void)record_bytes(q, 512, 64);
  for (const Target target : {Target::CKV, Target::KPE}) {
    const QuantSpec stored = q.stored_for(target);
    for (const int64_t D : {1, 16, 48, 64, 576}) {
      Layout L;
      if (!parses([&] { L = layout(stored, D); }, "", "layout")) continue;
      if (L.bytes_per_token() < 0 || L.row_code_bytes < 0 || L.blocks_per_row < 0 || L.blocks_per_row > D)
        lqfuzz::fail("layout of " + stored.to_string() + " at D = " + std::to_string(D) +
                     ": negative or too many blocks");
    }
    if (ts.transform.kind == TransformKind::Hadamard)
      for (const int64_t D : {48, 64}) (void)parses([&] { (void)hadamard_block(D, ts.transform.block); }, "", "block");
  }
  for (const int64_t D : {48, 64}) {
    const Sample s(D);
    std::vector<float> out(s.x.size());
    Rotation rot;
    if (ts.transform.kind == TransformKind::Hadamard &&
        !parses([&] { rot = Rotation::make(ts.transform, D); }, "", "Rotation::make"))
      continue;
    const bool ok = parses(
        [&] {
          (void)quantize_dequantize_rotated(q, rot, Target::CKV, s.x.data(), Sample::T, D, s.seq_offsets, out.data());
        },
        "", "quantize");
    if (ok && !std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); }))
      lqfuzz::fail(ts.to_string() + ": non-finite output of a finite input at D = " + std::to_string(D));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);

  QuantSpec q;
  if (parses([&] { q = QuantSpec::parse(s); }, s, "QuantSpec::parse")) {
    const std::string c = q.to_string();
    const QuantSpec back = QuantSpec::parse(c);
    if (!(back == q) || back.to_string() != c)
      lqfuzz::fail("QuantSpec round trip: '" + std::string(s) + "' -> '" + c + "'");
  }

  Transform t;
  if (parses([&] { t = Transform::parse(s); }, s, "Transform::parse")) {
    const std::string c = t.to_string();
    const Transform back = Transform::parse(c);
    if (!(back == t) || back.to_string() != c)
      lqfuzz::fail("Transform round trip: '" + std::string(s) + "' -> '" + c + "'");
  }

  TransformedSpec ts;
  if (parses([&] { ts = TransformedSpec::parse(s); }, s, "TransformedSpec::parse")) {
    const std::string c = ts.to_string();
    const TransformedSpec back = TransformedSpec::parse(c);
    if (!(back == ts) || back.to_string() != c)
      lqfuzz::fail("TransformedSpec round trip: '" + std::string(s) + "' -> '" + c + "'");
    exercise(ts);
  }
  return 0;
}
