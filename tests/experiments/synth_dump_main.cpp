// lq_synth_dump OUT.h5: writes the tests' synthetic latentq-dump/1 file (for the CLI ctest tests).
#include <cstdio>
#include <exception>
#include <filesystem>

#include "synth_dump.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: lq_synth_dump OUT.h5\n");
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
