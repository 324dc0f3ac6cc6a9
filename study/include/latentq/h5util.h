// latentq/h5util.h — small helpers over the HDF5 C++ API shared by the dump loader and the
// results reader/writer (internal to latentq_core; not a general HDF5 wrapper).
#pragma once

#include <H5Cpp.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace latentq::h5 {

/// Silence HDF5's automatic error-stack printing (errors become H5::Exception, which latentq turns
/// into messages). Idempotent.
void quiet();

/// The lock every HDF5 call of latentq holds (the HDF5 library here is not built thread-safe): dump
/// reads on worker threads (read_layer) and results writes on the calling thread take it.
std::recursive_mutex& library_mutex();

/// The innermost descriptions of the current HDF5 error stack, joined with "; " (empty if none).
/// Call it inside a catch(H5::Exception&) block, before any other HDF5 call.
std::string error_stack();

/// Why the values of `ds` cannot be read, before reading them, or "" when nothing is known to stop it: a filter in
/// its pipeline that this HDF5 library does not have (h5py's lzf, a plugin not installed; named with its id), or
/// an external raw file that does not exist or is shorter than the dataset declares (named, with the path HDF5
/// looks it up under: the dataset access prefix, else the working directory).
std::string storage_problem(const H5::DataSet& ds);

/// "int32", "int64", "uint8", "float32", "float64", "string", or the HDF5 class name.
std::string dtype_name(const H5::DataType& t);

/// Dims of a dataset's dataspace ([] for a scalar).
std::vector<hsize_t> dims_of(const H5::DataSet& ds);

/// "[2048, 128]"
std::string shape_str(const std::vector<hsize_t>& dims);

/// True if `name` (absolute path, every component checked) is a link in `file`.
bool exists(const H5::H5File& file, const std::string& name);

/// A variable-length UTF-8 string type (what h5py writes for Python str).
H5::StrType vlen_utf8();

/// Read a string attribute (fixed or variable length) holding one value. Throws H5::Exception on HDF5
/// errors and for an attribute of another number of values (an array, a null dataspace).
std::string read_string_attr(const H5::Attribute& a);

/// Write/overwrite a scalar attribute on `obj`.
void write_attr(H5::H5Object& obj, const std::string& name, const std::string& value);
void write_attr(H5::H5Object& obj, const std::string& name, int64_t value);
void write_attr(H5::H5Object& obj, const std::string& name, double value);
/// Write/overwrite a 1-D variable-length UTF-8 string array attribute (h5py: a numpy array of str).
void write_attr(H5::H5Object& obj, const std::string& name, const std::vector<std::string>& value);
/// Read a 1-D string array attribute (fixed or variable length).
std::vector<std::string> read_string_array_attr(const H5::Attribute& a);

}  // namespace latentq::h5
