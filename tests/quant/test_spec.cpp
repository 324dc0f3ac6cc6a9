// Spec strings (quant/include/latentq/spec.h): round trips, canonical forms, rejections.
#include "test_helpers.h"

namespace {
using namespace lqtest;

TEST(Spec, StudyMatrixRoundTrips) {
  int n = 0;
  for (int bits : {8, 4, 2})
    for (const char* scheme : {"sym", "asym"})
      for (const char* gran : {"tensor", "channel", "token"})
        for (int g : {0, 32, 128})
          for (const char* dt : {"", "-fp32"}) {
            if (std::string(gran) == "tensor" && g != 0) continue;
            const std::string s = "int" + std::to_string(bits) + "-" + scheme + "-" + gran +
                                  (g ? "-g" + std::to_string(g) : std::string()) + dt;
            SCOPED_TRACE(s);
            const QuantSpec q = QuantSpec::parse(s);
            EXPECT_EQ(q.format, Format::Int);
            EXPECT_EQ(q.bits, bits);
            EXPECT_EQ(q.scheme, std::string(scheme) == "sym" ? Scheme::Sym : Scheme::Asym);
            EXPECT_EQ(latentq::to_string(q.granularity), std::string(gran));
            EXPECT_EQ(q.group_size, g);
            EXPECT_EQ(q.scale_dtype, *dt ? ScaleDtype::F32 : ScaleDtype::F16);
            EXPECT_EQ(q.to_string(), s);  // these strings are already canonical
            EXPECT_EQ(QuantSpec::parse(q.to_string()), q);
            ++n;
          }
  EXPECT_EQ(n, 3 * 2 * (1 + 3 + 3) * 2);
}

TEST(Spec, Baselines) {
  const QuantSpec b = QuantSpec::parse("bf16");
  EXPECT_EQ(b.format, Format::BF16);
  EXPECT_EQ(b.bits, 16);
  EXPECT_EQ(b.to_string(), "bf16");
  EXPECT_EQ(QuantSpec::parse(b.to_string()), b);

  // FP8 tiles: the scale rule and its storage are part of the name.
  const QuantSpec f = QuantSpec::parse("fp8-e4m3-tile128-pow2");
  EXPECT_EQ(f.format, Format::Fp8Tile);
  EXPECT_EQ(f.bits, 8);
  EXPECT_EQ(f.group_size, 128);
  EXPECT_EQ(f.rule, latentq::ScaleRule::Pow2);
  EXPECT_EQ(f.scale_dtype, ScaleDtype::F32);
  EXPECT_EQ(QuantSpec::parse("fp8-e4m3-tile64-pow2-ue8m0").scale_dtype, ScaleDtype::UE8M0);
  EXPECT_EQ(QuantSpec::parse("fp8-e4m3-tile128-fp32").rule, latentq::ScaleRule::Fp32);
  EXPECT_EQ(QuantSpec::parse("fp8-e4m3-tensor").rule, latentq::ScaleRule::Calibrated);
  EXPECT_EQ(QuantSpec::parse("fp8-e4m3-tensor-s1").rule, latentq::ScaleRule::Unit);
  // Every block format and preset round-trips through its canonical string.
  for (const char* name : {"fp8-e4m3-tile128-pow2", "fp8-e4m3-tile64-pow2-ue8m0", "fp8-e4m3-tile32-fp32",
                           "fp8-e4m3-tensor", "fp8-e4m3-tensor-s1", "mxfp8", "mxfp4", "nvfp4", "q8_0", "q4_0", "q4_1",
                           "flashmla-v32-fp8", "vllm-fp8-ds-mla", "flashmla-model1-fp8", "flashmla-v41-fp8"}) {
    SCOPED_TRACE(name);
    const QuantSpec q = QuantSpec::parse(name);
    EXPECT_EQ(q.to_string(), name);
    EXPECT_EQ(QuantSpec::parse(q.to_string()), q);
  }
  // Presets: one stored format per target; other specs store themselves on both.
  const QuantSpec v32 = QuantSpec::parse("flashmla-v32-fp8");
  EXPECT_EQ(v32.stored_for(Target::CKV), f);
  EXPECT_EQ(v32.stored_for(Target::KPE), b);
  EXPECT_EQ(QuantSpec::parse("vllm-fp8-ds-mla").stored_for(Target::CKV), QuantSpec::parse("fp8-e4m3-tile128-fp32"));
  EXPECT_EQ(QuantSpec::parse("flashmla-v41-fp8").stored_for(Target::KPE),
            QuantSpec::parse("fp8-e4m3-tile32-pow2-ue8m0"));
  EXPECT_EQ(f.stored_for(Target::KPE), f);
  const QuantSpec i = QuantSpec::parse("int4-asym-channel-g32");
  EXPECT_EQ(i.stored_for(Target::KPE), i);
  EXPECT_EQ(b.stored_for(Target::KPE), b);
  // Labels come from the descriptor table.
  EXPECT_STREQ(latentq::family_of(QuantSpec::parse("q4_1")), "ggml");
  EXPECT_STREQ(latentq::scheme_of(QuantSpec::parse("q4_1")), "asym");
  EXPECT_STREQ(latentq::granularity_of(QuantSpec::parse("mxfp4")), "block");
  EXPECT_STREQ(latentq::scale_dtype_of(QuantSpec::parse("nvfp4")), "e4m3");
  EXPECT_STREQ(latentq::scheme_of(i), "asym");
  EXPECT_STREQ(latentq::granularity_of(i), "channel");
}

TEST(Spec, RetiredFp8TileNameSaysWhatReplacesIt) {
  try {
    (void)QuantSpec::parse("fp8-e4m3-tile128");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    for (const char* n :
         {"retired", "fp8-e4m3-tile<N>-pow2", "fp8-e4m3-tile<N>-fp32", "flashmla-v32-fp8", "vllm-fp8-ds-mla"})
      EXPECT_NE(m.find(n), std::string::npos) << n << " in " << m;
  }
}

TEST(Spec, LayoutFromTheDescriptor) {
  using latentq::layout;
  EXPECT_EQ(layout(QuantSpec::parse("q4_0"), 576).bytes_per_token(), 324);
  EXPECT_EQ(layout(QuantSpec::parse("q4_0"), 576).blocks_per_row, 18);
  EXPECT_EQ(layout(QuantSpec::parse("mxfp4"), 576).bytes_per_token(), 288 + 18);
  EXPECT_EQ(layout(QuantSpec::parse("nvfp4"), 512).bytes_per_token(), 256 + 32);
  EXPECT_EQ(layout(QuantSpec::parse("nvfp4"), 512).tensor_bytes, 4);
  EXPECT_EQ(layout(QuantSpec::parse("fp8-e4m3-tile128-pow2"), 576).blocks_per_row, 5);  // a partial last tile of 64
  EXPECT_EQ(layout(QuantSpec::parse("int4-asym-token-g32"), 128).bytes_per_token(), 64 + 4 * 4);
  // a group size beyond D is one group per row, without overflow
  EXPECT_EQ(layout(QuantSpec::parse("int4-asym-token-g9223372036854775807"), 128).blocks_per_row, 1);
  try {
    (void)layout(QuantSpec::parse("q8_0"), 48);
    ADD_FAILURE() << "accepted D = 48";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
}

// why_not_applicable by hand: the widths each format's `shapes` states, a preset as its stored format per target.
TEST(Spec, WhyNotApplicableByHand) {
  const auto why = [](const char* spec, Target t, int64_t D) {
    return latentq::why_not_applicable(QuantSpec::parse(spec), t, D);
  };
  const std::string ggml = "ggml blocks need a row length that is a multiple of 32, got 16";
  for (const char* s : {"q8_0", "q4_0", "q4_1"}) {
    SCOPED_TRACE(s);
    EXPECT_EQ(why(s, Target::KPE, 16), ggml);
    EXPECT_EQ(why(s, Target::CKV, 16), ggml);  // the target does not matter to a format that is not a preset
    EXPECT_EQ(why(s, Target::KPE, 64), "");
    EXPECT_EQ(why(s, Target::CKV, 512), "");
    EXPECT_NE(why(s, Target::CKV, 48).find("multiple of 32, got 48"), std::string::npos);
  }
  // TurboQuant: the automatic Hadamard block, the largest power of two dividing D, must be >= 16
  EXPECT_EQ(why("tq3", Target::KPE, 16), "");
  EXPECT_EQ(why("tq3", Target::KPE, 48), "");  // block 16
  EXPECT_EQ(why("tq3", Target::KPE, 24),
            "TurboQuant rotates rows of D = 24 by a Hadamard block, a power of two >= 16 dividing D, and D has none");
  // transform coding: floor(R·D/8) code bytes per token must be > 0: tc0.75 on D = 10 stores floor(0.9) = 0
  EXPECT_NE(why("tc0.75", Target::CKV, 10).find("0 code bytes per token for rows of D = 10"), std::string::npos);
  EXPECT_EQ(why("tc0.75", Target::CKV, 11), "");  // floor(8.25 / 8) = 1
  EXPECT_EQ(why("tc1", Target::CKV, 8), "");
  // formats of any width
  for (const char* s : {"int4-asym-channel-g32", "bf16", "fp8-e4m3-tile128-pow2", "mxfp4", "nvfp4", "lm3-channel"})
    EXPECT_EQ(why(s, Target::KPE, 3), "") << s;
  // a preset: its stored format of the target (vllm-turboquant-4bit-nc stores c_kv as tq4-nc, k_pe as bf16)
  EXPECT_NE(why("vllm-turboquant-4bit-nc", Target::CKV, 24).find("Hadamard block"), std::string::npos);
  EXPECT_EQ(why("vllm-turboquant-4bit-nc", Target::KPE, 24), "");
  EXPECT_EQ(why("flashmla-v41-fp8", Target::KPE, 16), "");  // tiles of 32 over 16: one partial tile
  EXPECT_THROW(why("q8_0", Target::KPE, 0), std::invalid_argument);
}

// One rule: layout() refuses exactly the widths why_not_applicable names, with its reason, for every example of the
// format table at every width 1 .. 130.
TEST(Spec, LayoutRefusesExactlyTheInapplicableWidths) {
  for (const std::string& name : latentq::format_examples()) {
    const QuantSpec q = QuantSpec::parse(name);
    for (const Target t : {Target::CKV, Target::KPE})
      for (int64_t D = 1; D <= 130; ++D) {
        SCOPED_TRACE(name + " " + latentq::to_string(t) + " D = " + std::to_string(D));
        const std::string why = latentq::why_not_applicable(q, t, D);
        try {
          (void)latentq::layout(q.stored_for(t), D);
          EXPECT_EQ(why, "");
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(why, "") << e.what();
          EXPECT_EQ(std::string(e.what()), "'" + q.stored_for(t).to_string() + "': " + why);
        }
      }
  }
}

TEST(Spec, CanonicalForms) {
  const std::pair<const char*, const char*> cases[] = {
      {"int4-asym-channel-g0", "int4-asym-channel"},
      {"int4-asym-channel-g0-fp32", "int4-asym-channel-fp32"},
      {"int4-asym-channel-g32-fp16", "int4-asym-channel-g32"},
      {"int8-sym-tensor-fp16", "int8-sym-tensor"},
      {"int2-sym-token-g0-fp16", "int2-sym-token"},
      {"int2-asym-token-fp16", "int2-asym-token"},
  };
  for (auto [in, canon] : cases) {
    SCOPED_TRACE(in);
    const QuantSpec q = QuantSpec::parse(in);
    EXPECT_EQ(q.to_string(), canon);
    EXPECT_EQ(QuantSpec::parse(canon), q);
  }
}

TEST(Spec, RejectionsNameTheStringAndListTheValidForms) {
  const std::pair<const char*, const char*> cases[] = {
      // {string, a word the reason must contain}
      {"", "expected"},
      {"int4", "expected"},
      {"int4-sym", "expected"},
      {"foo", "expected"},
      {"fp16", "expected"},
      {"INT4-asym-channel", "expected"},
      {"int3-sym-tensor", "bits must be 2, 4 or 8, got 3"},
      {"int16-asym-token", "bits must be 2, 4 or 8, got 16"},
      {"int-asym-token", "bits must be a number"},
      {"intx-asym-token", "bits must be a number"},
      {"int4-signed-token", "scheme"},
      {"int4-asym-row", "granularity"},
      {"int4-asym-channel-g-32", "-32"},
      {"int4-asym-channel-gx", "group size"},
      {"int4-asym-channel-g", "group size"},
      {"int4-asym-channel-g+32", "group size"},
      {"int8-sym-tensor-g32", "per-tensor"},
      {"int8-sym-tensor-g0", "per-tensor"},
      {"fp8-e4m3-tile0", "tile width"},
      {"fp8-e4m3-tile", "tile width"},
      {"fp8-e4m3-tile-128", "tile width"},
      {"fp8-e4m3-tile128-pow3", "scale rule"},
      {"fp8-e4m3-tile128-fp32-ue8m0", "scale rule"},
      {"fp8-e4m3-tensor-s2", "fp8-e4m3-tensor-s1"},
      {"mxfp6", "expected"},
      {"fp8-e4m3-tilex", "tile width"},
      {"int4-asym-channel-g32-fp32-x", "unexpected 'x'"},
      {"int4-asym-channel-g32x", "group size"},
      {"int4-asym-channel-fp32-g32", "unexpected 'g32'"},
      {"int4-asym-channel-fp64", "unexpected 'fp64'"},
      {"int4-asym-channel-", "unexpected ''"},
      {"bf16-x", "expected"},
      {" int4-asym-channel", "expected"},
  };
  const std::string grammar = latentq::spec_grammar();
  ASSERT_NE(grammar.find("int{8|4|2}-{sym|asym}-tensor"), std::string::npos);
  ASSERT_NE(grammar.find("fp8-e4m3-tile"), std::string::npos);
  for (auto [s, why] : cases) {
    SCOPED_TRACE(std::string("spec '") + s + "'");
    try {
      (void)QuantSpec::parse(s);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("'") + s + "'"), std::string::npos) << m;
      EXPECT_NE(m.find(why), std::string::npos) << m;
      EXPECT_NE(m.find(grammar), std::string::npos) << m;
    }
  }
}

TEST(Spec, TargetsAndNames) {
  // every row of kTargets round-trips, in Target order
  for (size_t i = 0; i < latentq::kTargetCount; ++i) {
    const latentq::TargetTraits& t = latentq::kTargets[i];
    EXPECT_EQ(static_cast<size_t>(t.target), i) << t.name;
    EXPECT_EQ(latentq::parse_target(t.name), t.target) << t.name;
    EXPECT_STREQ(latentq::to_string(t.target), t.name);
  }
  EXPECT_EQ(latentq::parse_target("index_k"), Target::IndexK);
  EXPECT_STREQ(latentq::to_string(Target::KPE), "k_pe");
  EXPECT_STREQ(latentq::to_string(ScaleDtype::F32), "fp32");
  EXPECT_TRUE(latentq::is_latent_target(Target::CKV) && latentq::is_latent_target(Target::KPE));
  EXPECT_FALSE(latentq::is_latent_target(Target::IndexK));
  // DeepSeek-V4's entries: neither the MLA latent nor the indexer; one row split as an engine record's two parts
  for (const latentq::TargetTraits& t : latentq::kTargets) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(latentq::is_entry_target(t.target), std::string(t.width) == "head_dim");
    EXPECT_FALSE(latentq::is_entry_target(t.target) && latentq::is_latent_target(t.target));
  }
  EXPECT_EQ(latentq::parse_target("window_kv"), Target::WindowKV);
  EXPECT_EQ(latentq::parse_target("compressed_kv"), Target::CompressedKV);
  try {
    latentq::parse_target("kv");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "unknown target 'kv', available: c_kv, k_pe, index_k, window_kv, compressed_kv");
  }
}

TEST(Spec, PresetsStoreTheLatentTargetsOnly) {
  // an engine record pairs c_kv with k_pe: index_k is refused with a reason, and stored_for throws
  const QuantSpec p = QuantSpec::parse("flashmla-v32-fp8");
  EXPECT_EQ(latentq::why_not_applicable(p, Target::IndexK, 128), "an engine record holds c_kv and k_pe, not index_k");
  // a V4 entry row needs its split (the study's, which knows qk_rope_head_dim): the spec alone refuses it
  EXPECT_EQ(latentq::why_not_applicable(p, Target::WindowKV, 512),
            "an engine record holds c_kv and k_pe, not window_kv");
  EXPECT_EQ(latentq::why_not_applicable(p, Target::CKV, 512), "");
  try {
    (void)p.stored_for(Target::IndexK);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "engine preset 'flashmla-v32-fp8' stores c_kv and k_pe; index_k takes a plain format");
  }
  // a plain format stores index_k as itself
  const QuantSpec f = QuantSpec::parse("fp8-e4m3-tile128-pow2");
  EXPECT_EQ(f.stored_for(Target::IndexK), f);
  EXPECT_EQ(latentq::why_not_applicable(f, Target::IndexK, 128), "");
}

}  // namespace
