// latentq/util.h — small utilities of the study layer.
#pragma once

#include <filesystem>
#include <exception>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace latentq {

/// Lower-case hex SHA-256 of a file's bytes (OpenSSL EVP, read in 1 MiB chunks; `on_read`, when set, is called
/// with the byte count of each chunk). Throws std::runtime_error naming the path if it cannot be read.
std::string file_sha256(const std::filesystem::path& path, const std::function<void(size_t)>& on_read = {});

/// Current UTC time as ISO 8601, e.g. "2025-01-31T12:34:56Z".
std::string utc_now_iso8601();

/// latentq's version (CMake PROJECT_VERSION) and the git commit of the sources built (read at build time:
/// 12 hex digits, "-dirty" appended when a tracked file differed from that commit; "unknown" outside a git
/// checkout).
const char* version();
const char* git_commit();

/// The worker count for a `threads` option: itself when > 0, else std::thread::hardware_concurrency()
/// (at least 1).
int worker_threads(int threads);

/// Runs fn(i) for every i in [0, n) on `threads` workers (0 = std::thread::hardware_concurrency(),
/// at most n). An exception thrown by fn(i) is caught and stored in the returned vector at i (the
/// others still run). With `progress` set, the calling thread reports (done, n) about every 100 ms
/// while the workers run, then once with (n, n). Used by the study and the probe cells.
std::vector<std::exception_ptr> parallel_cells(size_t n, int threads, const std::function<void(size_t)>& fn,
                                               const std::function<void(size_t, size_t)>& progress = {});

/// Progress of a long step (called with (done, total) as it advances), written to `err` with counts, elapsed time
/// and an ETA (elapsed / done x left). `bar` (a terminal): a bar redrawn in place ("[####....] 12/100 cells, 3 s,
/// ETA 20 s"), a newline at the end. Otherwise one line "latentq: 12/100 cells, 3 s, ETA 20 s" at most every
/// LATENTQ_PROGRESS_INTERVAL seconds (default 10; 0: at every new count) and only for a new count, none at the
/// end (the step's own summary follows), so CI and Slurm logs show a long step alive. LATENTQ_PROGRESS=off: no
/// reporter (null). Throws std::invalid_argument for a LATENTQ_PROGRESS_INTERVAL that is not a number >= 0.
std::function<void(size_t, size_t)> progress_reporter(std::ostream& err, bool bar, std::string unit);

}  // namespace latentq
