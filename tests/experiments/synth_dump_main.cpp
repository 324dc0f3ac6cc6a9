// lq_synth_dump OUT.h5: writes the tests' synthetic latentq-dump/1 file (for the CLI ctest tests) with
// `latentq synth`'s generator and writer (latentq/synth.h), at a test shape no preset has.
// `lq_synth_dump --help` prints the usage (exit 0); any other argument starting with '-' is an
// unknown option (exit 2, nothing written): an option is never taken for the output path.
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>

#include <H5Cpp.h>

#include "latentq/synth.h"

namespace {
const char* const kUsage =
    "usage: lq_synth_dump OUT.h5\n"
    "Writes the tests' synthetic latentq-dump/1 file to OUT.h5: 4 layers, 3 sequences of 96, 64 and 96\n"
    "tokens, kv_lora_rank 16, qk_rope_head_dim 8, 2 heads, 6 query rows, seed 1234, with the generator of\n"
    "`latentq synth` (experiments/include/latentq/synth.h).\n"
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
    latentq::SynthOptions o;
    o.shape = {"test-mla", "test-mla", 4, 2, 16, 8, 4, 4, 10000.0, "interleaved", 0.125, 256, "tests/experiments"};
    o.seq_lens = {96, 64, 96};
    o.query_rows = 6;
    o.seed = 1234;
    const std::filesystem::path out = std::filesystem::absolute(argv[1]);
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
