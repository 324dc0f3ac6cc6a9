// Study configs: the default matrix, exclusions, per-target lists, and every kind of config error.
#include <gtest/gtest.h>

#include <algorithm>

#include "latentq/config.h"

namespace {
using namespace latentq;
namespace fs = std::filesystem;

std::vector<std::string> names(const std::vector<Quantizer>& q) {
  std::vector<std::string> out;
  for (const auto& x : q) out.push_back(x.name);
  return out;
}

StudyConfig parse(const std::string& text) { return parse_config(text, "test.toml", "/base/dir"); }

// Expects parse(text) to throw std::invalid_argument whose message contains every part.
void expect_config_error(const std::string& text, std::initializer_list<std::string> parts) {
  SCOPED_TRACE(text);
  try {
    parse(text);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

const std::string kMatrix = R"(
[quantizers]
bits = [8, 4, 2]
schemes = ["sym", "asym"]
granularities = ["tensor", "channel", "token"]
group_sizes = [0, 32, 128]
)";

TEST(Config, DefaultIsTheFullMatrix) {
  const StudyConfig c = default_config();
  // 3 bits x 2 schemes x (1 tensor + 3 channel + 3 token) = 42, + bf16 + 12 engine/standard formats
  // + 16 transformed quantizers + 8 codebook formats (tq2/3/4-nc, vllm-turboquant-3bit-nc, lm2/3/4-channel and
  // the 17th transformed one, klt,lm3-channel) + 5 transform-coding ones (klt,tc3, klt,tc2-lm, klt,tc4,
  // sklt,tc3, sklt,tc2-lm: 22 transformed).
  ASSERT_EQ(c.targets.size(), 2u);
  EXPECT_EQ(c.targets[0].target, Target::CKV);
  EXPECT_EQ(c.targets[1].target, Target::KPE);
  for (const TargetPlan& p : c.targets) {
    ASSERT_EQ(p.quantizers.size(), 84u);
    EXPECT_EQ(std::count_if(p.quantizers.begin(), p.quantizers.end(),
                            [](const Quantizer& q) {
                              return q.spec.format == Format::Int && q.transform.kind == TransformKind::None;
                            }),
              42);
    EXPECT_EQ(std::count_if(p.quantizers.begin(), p.quantizers.end(),
                            [](const Quantizer& q) { return q.transform.kind != TransformKind::None; }),
              22);
  }
  const auto n = names(c.targets[0].quantizers);
  EXPECT_EQ(
      std::vector<std::string>(n.begin(), n.begin() + 8),
      (std::vector<std::string>{"int8-sym-tensor", "int8-sym-channel", "int8-sym-channel-g32", "int8-sym-channel-g128",
                                "int8-sym-token", "int8-sym-token-g32", "int8-sym-token-g128", "int8-asym-tensor"}));
  EXPECT_EQ(n[42], "bf16");
  EXPECT_EQ(std::vector<std::string>(n.begin() + 43, n.begin() + 55),
            (std::vector<std::string>{"flashmla-v32-fp8", "vllm-fp8-ds-mla", "flashmla-v41-fp8", "flashmla-v41-fp4",
                                      "fp8-e4m3-tensor", "fp8-e4m3-tensor-s1", "mxfp8", "mxfp4", "nvfp4", "q8_0",
                                      "q4_0", "q4_1"}));
  EXPECT_EQ(n[55], "had,int4-asym-channel-g32");
  EXPECT_EQ(n[70], "had,flashmla-v32-fp8");
  EXPECT_EQ(c.all_quantizers().size(), 84u);
  EXPECT_TRUE(c.layers.empty());
  const fs::path config_dir = default_config_path().parent_path();
  EXPECT_EQ(c.dump, (config_dir / "../../data/latents/tiny-mla.h5").lexically_normal());
  EXPECT_EQ(c.results, (config_dir / "../../results/default.h5").lexically_normal());
  EXPECT_EQ(c.text, std::string(default_config_text()));
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(default_config_path().filename(), "default.toml");
}

TEST(Config, MatrixSize) {
  EXPECT_EQ(expand_matrix({8, 4, 2}, {"sym", "asym"}, {"tensor", "channel", "token"}, {0, 32, 128}, {"fp16"}).size(),
            42u);
  EXPECT_EQ(expand_matrix({4}, {"asym"}, {"tensor"}, {0, 32}, {"fp16", "fp32"}).size(), 2u);
  EXPECT_EQ(expand_matrix({4}, {"asym"}, {"channel"}, {32, 64}, {"fp16", "fp32"}).size(), 4u);
  // Duplicates collapse: -g0 and no group are the same spec.
  EXPECT_EQ(names(expand_matrix({2}, {"sym"}, {"token"}, {0, 0}, {"fp16"})),
            (std::vector<std::string>{"int2-sym-token"}));
  EXPECT_EQ(names(expand_matrix({4}, {"asym"}, {"channel"}, {32}, {"fp16", "fp32"})),
            (std::vector<std::string>{"int4-asym-channel-g32", "int4-asym-channel-g32-fp32"}));
}

TEST(Config, ExcludeGlobsAndSpecs) {
  const StudyConfig c = parse(kMatrix + R"(extra = ["bf16"]
exclude = ["int2-*", "int8-asym-tensor-fp16", "*-token-g128"]
)");
  const auto n = names(c.targets[0].quantizers);
  // 42 - 14 (int2) - 1 (int8-asym-tensor) - 4 (int8/int4 x sym/asym token-g128) + bf16 = 24
  EXPECT_EQ(n.size(), 24u);
  EXPECT_TRUE(std::none_of(n.begin(), n.end(), [](const std::string& s) { return s.starts_with("int2"); }));
  EXPECT_EQ(std::count(n.begin(), n.end(), "int8-asym-tensor"), 0);
  EXPECT_EQ(std::count(n.begin(), n.end(), "int8-sym-tensor"), 1);
  EXPECT_EQ(std::count(n.begin(), n.end(), "int4-asym-token-g128"), 0);
  EXPECT_EQ(n.back(), "bf16");
  EXPECT_TRUE(c.warnings.empty());
}

TEST(Config, ExcludeMatchingNothingWarns) {
  const StudyConfig c = parse(kMatrix + "exclude = [\"fp8-*\"]\n");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("exclude pattern 'fp8-*' matches no quantizer"), std::string::npos);
  EXPECT_EQ(c.targets[0].quantizers.size(), 42u);
}

TEST(Config, QuantizerMatches) {
  EXPECT_TRUE(quantizer_matches("int4-asym-channel-g32", "int4-asym-channel-g32-fp16"));
  EXPECT_TRUE(quantizer_matches("int4-asym-channel-g32", "int4-*-g32"));
  EXPECT_FALSE(quantizer_matches("int4-asym-channel-g32", "int4-asym-channel"));
  EXPECT_FALSE(quantizer_matches("int4-asym-channel-g32-fp32", "int4-asym-channel-g32"));
}

TEST(Config, PerTargetList) {
  const StudyConfig c = parse(kMatrix + R"(
[targets.k_pe]
quantizers = ["int8-asym-channel-g32", "bf16", "int8-asym-channel-g32-fp16"]
exclude = ["bf16"]
[targets.c_kv]
exclude = ["int8-*", "int4-*"]
)");
  ASSERT_EQ(c.targets.size(), 2u);
  EXPECT_EQ(names(c.plan(Target::KPE)->quantizers), (std::vector<std::string>{"int8-asym-channel-g32"}));
  EXPECT_EQ(c.plan(Target::CKV)->quantizers.size(), 14u);
  const auto all = names(c.all_quantizers());
  EXPECT_EQ(all.size(), 15u);
  EXPECT_EQ(all.back(), "int8-asym-channel-g32");
}

TEST(Config, InputSection) {
  const StudyConfig c = parse(R"(
[input]
dump = "../d/x.h5"
layers = [3, 1]
targets = ["k_pe"]
[quantizers]
extra = ["bf16", "flashmla-v32-fp8"]
[output]
results = "/abs/out.h5"
)");
  EXPECT_EQ(c.dump, fs::path("/base/d/x.h5"));
  EXPECT_EQ(c.layers, (std::vector<int>{3, 1}));
  ASSERT_EQ(c.targets.size(), 1u);
  EXPECT_EQ(c.targets[0].target, Target::KPE);
  EXPECT_EQ(names(c.targets[0].quantizers), (std::vector<std::string>{"bf16", "flashmla-v32-fp8"}));
  EXPECT_EQ(c.results, fs::path("/abs/out.h5"));
  EXPECT_EQ(c.base_dir, fs::path("/base/dir"));
}

TEST(Config, UnknownKeys) {
  expect_config_error(kMatrix + "bitz = [8]\n", {"test.toml:", "unknown key 'quantizers.bitz'", "bits, schemes"});
  expect_config_error("[inputs]\ndump = \"x\"\n", {"unknown key 'inputs'", "input, quantizers, targets, output"});
  expect_config_error("[input]\nlayer = [1]\n", {"unknown key 'input.layer'"});
  expect_config_error("[output]\nresult = \"x\"\n", {"unknown key 'output.result'"});
  expect_config_error(kMatrix + "[targets.q_pe]\nquantizers = [\"bf16\"]\n", {"unknown key 'targets.q_pe'"});
  expect_config_error(kMatrix + "[targets.k_pe]\nquantizer = [\"bf16\"]\n", {"unknown key 'targets.k_pe.quantizer'"});
}

TEST(Config, UnknownSpec) {
  expect_config_error(kMatrix + "extra = [\"int3-sym-token\"]\n",
                      {"test.toml:", "unknown quantizer spec 'int3-sym-token'", "Valid forms"});
  expect_config_error(kMatrix + "extra = [\"fp4\"]\n", {"unknown quantizer spec 'fp4'", "int{8|4|2}"});
  expect_config_error(kMatrix + "exclude = [\"int4-foo\"]\n", {"unknown quantizer spec 'int4-foo'"});
  expect_config_error(kMatrix + "[targets.c_kv]\nquantizers = [\"int4-asym-tensor-g32\"]\n",
                      {"a per-tensor spec takes no group size"});
}

TEST(Config, BadValues) {
  expect_config_error("[quantizers]\nbits = [8, 3]\nschemes = [\"sym\"]\ngranularities = [\"tensor\"]\n",
                      {"test.toml:2:", "'quantizers.bits': bits = 3 is not one of 2, 4, 8"});
  expect_config_error(kMatrix + "scale_dtypes = [\"bf16\"]\n", {"scale dtype 'bf16' is not one of fp16, fp32"});
  expect_config_error(
      "[quantizers]\nbits = [8]\nschemes = [\"sym\"]\ngranularities = [\"channel\"]\ngroup_sizes = [32, -32]\n",
      {"'quantizers.group_sizes': group size -32 is negative"});
  expect_config_error("[quantizers]\nbits = [8]\nschemes = [\"symmetric\"]\ngranularities = [\"channel\"]\n",
                      {"scheme 'symmetric' is not one of sym, asym"});
  expect_config_error("[quantizers]\nbits = [8]\nschemes = [\"sym\"]\ngranularities = [\"row\"]\n",
                      {"granularity 'row' is not one of tensor, channel, token"});
  expect_config_error("[quantizers]\nbits = [8]\n", {"'quantizers.bits', 'schemes' and 'granularities' go together"});
  expect_config_error("[quantizers]\nbits = 8\nschemes = [\"sym\"]\ngranularities = [\"tensor\"]\n",
                      {"'quantizers.bits' must be an array of integers"});
  expect_config_error(kMatrix + "[input]\nlayers = \"some\"\n", {"'input.layers' must be \"all\" or an array"});
  expect_config_error(kMatrix + "[input]\nlayers = [1, 1]\n", {"layer 1 is listed twice"});
  expect_config_error(kMatrix + "[input]\ntargets = [\"q_nope\"]\n", {"unknown target 'q_nope'"});
  expect_config_error(kMatrix + "[input]\ntargets = []\n", {"'input.targets' is empty"});
  expect_config_error(kMatrix + "[input]\ntargets = [\"c_kv\", \"index_k\"]\n",
                      {"'input.targets': 'index_k' is studied by [indexer] on a sparse MLA dump"});
  expect_config_error(kMatrix + "[input]\ndump = 3\n", {"'input.dump' must be a string"});
  expect_config_error(kMatrix + "[input]\ntargets = [\"c_kv\"]\n[targets.k_pe]\nquantizers = [\"bf16\"]\n",
                      {"[targets.k_pe] is configured but 'k_pe' is not in input.targets"});
  expect_config_error("[input]\ndump = \"x.h5\"\n", {"no quantizer for target c_kv"});
  expect_config_error(kMatrix + "exclude = [\"*\"]\n", {"no quantizer for target c_kv"});
}

// A non-ASCII character where TOML allows whitespace (U+0310 after a key, found by fuzz/fuzz_config):
// toml++ 3.3.0 classifies it through a switch whose default is unreachable (upstream
// marzer/tomlplusplus#190, #295), the Debian library then refuses it as a syntax error, named here.
TEST(Config, NonAsciiWhereWhitespaceGoes) {
  expect_config_error("bit\xcc\x90 4", {"test.toml:1:4: TOML syntax error"});
  expect_config_error("[input]\ndump = \"x.h5\"\xc2\xa1\n", {"test.toml:2:", "TOML syntax error"});
}

TEST(Config, SyntaxError) { expect_config_error("[input]\ndump = \"x.h5\n", {"test.toml:2:", "TOML syntax error"}); }

TEST(Config, LoadConfigFile) {
  EXPECT_THROW(load_config("/nonexistent/latentq/config.toml"), std::runtime_error);
  const fs::path p = fs::path(LATENTQ_SOURCE_DIR) / "study" / "config" / "default.toml";
  const StudyConfig c = load_config(p);
  const StudyConfig d = default_config();
  EXPECT_EQ(c.dump, d.dump);  // the embedded default stands for this very file
  EXPECT_EQ(c.results, d.results);
  EXPECT_EQ(c.text, d.text) << "the embedded default config is stale: rebuild";
  EXPECT_EQ(names(c.all_quantizers()), names(d.all_quantizers()));
}

}  // namespace

namespace {
// [e2e]'s pass-through keys: resolved paths, values, and each bad value named at its position.
TEST(Config, E2eKeys) {
  const StudyConfig c =
      parse(kMatrix +
            "[e2e]\nenabled = true\nmodel = \"ckpt\"\ntext = \"t.txt\"\nseq_len = 64\nnum_seqs = 2\noffset_bytes = 0\n"
            "device = \"cuda:1\"\ndtype = \"bfloat16\"\nbatch_runs = 3\n");
  const E2eSettings& e = c.probes.e2e;
  EXPECT_TRUE(e.enabled);
  EXPECT_EQ(e.model, fs::path("/base/dir/ckpt"));
  EXPECT_EQ(e.text, fs::path("/base/dir/t.txt"));
  EXPECT_EQ(e.seq_len, 64);
  EXPECT_EQ(e.num_seqs, 2);
  EXPECT_EQ(e.offset_bytes, 0);
  EXPECT_EQ(e.device, "cuda:1");
  EXPECT_EQ(e.dtype, "bfloat16");
  EXPECT_EQ(e.batch_runs, 3);
  const StudyConfig d = parse(kMatrix + "[e2e]\nenabled = true\n");  // unset: the script's defaults
  EXPECT_EQ(d.probes.e2e.seq_len, 0);
  EXPECT_EQ(d.probes.e2e.offset_bytes, -1);
  EXPECT_TRUE(d.probes.e2e.text.empty() && d.probes.e2e.device.empty() && d.probes.e2e.dtype.empty());
  expect_config_error(kMatrix + "[e2e]\nseq_len = 1\n",  // a next-token metric needs 2 tokens per sequence
                      {"test.toml:8:11:", "'e2e.seq_len' must be an integer >= 2 (at least 2 tokens per sequence"});
  expect_config_error(kMatrix + "[e2e]\nnum_seqs = 1.5\n", {"'e2e.num_seqs' must be an integer >= 1"});
  expect_config_error(kMatrix + "[e2e]\noffset_bytes = -3\n", {"'e2e.offset_bytes' must be an integer >= 0"});
  expect_config_error(kMatrix + "[e2e]\ndevice = \"tpu\"\n", {"'e2e.device' = 'tpu': expected cpu, cuda or cuda:N"});
  expect_config_error(kMatrix + "[e2e]\ndtype = \"fp8\"\n",
                      {"'e2e.dtype' = 'fp8': expected float32, bfloat16 or float16"});
  expect_config_error(kMatrix + "[e2e]\ntexts = \"x\"\n", {"unknown key 'e2e.texts'"});
}

// [e2e]'s generation and retrieval keys: unset is distinguishable from false (`latentq study` turns an unset one on).
TEST(Config, E2eGenerationAndRetrievalKeys) {
  const StudyConfig c = parse(kMatrix +
                              "[e2e]\ngeneration = true\ngeneration_prompts = 3\ngeneration_prompt_len = 48\n"
                              "generation_new_tokens = 16\nretrieval = false\nneedle_lengths = [64, 200]\n"
                              "needle_samples = 2\n");
  const E2eSettings& e = c.probes.e2e;
  ASSERT_TRUE(e.generation.has_value());
  EXPECT_TRUE(*e.generation);
  EXPECT_EQ(e.gen_prompts, 3);
  EXPECT_EQ(e.gen_prompt_len, 48);
  EXPECT_EQ(e.gen_new_tokens, 16);
  ASSERT_TRUE(e.retrieval.has_value());
  EXPECT_FALSE(*e.retrieval);
  EXPECT_EQ(e.needle_lengths, (std::vector<int64_t>{64, 200}));
  EXPECT_EQ(e.needle_samples, 2);
  const StudyConfig d = parse(kMatrix + "[e2e]\nenabled = true\n");
  EXPECT_FALSE(d.probes.e2e.generation.has_value());
  EXPECT_FALSE(d.probes.e2e.retrieval.has_value());
  EXPECT_TRUE(d.probes.e2e.needle_lengths.empty());
  expect_config_error(kMatrix + "[e2e]\ngeneration_new_tokens = 0\n",
                      {"'e2e.generation_new_tokens' must be an integer >= 1"});
  expect_config_error(kMatrix + "[e2e]\nneedle_lengths = []\n", {"'e2e.needle_lengths' is empty"});
  expect_config_error(kMatrix + "[e2e]\ngeneration = 1\n", {"e2e.generation"});
}
}  // namespace
