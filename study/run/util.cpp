#include "latentq/util.h"

#include <openssl/evp.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <string>
#include <ostream>
#include <cstdlib>
#include <thread>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#ifndef LATENTQ_VERSION
#define LATENTQ_VERSION "unknown"
#endif
#if __has_include("latentq_git_commit.h")
#include "latentq_git_commit.h"  // generated at build time (cmake/git_commit.cmake)
#endif
#ifndef LATENTQ_GIT_COMMIT
#define LATENTQ_GIT_COMMIT "unknown"
#endif

namespace latentq {

std::string file_sha256(const std::filesystem::path& path, const std::function<void(size_t)>& on_read) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot open for reading");
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL: cannot initialize SHA-256");
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) {
      EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n));
      if (on_read) on_read(static_cast<size_t>(n));
    }
  }
  if (in.bad()) throw std::runtime_error(path.string() + ": read error");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

std::string utc_now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

const char* version() { return LATENTQ_VERSION; }
const char* git_commit() { return LATENTQ_GIT_COMMIT; }

int worker_threads(int threads) {
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::vector<std::exception_ptr> parallel_cells(size_t n, int threads, const std::function<void(size_t)>& fn,
                                               const std::function<void(size_t, size_t)>& progress) {
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0}, done{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      ++done;
    }
  };
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(worker_threads(threads)), std::max<size_t>(n, 1)));
  {
    std::vector<std::jthread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    if (progress) {
      // The calling thread reports progress while the pool works, then joins in.
      std::jthread last(work);
      while (done.load() < n) {
        progress(done.load(), n);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } else {
      work();
    }
  }
  if (progress) progress(n, n);
  return errors;
}

std::function<void(size_t, size_t)> progress_reporter(std::ostream& err, bool bar, std::string unit) {
  const char* mode = std::getenv("LATENTQ_PROGRESS");
  if (mode && std::string(mode) == "off") return nullptr;
  const char* iv = std::getenv("LATENTQ_PROGRESS_INTERVAL");
  double interval = 10;
  if (iv && *iv) {
    char* end = nullptr;
    interval = std::strtod(iv, &end);
    if (*end || !(interval >= 0))
      throw std::invalid_argument(fmt::format("LATENTQ_PROGRESS_INTERVAL='{}' is not a number of seconds >= 0", iv));
  }
  struct State {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now(), last = t0;
    size_t last_done = 0;
  };
  auto st = std::make_shared<State>();
  return [&err, bar, unit, interval, st](size_t done, size_t total) {
    const auto now = std::chrono::steady_clock::now();
    const double el = std::chrono::duration<double>(now - st->t0).count();
    const std::string eta =
        done > 0 && done < total
            ? fmt::format(", ETA {:.0f} s", el / static_cast<double>(done) * static_cast<double>(total - done))
            : std::string();
    if (bar) {
      const int w = 40;
      const int fill =
          total ? static_cast<int>(static_cast<double>(w) * static_cast<double>(done) / static_cast<double>(total)) : w;
      err << fmt::format("\r[{}{}] {}/{} {}, {:.0f} s{}   ", std::string(static_cast<size_t>(fill), '#'),
                         std::string(static_cast<size_t>(w - fill), '.'), done, total, unit, el, eta);
      if (done == total) err << "\n";
    } else {
      if (done == st->last_done || done == total || std::chrono::duration<double>(now - st->last).count() < interval)
        return;
      st->last = now;
      st->last_done = done;
      err << fmt::format("latentq: {}/{} {}, {:.0f} s{}\n", done, total, unit, el, eta);
    }
    err.flush();
  };
}

}  // namespace latentq
