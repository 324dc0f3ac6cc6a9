// lq_synth_dump OUT.h5: writes the tests' synthetic latentq-dump/1 file (for the CLI ctest tests).
// `lq_synth_dump --help` prints the usage (exit 0); any other argument starting with '-' is an
// unknown option (exit 2, nothing written): an option is never taken for the output path.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <exception>
#include <algorithm>
#include <filesystem>

#include "synth_dump.h"

namespace {
const char* const kUsage =
    "usage: lq_synth_dump [--layers N] [--seq-lens L1,L2,...] [--kv-lora-rank R] [--rope D] [--heads H]\n"
    "                     [--nope D] [--v D] [--q-rows N] OUT.h5\n"
    "Writes the tests' synthetic latentq-dump/1 file to OUT.h5 (tests/experiments/synth_dump.h), attention data\n"
    "included. Defaults: 4 layers, 3 sequences of 96, 64 and 96 tokens, kv_lora_rank 16, qk_rope_head_dim 8,\n"
    "2 heads, qk_nope_head_dim 4, v_head_dim 4, 6 query rows. A DeepSeek-V2-Lite-shaped dump (benchmarks):\n"
    "  lq_synth_dump --layers 27 --seq-lens 2048,2048,2048,2048 --kv-lora-rank 512 --rope 64 --heads 16 \\\n"
    "                --nope 128 --v 128 --q-rows 256 v2lite.h5\n"
    "Exit status: 0 written; 2 a usage error (nothing written) or a write error.\n";

// A positive integer option value, or -1.
long long positive(const char* s) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  return (end && *end == '\0' && v > 0) ? v : -1;
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
  const char* out_arg = nullptr;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (a[0] == '-' && a[1] == '-' && i + 1 < argc) {
      const std::string name = a + 2;
      const char* val = argv[++i];
      bool ok = true;
      if (name == "seq-lens") {
        s.seq_lens.clear();
        std::string v = val;
        size_t p = 0;
        while (ok && p <= v.size()) {
          const size_t q = std::min(v.find(',', p), v.size());
          const long long n = positive(v.substr(p, q - p).c_str());
          ok = n > 0;
          s.seq_lens.push_back(n);
          p = q + 1;
        }
      } else {
        const long long n = positive(val);
        ok = n > 0;
        if (name == "layers") s.layers = static_cast<int>(n);
        else if (name == "kv-lora-rank") s.kv_lora_rank = n;
        else if (name == "rope") s.qk_rope_head_dim = n;
        else if (name == "heads") s.num_heads = n;
        else if (name == "nope") s.qk_nope_head_dim = n;
        else if (name == "v") s.v_head_dim = n;
        else if (name == "q-rows") s.query_rows = n;
        else {
          std::fprintf(stderr, "lq_synth_dump: unknown option '%s'\n", a);
          std::fputs(kUsage, stderr);
          return 2;
        }
      }
      if (!ok) {
        std::fprintf(stderr, "lq_synth_dump: option '%s': '%s' is not a positive integer (list)\n", a, val);
        return 2;
      }
      continue;
    }
    if (a[0] == '-' || a[0] == '\0' || out_arg) {
      if (a[0] == '-')
        std::fprintf(stderr, "lq_synth_dump: unknown option '%s' (the output path may not start with '-'; use ./%s)\n",
                     a, a);
      else
        std::fprintf(stderr, "lq_synth_dump: expected exactly one output path\n");
      std::fputs(kUsage, stderr);
      return 2;
    }
    out_arg = a;
  }
  if (!out_arg) {
    std::fprintf(stderr, "lq_synth_dump: expected exactly one argument, the output path\n");
    std::fputs(kUsage, stderr);
    return 2;
  }
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
