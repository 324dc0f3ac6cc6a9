// latentq/util.h — small utilities of the experiments layer.
#pragma once

#include <filesystem>
#include <string>

namespace latentq {

/// Lower-case hex SHA-256 of a file's bytes (OpenSSL EVP, read in 1 MiB chunks).
/// Throws std::runtime_error naming the path if it cannot be read.
std::string file_sha256(const std::filesystem::path& path);

/// Current UTC time as ISO 8601, e.g. "2025-01-31T12:34:56Z".
std::string utc_now_iso8601();

/// latentq's version (CMake PROJECT_VERSION) and the git commit it was configured at
/// (LATENTQ_GIT_COMMIT, "unknown" outside a git checkout).
const char* version();
const char* git_commit();

}  // namespace latentq
