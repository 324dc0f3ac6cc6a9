// latentq/provenance.h — what a cached step of `latentq study` read, so that it is reused only when all of it is
// unchanged, and the check that no command writes over a path it reads.
//
// A step's key (StepKey) lists everything the step read, by name: a digest of each input's content (every file of
// the checkpoint directory, the text, the dump, the config), each setting that changes its output (the flags), and
// the code that computed it (code_sha256). `latentq study` records the key beside or inside what the step wrote
// (DUMP.inputs, the results' root attributes, /e2e's attribute step_key) and redoes the step when the key it would
// have now differs, printing which inputs changed (key_changes).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace latentq {

/// A step's key: (name, value) pairs in a fixed order; a value is a digest (lower-case hex sha256) or a setting.
struct StepKey {
  std::vector<std::pair<std::string, std::string>> items;

  void add(std::string name, std::string value) { items.emplace_back(std::move(name), std::move(value)); }
  /// The value of `name`, or "" when absent.
  std::string get(std::string_view name) const;
  /// One JSON object, its members in order ({"name": "value", ...}).
  std::string json() const;
  /// Inverse of json(). Throws std::invalid_argument for text that is not a JSON object of strings.
  static StepKey parse_json(std::string_view text);
  bool operator==(const StepKey&) const = default;
};

/// What differs from `before` to `now`, one phrase per item, in `now`'s order then the removed ones:
/// "<name> changed (<old> -> <new>)", "<name> added", "<name> removed". Digests (64 hex digits) are shortened to
/// 12 characters. Empty when the keys are equal.
std::vector<std::string> key_changes(const StepKey& before, const StepKey& now);

/// One file of a checkpoint directory: its name (relative to the directory), the sha256 of its bytes, and the
/// stat fields that tell whether it may have changed since it was hashed (size, mtime and ctime in ns, inode,
/// device). ctime cannot be set by a user call (utime sets it to now), so a file whose stat fields are all equal
/// to those recorded when it was hashed has not been written since.
struct FileDigest {
  std::string name;
  std::string sha256;
  std::uintmax_t size = 0;
  std::int64_t mtime_ns = 0, ctime_ns = 0;
  std::uint64_t inode = 0, device = 0;
};

/// The regular files directly in `dir` (symlinks followed, as a Hugging Face snapshot directory links to its
/// blobs; names that begin with '.' and subdirectories left out: a checkpoint loader reads the files at the top
/// level), sorted by name, each with its sha256. A file whose stat fields equal those of the same name in `known`
/// keeps that digest; every other file is hashed (`progress`, when set, is called with (bytes hashed, bytes to
/// hash)). Throws std::runtime_error naming a file that cannot be read.
std::vector<FileDigest> directory_digests(const std::filesystem::path& dir, const std::vector<FileDigest>& known = {},
                                          const std::function<void(size_t, size_t)>& progress = {});

/// The sha256 of this process's executable (/proc/self/exe): the code of the study's cells. Computed once.
std::string executable_sha256();

/// The digest of the code a step runs: the sha256 of this process's executable (/proc/self/exe), of each file of
/// the Python package under `source_dir`/python/latentq (*.py, by relative path) and of the compiled module
/// (_core*.so) in `pymodule_dir` (either may be empty). Computed once per process and argument pair.
std::string code_sha256(const std::filesystem::path& source_dir, const std::filesystem::path& pymodule_dir);

/// A path a command reads or writes, with its role in words ("the results file RESULTS (input)", "--out").
struct PathRole {
  std::string role;
  std::filesystem::path path;
};

/// Throws std::invalid_argument, naming both roles and paths, when an output is one of the inputs: the same path
/// once resolved (symlinks, "..", relative paths), the same file through another name (a hard link or a symlink:
/// same device and inode), or a path inside an input that is a directory (a checkpoint directory). Empty paths
/// are ignored. Nothing is created or written.
void refuse_output_over_input(const std::vector<PathRole>& inputs, const std::vector<PathRole>& outputs);

}  // namespace latentq
