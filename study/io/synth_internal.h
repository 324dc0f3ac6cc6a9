// synth_internal.h — what the MLA and DeepSeek-V4 synthetic dumps (study/io/synth.cpp, synth_v4.cpp) share: the
// seeded random streams and the chunked dataset writer. Internal to study/io.
#pragma once

#include <H5Cpp.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "latentq/h5util.h"

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

}  // namespace latentq::synthio
