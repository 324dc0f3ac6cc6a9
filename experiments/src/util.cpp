#include "latentq/util.h"

#include <openssl/evp.h>

#include <ctime>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

#ifndef LATENTQ_VERSION
#define LATENTQ_VERSION "unknown"
#endif
#ifndef LATENTQ_GIT_COMMIT
#define LATENTQ_GIT_COMMIT "unknown"
#endif

namespace latentq {

std::string file_sha256(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path.string() + ": cannot open for reading");
  const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL: cannot initialize SHA-256");
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n));
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

}  // namespace latentq
