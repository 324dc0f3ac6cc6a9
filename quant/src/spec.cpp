#include "latentq/spec.h"

#include <charconv>
#include <stdexcept>
#include <string>
#include <vector>

namespace latentq {
namespace {

std::vector<std::string_view> split_dash(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t p = s.find('-', start);
    out.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return out;
}

[[noreturn]] void bad(std::string_view s, const std::string& why) {
  throw std::invalid_argument("unknown quantizer spec '" + std::string(s) + "': " + why + ".\nValid forms:\n" +
                              spec_grammar());
}

// Parses a non-negative decimal integer; false on anything else (sign, junk, overflow).
bool parse_int(std::string_view t, int64_t& v) {
  if (t.empty()) return false;
  auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  return ec == std::errc() && p == t.data() + t.size();
}

}  // namespace

std::string spec_grammar() {
  return "  int{8|4|2}-{sym|asym}-tensor[-fp32]\n"
         "  int{8|4|2}-{sym|asym}-{channel|token}[-g<N>][-fp32]   (N >= 0; g0 or no -g = whole axis)\n"
         "  bf16\n"
         "  fp8-e4m3-tile<N>                                       (N > 0; FlashMLA uses tile128)\n"
         "  scale/offset dtype is fp16 unless -fp32 is given\n"
         "  examples: int4-asym-channel-g32, int8-sym-tensor, int2-asym-token-g64, fp8-e4m3-tile128, bf16";
}

QuantSpec QuantSpec::parse(std::string_view s) {
  QuantSpec q;
  if (s == "bf16") {
    q.format = Format::BF16;
    q.bits = 16;
    return q;
  }
  const auto parts = split_dash(s);
  if (parts.size() == 3 && parts[0] == "fp8" && parts[1] == "e4m3" && parts[2].starts_with("tile")) {
    int64_t tile = 0;
    if (!parse_int(parts[2].substr(4), tile) || tile <= 0) bad(s, "the tile width must be a positive integer");
    q.format = Format::Fp8Tile;
    q.bits = 8;
    q.group_size = tile;
    q.scale_dtype = ScaleDtype::F32;
    return q;
  }
  if (parts.size() < 3 || !parts[0].starts_with("int")) bad(s, "expected int<bits>-<scheme>-<granularity>, bf16 or fp8-e4m3-tile<N>");
  int64_t bits = 0;
  if (!parse_int(parts[0].substr(3), bits)) bad(s, "bits must be a number");
  if (bits != 8 && bits != 4 && bits != 2) bad(s, "bits must be 2, 4 or 8, got " + std::to_string(bits));
  q.bits = static_cast<int>(bits);
  if (parts[1] == "sym") q.scheme = Scheme::Sym;
  else if (parts[1] == "asym") q.scheme = Scheme::Asym;
  else bad(s, "scheme must be sym or asym, got '" + std::string(parts[1]) + "'");
  if (parts[2] == "tensor") q.granularity = Granularity::Tensor;
  else if (parts[2] == "channel") q.granularity = Granularity::Channel;
  else if (parts[2] == "token") q.granularity = Granularity::Token;
  else bad(s, "granularity must be tensor, channel or token, got '" + std::string(parts[2]) + "'");
  size_t i = 3;
  if (i < parts.size() && parts[i].starts_with("g")) {
    if (q.granularity == Granularity::Tensor) bad(s, "a per-tensor spec takes no group size");
    const std::string_view g = parts[i].substr(1);
    int64_t gs = 0;
    if (!parse_int(g, gs)) {
      // "int4-asym-channel-g-32" splits into "g" and "32": a negative group size.
      if (g.empty() && i + 1 < parts.size()) bad(s, "the group size must be >= 0, got -" + std::string(parts[i + 1]));
      bad(s, "the group size must be a non-negative integer, got '" + std::string(g) + "'");
    }
    q.group_size = gs;
    ++i;
  }
  if (i < parts.size() && (parts[i] == "fp32" || parts[i] == "fp16")) {
    q.scale_dtype = parts[i] == "fp32" ? ScaleDtype::F32 : ScaleDtype::F16;
    ++i;
  }
  if (i != parts.size()) bad(s, "unexpected '" + std::string(parts[i]) + "'");
  return q;
}

std::string QuantSpec::to_string() const {
  switch (format) {
    case Format::BF16: return "bf16";
    case Format::Fp8Tile: return "fp8-e4m3-tile" + std::to_string(group_size);
    case Format::Int: break;
  }
  std::string s = "int" + std::to_string(bits) + "-" + latentq::to_string(scheme) + "-" + latentq::to_string(granularity);
  if (granularity != Granularity::Tensor && group_size > 0) s += "-g" + std::to_string(group_size);
  if (scale_dtype == ScaleDtype::F32) s += "-fp32";
  return s;
}

QuantSpec QuantSpec::stored_for(Target target) const {
  if (format == Format::Fp8Tile && target == Target::KPE) return parse("bf16");
  return *this;
}

const char* to_string(Scheme s) { return s == Scheme::Sym ? "sym" : "asym"; }
const char* to_string(Granularity g) {
  switch (g) {
    case Granularity::Tensor: return "tensor";
    case Granularity::Channel: return "channel";
    case Granularity::Token: return "token";
  }
  return "?";
}
const char* to_string(Target t) { return t == Target::CKV ? "c_kv" : "k_pe"; }
const char* to_string(ScaleDtype d) { return d == ScaleDtype::F16 ? "fp16" : "fp32"; }

Target parse_target(std::string_view s) {
  if (s == "c_kv") return Target::CKV;
  if (s == "k_pe") return Target::KPE;
  throw std::invalid_argument("unknown target '" + std::string(s) + "': expected c_kv or k_pe");
}

}  // namespace latentq
