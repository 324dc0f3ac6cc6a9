// fuzz_util.h — what the harnesses of fuzz/ share: a property check that aborts (a finding, like a
// crash), the rule for the exceptions a parser may throw, and a per-process temporary file.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lqfuzz {

/// A property of the code under test failed: print it and abort (libFuzzer saves the input).
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz: property violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// The errors a parser of user input may throw: std::invalid_argument and std::runtime_error (the
/// project's rule: messages name the source). Anything else (std::out_of_range, std::bad_alloc,
/// std::logic_error, a library's own exception) escapes the harness and is reported as a crash.
/// `run` returns true when `f` returned, false when it threw one of those; `source` must then occur in
/// the message (empty: not checked).
template <class F>
bool run(F&& f, std::string_view source, const char* what) {
  try {
    f();
    return true;
  } catch (const std::invalid_argument& e) {
    if (!source.empty() && std::string_view(e.what()).find(source) == std::string_view::npos)
      fail(std::string(what) + ": std::invalid_argument without the source '" + std::string(source) + "': " + e.what());
  } catch (const std::runtime_error& e) {
    if (!source.empty() && std::string_view(e.what()).find(source) == std::string_view::npos)
      fail(std::string(what) + ": std::runtime_error without the source '" + std::string(source) + "': " + e.what());
  }
  return false;
}

/// A file of this process under /dev/shm (else the temporary directory), removed at exit.
inline const std::filesystem::path& temp_file(const char* stem) {
  static const std::filesystem::path p = [stem] {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::is_directory("/dev/shm", ec)
                                          ? std::filesystem::path("/dev/shm")
                                          : std::filesystem::temp_directory_path();
    return dir / (std::string(stem) + "-" + std::to_string(::getpid()) + ".h5");
  }();
  static const bool registered = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    });
    return true;
  }();
  (void)registered;
  return p;
}

/// Write `n` bytes to `path` (replacing it); aborts on an I/O error (the harness's, not a finding of the code).
inline void write_file(const std::filesystem::path& path, const uint8_t* data, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (n && std::fwrite(data, 1, n, f) != n) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
}

}  // namespace lqfuzz
