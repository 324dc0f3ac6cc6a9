// fuzz_dump_seeds DIR: writes small latentq-dump/1 files, the seed corpus of fuzz_dump (make_corpus.py):
// the study tests' synthetic dump (tests/study/synth_dump.h, contiguous datasets) at a few small shapes,
// with and without the attention data, and two of `latentq synth`'s writer (latentq/synth.h, chunked).
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "latentq/synth.h"
#include "synth_dump.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fputs("usage: fuzz_dump_seeds DIR\n", stderr);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  try {
    std::filesystem::create_directories(dir);
    int n = 0;
    for (const bool attention : {true, false})
      for (const int layers : {1, 2}) {
        lqtest::SynthSpec s;
        s.layers = layers;
        s.seq_lens = {3, 2};
        s.kv_lora_rank = 4;
        s.qk_rope_head_dim = 2;
        s.num_heads = 1 + (layers == 2);
        s.qk_nope_head_dim = 2;
        s.v_head_dim = 2;
        s.query_rows = 2;
        s.attention = attention;
        s.outlier_channel = 1;
        lqtest::write_synth(dir / ("synth-" + std::to_string(n++) + ".h5"), lqtest::make_synth(s));
      }
    for (const int64_t Tq : {1, 3}) {
      latentq::SynthOptions o;
      o.shape = latentq::find_preset("tiny-mla");
      o.shape.num_layers = 1;
      o.shape.num_heads = 1;
      o.shape.kv_lora_rank = 4;
      o.shape.qk_rope_head_dim = 2;
      o.shape.qk_nope_head_dim = 2;
      o.shape.v_head_dim = 2;
      o.seqs = 1 + (Tq == 3);
      o.seq_len = 3;
      o.query_rows = Tq;
      latentq::write_synth_dump(dir / ("synth-" + std::to_string(n++) + ".h5"), o);
    }
    std::printf("%d dumps in %s\n", n, dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_dump_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
