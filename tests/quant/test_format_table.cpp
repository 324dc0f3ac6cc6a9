// The format table (latentq/spec.h kFormats, kPresets): every row complete, every example canonical and accepted at
// c_kv 512 + k_pe 64 or refused with the reason its row states, every preset's record the size its source states
// (the compile-time parts checked against layout() here), and the engine field the one test of "an engine ships it".
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "latentq/decode_order.h"
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

// Hand-checked: which formats an engine ships for MLA, and which it does not.
TEST(FormatTable, EngineFormats) {
  for (const char* s : {"vllm-fp8-ds-mla", "flashmla-v32-fp8", "fp8-e4m3-tensor", "fp8-e4m3-tensor-s1", "q8_0",
                        "q4_0", "vllm-turboquant-3bit-nc", "flashinfer-nvfp4-mla"})
    EXPECT_TRUE(is_engine_format(QuantSpec::parse(s))) << s;
  for (const char* s : {"int4-asym-channel-g32", "bf16", "tq3-nc", "tq3", "lm3-tensor", "tc3", "tc2-lm", "mxfp4",
                        "nvfp4", "fp8-e4m3-tile128-pow2", "fp4-e2m1-tile16-e4m3-rcp"})
    EXPECT_FALSE(is_engine_format(QuantSpec::parse(s))) << s;
  EXPECT_EQ(engine_of(QuantSpec::parse("vllm-fp8-ds-mla")), "vLLM --kv-cache-dtype fp8_ds_mla");
}

}  // namespace
