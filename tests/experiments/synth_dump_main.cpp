// lq_synth_dump [--shape ...] OUT.h5: writes the tests' synthetic latentq-dump/1 file (for the CLI
// ctest tests), or one of another shape (e.g. DeepSeek-V2-Lite's, for memory measurements).
// `lq_synth_dump --help` prints the usage (exit 0); an unknown option or a bad value is exit 2 with
// nothing written: an option is never taken for the output path.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "synth_dump.h"

namespace {
const char* const kUsage =
    "usage: lq_synth_dump [--layers N] [--seqs S --seq-len L] [--kv-lora-rank R] [--rope D] [--heads H]\n"
    "                     [--nope N] [--v V] [--query-rows Q] OUT.h5\n"
    "Writes the tests' synthetic latentq-dump/1 file to OUT.h5: by default 4 layers, 3 sequences of 96, 64\n"
    "and 96 tokens, kv_lora_rank 16, qk_rope_head_dim 8, 2 heads, qk_nope_head_dim 4, v_head_dim 4, 6 query\n"
    "rows, attention data included (tests/experiments/synth_dump.h). The options change the shape, e.g.\n"
    "DeepSeek-V2-Lite's: --layers 27 --seqs 4 --seq-len 2048 --kv-lora-rank 512 --rope 64 --heads 16\n"
    "--nope 128 --v 128 --query-rows 256 (about 1.2 GB; the generator holds it in memory).\n"
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
  lqtest::SynthSpec s;
  s.layers = 4;
  s.seq_lens = {96, 64, 96};
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
      if (a == "--layers") s.layers = static_cast<int>(v);
      else if (a == "--seqs") seqs = v;
      else if (a == "--seq-len") seq_len = v;
      else if (a == "--kv-lora-rank") s.kv_lora_rank = v;
      else if (a == "--rope") s.qk_rope_head_dim = v;
      else if (a == "--heads") s.num_heads = v;
      else if (a == "--nope") s.qk_nope_head_dim = v;
      else if (a == "--v") s.v_head_dim = v;
      else if (a == "--query-rows") s.query_rows = v;
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
  if (seqs > 0) s.seq_lens.assign(static_cast<size_t>(seqs), seq_len);
  if (s.outlier_channel >= s.kv_lora_rank) s.outlier_channel = -1;
  try {
    const std::filesystem::path out = std::filesystem::absolute(out_arg);
    std::filesystem::create_directories(out.parent_path());
    lqtest::write_synth(out, lqtest::make_synth(s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lq_synth_dump: %s\n", e.what());
    return 2;
  } catch (const H5::Exception& e) {
    std::fprintf(stderr, "lq_synth_dump: HDF5: %s\n", e.getDetailMsg().c_str());
    return 2;
  }
  return 0;
}
