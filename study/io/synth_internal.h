// synth_internal.h — what the MLA and DeepSeek-V4 synthetic dumps (study/io/synth.cpp, synth_v4.cpp) share: the
// seeded random streams, the chunked dataset writer, the token arrays and the write through a temporary file.
// Internal to study/io.
#pragma once

#include <H5Cpp.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/h5util.h"
#include "latentq/synth.h"

namespace latentq::synthio {

/// One independent stream per (seed, purpose, layer).
inline std::mt19937_64 stream(uint64_t seed, uint64_t purpose, uint64_t layer) {
  std::seed_seq q{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(purpose),
                  static_cast<uint32_t>(layer), static_cast<uint32_t>(layer >> 32)};
  return std::mt19937_64(q);
}

/// A chunked dataset `name` of `dims` with chunk `chunk` (clamped to dims), written whole from `data`; the groups
/// on its path are created. Throws std::runtime_error naming the dataset.
template <class T>
void put_chunked(hid_t file, const std::string& name, const std::vector<hsize_t>& dims, std::vector<hsize_t> chunk,
                 const T* data, hid_t file_type, hid_t mem_type) {
  for (size_t i = 0; i < dims.size(); ++i) chunk[i] = std::max<hsize_t>(1, std::min(chunk[i], dims[i]));
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  const hid_t ds = H5Dcreate2(file, name.c_str(), file_type, space, lcpl, dcpl, H5P_DEFAULT);
  herr_t st = ds < 0 ? -1 : H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  if (ds >= 0) H5Dclose(ds);
  H5Pclose(lcpl);
  H5Pclose(dcpl);
  H5Sclose(space);
  if (ds < 0 || st < 0) throw std::runtime_error(fmt::format("cannot write dataset {} ({})", name, h5::error_stack()));
}

/// Rows per ≈ 1 MiB chunk of a float32 dataset whose rows hold `row_elems` values.
inline hsize_t rows_per_mib(int64_t row_elems) {
  return static_cast<hsize_t>(std::max<int64_t>(1, (1 << 18) / row_elems));
}

/// The root datasets /tokens, /positions and /seq_offsets of `tok`, chunked by 65,536.
inline void put_token_arrays(hid_t file, const SynthTokens& tok) {
  const hsize_t T = tok.tokens.size(), S1 = tok.seq_offsets.size();
  put_chunked(file, "/tokens", {T}, {1 << 16}, tok.tokens.data(), H5T_STD_I32LE, H5T_NATIVE_INT32);
  put_chunked(file, "/positions", {T}, {1 << 16}, tok.positions.data(), H5T_STD_I32LE, H5T_NATIVE_INT32);
  put_chunked(file, "/seq_offsets", {S1}, {1 << 16}, tok.seq_offsets.data(), H5T_STD_I64LE, H5T_NATIVE_INT64);
}

/// Write an HDF5 file at `out_path` through `write` on a temporary file beside it (.NAME.PID.tmp), renamed over
/// `out_path` once `write` returns; on any exception the temporary file is removed and the exception rethrown, so
/// that nothing partial is left. Throws std::invalid_argument, naming the path, when its directory does not exist
/// or the path is a directory.
inline void write_via_temp(const std::filesystem::path& out_path, const std::function<void(H5::H5File&)>& write) {
  namespace fs = std::filesystem;
  const fs::path out = fs::absolute(out_path).lexically_normal();
  const fs::path dir = out.parent_path();
  if (!fs::is_directory(dir))
    throw std::invalid_argument(fmt::format("{}: the output directory {} does not exist", out.string(), dir.string()));
  if (fs::is_directory(out)) throw std::invalid_argument(fmt::format("{}: is a directory", out.string()));
  const fs::path tmp = dir / fmt::format(".{}.{}.tmp", out.filename().string(), ::getpid());
  h5::quiet();
  try {
    {
      H5::H5File f(tmp.string(), H5F_ACC_TRUNC);
      write(f);
    }
    fs::rename(tmp, out);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

}  // namespace latentq::synthio
