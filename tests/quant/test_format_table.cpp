// The format table (latentq/spec.h kFormats, kPresets): every row complete, every example canonical and accepted at
// c_kv 512 + k_pe 64 or refused with the reason its row states, every preset's record the size its source states
// (the compile-time parts checked against layout() here), and the engine field the one test of "an engine ships it".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "latentq/decode_order.h"
#include "latentq/quantize.h"
#include "latentq/spec.h"

namespace {
using namespace latentq;

TEST(FormatTable, EveryRowIsComplete) {
  for (size_t i = 0; i < kFormatCount; ++i) {
    const FormatTraits& t = kFormats[i];
    SCOPED_TRACE(t.family);
    EXPECT_EQ(static_cast<size_t>(t.format), i);
    for (const char* field : {t.grammar, t.family, t.shapes, t.source, t.reference}) {
      ASSERT_NE(field, nullptr);
      EXPECT_FALSE(std::string(field).empty());
    }
    EXPECT_GT(std::string(t.source).size(), 10u);  // a file, commit or standard, not a word
    if (t.format == Format::Preset)
      EXPECT_TRUE(t.examples.empty());  // the presets are kPresets' rows
    else
      EXPECT_FALSE(t.examples.empty());
    EXPECT_EQ(t.storage == Storage::Record, t.format == Format::Preset);
  }
  for (const PresetTraits& p : kPresets) {
    SCOPED_TRACE(p.name);
    for (const char* field : {p.name, p.ckv, p.kpe, p.source, p.engine, p.reference}) ASSERT_NE(field, nullptr);
    EXPECT_NE(std::string(p.source).find(std::to_string(p.stated_bytes) + " B"), std::string::npos);
  }
}

TEST(FormatTable, ExamplesAreCanonicalDistinctAndOfTheirRow) {
  std::set<std::string> seen;
  for (const FormatTraits& t : kFormats)
    for (const char* e : t.examples) {
      SCOPED_TRACE(e);
      const QuantSpec q = QuantSpec::parse(e);
      EXPECT_EQ(q.to_string(), e);
      EXPECT_EQ(q.format, t.format);
      EXPECT_TRUE(seen.insert(e).second);
    }
  EXPECT_EQ(format_examples().size(), seen.size() + kPresetCount);
  EXPECT_EQ(format_rows().size(), format_examples().size());
}

// Each preset's record as its source describes it (RecordPart, summed at compile time) equals the bytes latentq
// stores (layout() of the stored formats, padded as the record order says), at the record's native widths; and
// each part's bytes equal layout()'s for its target.
TEST(FormatTable, PresetRecordsAreTheSizeTheirSourcesState) {
  for (const PresetTraits& p : kPresets) {
    SCOPED_TRACE(p.name);
    const QuantSpec q = QuantSpec::parse(p.name);
    const int64_t dc = p.native_ckv ? p.native_ckv : 512, dk = p.native_kpe ? p.native_kpe : 64;
    EXPECT_EQ(record_bytes(q, dc, dk), p.stated_bytes);
    EXPECT_EQ(p.parts_bytes(), p.stated_bytes);
    EXPECT_EQ(layout(q.stored_for(Target::CKV), dc).bytes_per_token(), p.ckv_part.bytes(dc));
    EXPECT_EQ(layout(q.stored_for(Target::KPE), dk).bytes_per_token(), p.kpe_part.bytes(dk));
  }
}

TEST(FormatTable, RowsAgreeWithTheQuantizer) {
  for (const FormatRow& r : format_rows()) {
    SCOPED_TRACE(r.name);
    const QuantSpec q = QuantSpec::parse(r.name);
    EXPECT_EQ(r.causal, decode_scale_is_causal(q));
    EXPECT_EQ(r.engine, engine_of(q));
    EXPECT_EQ(is_engine_format(q), !r.engine.empty());
    if (r.record_bytes >= 0) {
      EXPECT_EQ(r.record_bytes, record_bytes(q, 512, 64));
      EXPECT_DOUBLE_EQ(r.bits_per_element, static_cast<double>(r.record_bytes) * 8 / 576);
    } else {
      EXPECT_THROW((void)record_bytes(q, 512, 64), std::invalid_argument);
    }
  }
}

// The vLLM fork's nvfp4_ds_mla record (432 B), by hand: group 0 of c_kv is {6, 3, -1.5, 0.5, 0, ...}: amax 6, scale
// e4m3(6/6) = 1.0 = 0x38, codes e2m1 6 -> 7, 3 -> 5, -1.5 -> 0xB, 0.5 -> 1, packed element 2j low: 0x57, 0x1B; the
// other 31 groups are zero (scale 0, codes 0); bytes 288..303 zero; k_pe[0] = 1.0 (bf16 0x3F80) at byte 304, LE.
TEST(FormatTable, VllmNvfp4DsMlaRecordByHand) {
  const QuantSpec p = QuantSpec::parse("vllm-nvfp4-ds-mla");
  std::vector<float> c(512, 0.0f), r(64, 0.0f);
  c[0] = 6.0f, c[1] = 3.0f, c[2] = -1.5f, c[3] = 0.5f;
  r[0] = 1.0f, r[63] = -2.0f;
  const std::vector<int64_t> seq{0, 1};
  const QuantizedTensor qc = quantize(p, Target::CKV, c.data(), 1, 512, seq);
  const QuantizedTensor qr = quantize(p, Target::KPE, r.data(), 1, 64, seq);
  const std::vector<uint8_t> rec = pack_record(p, qc, qr);
  ASSERT_EQ(rec.size(), 432u);
  std::vector<uint8_t> want(432, 0);
  want[0] = 0x57, want[1] = 0x1B, want[256] = 0x38;
  want[304] = 0x80, want[305] = 0x3F;  // k_pe[0] = 1.0
  want[430] = 0x00, want[431] = 0xC0;  // k_pe[63] = -2.0 = bf16 0xC000
  EXPECT_EQ(rec, want);
  // 512 + 64 only: the kernel refuses other widths (kv_lora_rank == 512, pe_dim == 64)
  const QuantizedTensor q448 = quantize(p, Target::CKV, c.data(), 1, 448, seq);
  EXPECT_THROW((void)pack_record(p, q448, qr), std::invalid_argument);
}

// DeepSeek-V4's entry records at 448 + 64, by hand (engine_refs_v4 writes the engines' code out).
// sglang-dsv4-mxfp4: group 0 = {4.21875, -0, 0.75, 1.25}: round(log2(4.21875 / 6)) = -1, byte 126, scale 1/2; codes
// 8.4375 -> 7, -0 -> 0x8, 1.5 -> 3, 2.5 -> 4 (RNE): 0x87, 0x43; zero groups byte 0. sglang-dsv4-int4: group 0 =
// {7, 2.5, -3.5, 0.5}: step e4m3(1) = 0x38, codes 7, 2, -4 (0xC), 0: 0x27, 0x0C. Both: 2 zero bytes, k_pe at 240.
// b12x-dsv4-nvfp4: c_kv group 0 = {6, 3, -1.5, 0.5} -> 0x57, 0x1B, scale 0x38 at 256; the rope again in e2m1 at 224:
// k_pe[0] = 1: scale e4m3(1/6) = 0.171875 (0x23) at 284, 1 / 0.171875 = 5.8 -> 6 (code 7); k_pe[63] = -2: scale
// e4m3(1/3) = 0.34375 (0x2B) at 287, code 0xF in the high nibble of byte 255; 16 zero bytes; bf16 k_pe at 304.
TEST(FormatTable, DeepSeekV4EntryRecordsByHand) {
  std::vector<float> r(64, 0.0f);
  r[0] = 1.0f, r[63] = -2.0f;
  const std::vector<int64_t> seq{0, 1};
  const auto record = [&](const char* name, std::vector<float> c) {
    const QuantSpec p = QuantSpec::parse(name);
    const QuantizedTensor qc = quantize(p, Target::CKV, c.data(), 1, 448, seq);
    const QuantizedTensor qr = quantize(p, Target::KPE, r.data(), 1, 64, seq);
    return pack_record(p, qc, qr);
  };
  std::vector<float> c(448, 0.0f);
  c[0] = 4.21875f, c[1] = -0.0f, c[2] = 0.75f, c[3] = 1.25f;
  std::vector<uint8_t> want(368, 0);
  want[0] = 0x87, want[1] = 0x43, want[224] = 126;
  want[240] = 0x80, want[241] = 0x3F, want[366] = 0x00, want[367] = 0xC0;
  EXPECT_EQ(record("sglang-dsv4-mxfp4", c), want);
  c[0] = 7.0f, c[1] = 2.5f, c[2] = -3.5f, c[3] = 0.5f;
  want[0] = 0x27, want[1] = 0x0C, want[224] = 0x38;
  EXPECT_EQ(record("sglang-dsv4-int4", c), want);
  c[0] = 6.0f, c[1] = 3.0f, c[2] = -1.5f, c[3] = 0.5f;
  std::vector<uint8_t> w4(432, 0);
  w4[0] = 0x57, w4[1] = 0x1B, w4[256] = 0x38;
  w4[224] = 0x07, w4[255] = 0xF0, w4[284] = 0x23, w4[287] = 0x2B;
  w4[304] = 0x80, w4[305] = 0x3F, w4[430] = 0x00, w4[431] = 0xC0;
  EXPECT_EQ(record("b12x-dsv4-nvfp4", c), w4);
  for (const char* name : {"sglang-dsv4-mxfp4", "sglang-dsv4-int4", "b12x-dsv4-nvfp4"})
    EXPECT_EQ(record_bytes(QuantSpec::parse(name), 448, 64), std::string(name).starts_with("b12x") ? 432 : 368);
}

// The study's accounting of a preset (with_record_pad on c_kv, account on k_pe) is the packed record, pad included:
// every preset, 3 tokens of random c_kv 512 + k_pe 64; vllm-nvfp4-ds-mla 288 + 16 + 128 = 432 (a pad of 16).
TEST(FormatTable, StudyAccountingOfAPresetIsItsPackedRecord) {
  std::vector<float> c(3 * 512), r(3 * 64);
  for (size_t i = 0; i < c.size(); ++i) c[i] = std::sin(0.37f * float(i)) * 3.0f;
  for (size_t i = 0; i < r.size(); ++i) r[i] = std::cos(0.11f * float(i));
  const std::vector<int64_t> seq{0, 3};
  for (const PresetTraits& p : kPresets) {
    SCOPED_TRACE(p.name);
    const QuantSpec q = QuantSpec::parse(p.name);
    const QuantizedTensor qc = quantize(q, Target::CKV, c.data(), 3, 512, seq);
    const QuantizedTensor qr = quantize(q, Target::KPE, r.data(), 3, 64, seq);
    const double bytes = with_record_pad(account(qc), q, Target::CKV, 512, 64).bytes_per_token +
                         with_record_pad(account(qr), q, Target::KPE, 512, 64).bytes_per_token;
    // a per-tensor scale (vllm-turboquant-k8v4's fp32 scale) is stored once per matrix, not in the record
    const double per_matrix = static_cast<double>(qc.global.size() + qr.global.size());
    EXPECT_DOUBLE_EQ(bytes, static_cast<double>(record_bytes(q, 512, 64)) + per_matrix / 3);
    if (p.native_ckv == 0 || p.native_ckv == 512)
      EXPECT_DOUBLE_EQ(bytes * 3, static_cast<double>(pack_record(q, qc, qr).size()) + per_matrix);
    const Accounting a = with_record_pad(account(qc), q, Target::CKV, 512, 64);
    EXPECT_DOUBLE_EQ(a.bits_per_element, 8.0 * a.bytes_per_token / 512);
  }
  const QuantSpec v = QuantSpec::parse("vllm-nvfp4-ds-mla"), i4 = QuantSpec::parse("int4-sym-token-g32");
  const QuantizedTensor qc = quantize(v, Target::CKV, c.data(), 3, 512, seq);
  EXPECT_EQ(account(qc).bytes_per_token, 288.0);
  EXPECT_EQ(with_record_pad(account(qc), v, Target::CKV, 512, 64).bytes_per_token, 304.0);
  const QuantizedTensor qi = quantize(i4, Target::CKV, c.data(), 3, 512, seq);  // not a preset: unchanged
  EXPECT_EQ(with_record_pad(account(qi), i4, Target::CKV, 512, 64).bytes_per_token, account(qi).bytes_per_token);
  // The decode-order accounting charges the pad on each quantized token only: 3 tokens at once 3 · 304; with the
  // last token in the bf16 residual window (decode-r1-s0-p0) 2 · 304 + 1 · 1024; k_pe never carries it.
  EXPECT_EQ(decode_order_cache_bytes(v, Target::CKV, 512, seq, DecodeOrder{}, 64), 3 * 304);
  EXPECT_EQ(decode_order_cache_bytes(v, Target::CKV, 512, seq, DecodeOrder::parse("decode-r1-s0-p0"), 64),
            2 * 304 + 1024);
  EXPECT_EQ(decode_order_cache_bytes(v, Target::KPE, 64, seq, DecodeOrder{}, 64), 3 * 128);
}

// The indexer-cache table: each row stores the key in a format of kFormats (one of its examples, so every format
// test runs it), and that format's bytes per token at the row's width are the bytes the source states.
TEST(FormatTable, IndexerPresetsAreFormatsOfTheTableAtTheirStatedBytes) {
  const std::vector<std::string> examples = format_examples();
  std::set<std::string> names;
  for (const IndexerPresetTraits& p : kIndexerPresets) {
    SCOPED_TRACE(p.name);
    for (const char* field : {p.name, p.spec, p.engine, p.source, p.page_layout, p.exact_when, p.reference}) {
      ASSERT_NE(field, nullptr);
      EXPECT_FALSE(std::string(field).empty());
    }
    EXPECT_TRUE(names.insert(p.name).second);
    EXPECT_NE(std::find(examples.begin(), examples.end(), std::string(p.spec)), examples.end());
    const QuantSpec q = QuantSpec::parse(p.spec);
    EXPECT_NE(q.format, Format::Preset);
    EXPECT_EQ(q.to_string(), p.spec);
    EXPECT_EQ(layout(q, p.width).bytes_per_token(), p.stated_bytes);
    EXPECT_EQ(p.part.bytes(p.width), p.stated_bytes);
    EXPECT_EQ(why_not_applicable(q, Target::IndexK, p.width), "");
  }
  // vLLM's DSA indexer key: 128 e4m3 + one fp32 scale = 132 B; SGLang's MXFP4: 64 B of e2m1 + 4 UE8M0 = 68 B
  EXPECT_EQ(std::string(kIndexerPresets[0].spec), "fp8-e4m3-tile128-pow2-amaxfloor");
  EXPECT_EQ(kIndexerPresets[0].stated_bytes, 132);
  EXPECT_EQ(std::string(kIndexerPresets[1].spec), "mxfp4-ceil");
  EXPECT_EQ(kIndexerPresets[1].stated_bytes, 68);
}

// Hand-checked: which formats an engine ships for MLA, and which it does not.
TEST(FormatTable, EngineFormats) {
  for (const char* s : {"vllm-fp8-ds-mla", "flashmla-v32-fp8", "fp8-e4m3-tensor", "fp8-e4m3-tensor-s1", "q8_0",
                        "q4_0", "vllm-turboquant-3bit-nc", "flashinfer-nvfp4-mla", "vllm-nvfp4-ds-mla"})
    EXPECT_TRUE(is_engine_format(QuantSpec::parse(s))) << s;
  for (const char* s : {"int4-asym-channel-g32", "bf16", "tq3-nc", "tq3", "lm3-tensor", "tc3", "tc2-lm", "mxfp4",
                        "nvfp4", "fp8-e4m3-tile128-pow2", "fp4-e2m1-tile16-e4m3-rcp"})
    EXPECT_FALSE(is_engine_format(QuantSpec::parse(s))) << s;
  EXPECT_EQ(engine_of(QuantSpec::parse("vllm-fp8-ds-mla")), "vLLM --kv-cache-dtype fp8_ds_mla");
}

}  // namespace
