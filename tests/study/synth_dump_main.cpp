// lq_synth_dump [--shape ...] OUT.h5: writes the tests' synthetic latentq-dump/1 file (for the CLI
// ctest tests), or one of another shape (e.g. DeepSeek-V2-Lite's, for memory measurements), with
// `latentq synth`'s generator and layer-by-layer writer (latentq/synth.h) at a shape no preset has.
// `lq_synth_dump --help` prints the usage (exit 0); an unknown option or a bad value is exit 2 with
// nothing written: an option is never taken for the output path.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <H5Cpp.h>

#include "latentq/synth.h"

namespace {
const char* const kUsage =
    "usage: lq_synth_dump [--layers N] [--seqs S --seq-len L] [--kv-lora-rank R] [--rope D] [--heads H]\n"
    "                     [--nope N] [--v V] [--query-rows Q] OUT.h5\n"
    "Writes the tests' synthetic latentq-dump/1 file to OUT.h5: by default 4 layers, 3 sequences of 96, 64\n"
    "and 96 tokens, kv_lora_rank 16, qk_rope_head_dim 8, 2 heads, qk_nope_head_dim 4, v_head_dim 4, 6 query\n"
    "rows, seed 1234, attention data included, with the generator of `latentq synth`\n"
    "(study/include/latentq/synth.h). The options change the shape, e.g. DeepSeek-V2-Lite's:\n"
    "--layers 27 --seqs 4 --seq-len 2048 --kv-lora-rank 512 --rope 64 --heads 16 --nope 128 --v 128\n"
    "--query-rows 256 (about 1.2 GB in the file; written one layer at a time).\n"
    "Exit status: 0 written; 2 a usage error (nothing written) or a write error.\n";

// A positive integer option value; false for anything else.
bool positive(const char* s, long long& out) {
  char* end = nullptr;
  out = std::strtoll(s, &end, 10);
  return *s && !*end && out > 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  latentq::SynthOptions o;
  latentq::ModelShape& s = o.shape;
  s = {"test-mla", "test-mla", 4, 2, 16, 8, 4, 4, 10000.0, "interleaved", 0.125, 256, "tests/study"};
  o.seq_lens = {96, 64, 96};
  o.query_rows = 6;
  o.seed = 1234;
  long long seqs = 0, seq_len = 0;
  std::string out_arg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.size() > 1 && a[0] == '-') {
      long long v = 0;
      if (i + 1 >= argc || !positive(argv[i + 1], v)) {
        std::fprintf(stderr, "lq_synth_dump: unknown option '%s' or it lacks a positive integer value\n", argv[i]);
        std::fputs(kUsage, stderr);
        return 2;
      }
      ++i;
      if (a == "--layers")
        s.num_layers = v;
      else if (a == "--seqs")
        seqs = v;
      else if (a == "--seq-len")
        seq_len = v;
      else if (a == "--kv-lora-rank")
        s.kv_lora_rank = v;
      else if (a == "--rope")
        s.qk_rope_head_dim = v;
      else if (a == "--heads")
        s.num_heads = v;
      else if (a == "--nope")
        s.qk_nope_head_dim = v;
      else if (a == "--v")
        s.v_head_dim = v;
      else if (a == "--query-rows")
        o.query_rows = v;
      else {
        std::fprintf(stderr, "lq_synth_dump: unknown option '%s' (the output path may not start with '-'; use ./%s)\n",
                     a.c_str(), a.c_str());
        std::fputs(kUsage, stderr);
        return 2;
      }
      continue;
    }
    if (!out_arg.empty() || a.empty()) {
      std::fprintf(stderr, "lq_synth_dump: expected exactly one output path\n");
      std::fputs(kUsage, stderr);
      return 2;
    }
    out_arg = a;
  }
  if (out_arg.empty()) {
    std::fprintf(stderr, "lq_synth_dump: expected exactly one argument, the output path\n");
    std::fputs(kUsage, stderr);
    return 2;
  }
  if ((seqs > 0) != (seq_len > 0)) {
    std::fprintf(stderr, "lq_synth_dump: --seqs and --seq-len go together\n");
    return 2;
  }
  if (seqs > 0) o.seq_lens.assign(static_cast<size_t>(seqs), seq_len);
  try {
    const std::filesystem::path out = std::filesystem::absolute(out_arg);
    std::filesystem::create_directories(out.parent_path());
    latentq::write_synth_dump(out, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lq_synth_dump: %s\n", e.what());
    return 2;
  } catch (const H5::Exception& e) {
    std::fprintf(stderr, "lq_synth_dump: HDF5: %s\n", e.getDetailMsg().c_str());
    return 2;
  }
  return 0;
}
