// lq_synth_dump OUT.h5: writes the tests' synthetic latentq-dump/1 file (for the CLI ctest tests).
// `lq_synth_dump --help` prints the usage (exit 0); any other argument starting with '-' is an
// unknown option (exit 2, nothing written): an option is never taken for the output path.
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>

#include "synth_dump.h"

namespace {
const char* const kUsage =
    "usage: lq_synth_dump OUT.h5\n"
    "Writes the tests' synthetic latentq-dump/1 file to OUT.h5: 4 layers, 3 sequences of 96, 64 and 96\n"
    "tokens, kv_lora_rank 16, qk_rope_head_dim 8, attention data included (tests/experiments/synth_dump.h).\n"
    "Exit status: 0 written; 2 a usage error (nothing written) or a write error.\n";
}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc != 2 || argv[1][0] == '-' || argv[1][0] == '\0') {
    if (argc == 2 && argv[1][0] == '-')
      std::fprintf(stderr, "lq_synth_dump: unknown option '%s' (the output path may not start with '-'; use ./%s)\n",
                   argv[1], argv[1]);
    else
      std::fprintf(stderr, "lq_synth_dump: expected exactly one argument, the output path\n");
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    lqtest::SynthSpec s;
    s.layers = 4;
    s.seq_lens = {96, 64, 96};
    const std::filesystem::path out = std::filesystem::absolute(argv[1]);
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
