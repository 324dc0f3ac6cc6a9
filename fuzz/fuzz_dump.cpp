// libFuzzer harness: the dump loader (load_dump, read_layer; study/io/dump.cpp) on the input as an HDF5
// file (written to a file of this process under /dev/shm: the loader opens a path). The seeds are small
// valid dumps (make_corpus.py), so byte mutations reach the schema checks as well as the HDF5 parsing.
// fuzz_dump_schema.cpp builds the file from the input instead, for the schema checks.
//
// Properties: load_dump returns or throws std::invalid_argument / std::runtime_error starting with the
// path; the header-only load (data = false) followed by read_layer() of every layer succeeds exactly
// when the full load does, with the same values; a loaded dump has the documented shapes, and `inspect`
// formats it.
#include <cstdint>

#include "dump_check.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path& path = lqfuzz::temp_file("latentq-fuzz-dump");
  lqfuzz::write_file(path, data, size);
  lqfuzz::check_dump(path, {});
  return 0;
}
