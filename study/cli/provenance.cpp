// What a cached step read, and outputs that are inputs (latentq/provenance.h).
#include "latentq/provenance.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>

#include "latentq/batch.h"
#include "latentq/util.h"

namespace latentq {
namespace fs = std::filesystem;

std::string StepKey::get(std::string_view name) const {
  for (const auto& [k, v] : items)
    if (k == name) return v;
  return "";
}

std::string StepKey::json() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : items) j[k] = v;
  return j.dump();
}

StepKey StepKey::parse_json(std::string_view text) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(fmt::format("a step key that is not JSON ({})", e.what()));
  }
  if (!j.is_object()) throw std::invalid_argument("a step key that is not a JSON object");
  StepKey k;
  for (const auto& [name, v] : j.items()) {
    if (!v.is_string()) throw std::invalid_argument(fmt::format("step key member '{}' is not a string", name));
    k.add(name, v.get<std::string>());
  }
  return k;
}

namespace {
std::string shorten(const std::string& v) {
  const bool digest = v.size() == 64 && std::all_of(v.begin(), v.end(), [](char c) {
                        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                      });
  if (digest) return v.substr(0, 12);
  return v.empty() ? std::string("\"\"") : v;
}
}  // namespace

std::vector<std::string> key_changes(const StepKey& before, const StepKey& now) {
  std::map<std::string, std::string> was(before.items.begin(), before.items.end());
  std::vector<std::string> out;
  for (const auto& [k, v] : now.items) {
    const auto it = was.find(k);
    if (it == was.end())
      out.push_back(k + " added");
    else if (it->second != v)
      out.push_back(fmt::format("{} changed ({} -> {})", k, shorten(it->second), shorten(v)));
  }
  std::map<std::string, std::string> is(now.items.begin(), now.items.end());
  for (const auto& [k, v] : before.items)
    if (!is.count(k)) out.push_back(k + " removed");
  return out;
}

namespace {
FileDigest stat_of(const fs::path& p, const std::string& name) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) throw std::runtime_error(p.string() + ": cannot stat");
  FileDigest d;
  d.name = name;
  d.size = static_cast<std::uintmax_t>(st.st_size);
  d.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  d.ctime_ns = static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  d.inode = static_cast<std::uint64_t>(st.st_ino);
  d.device = static_cast<std::uint64_t>(st.st_dev);
  return d;
}

bool same_stat(const FileDigest& a, const FileDigest& b) {
  return a.size == b.size && a.mtime_ns == b.mtime_ns && a.ctime_ns == b.ctime_ns && a.inode == b.inode &&
         a.device == b.device;
}
}  // namespace

std::vector<FileDigest> directory_digests(const fs::path& dir, const std::vector<FileDigest>& known,
                                          const std::function<void(size_t, size_t)>& progress) {
  std::error_code ec;
  std::vector<FileDigest> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || !fs::is_regular_file(e.path(), ec)) continue;  // follows symlinks
    out.push_back(stat_of(e.path(), name));
  }
  if (ec) throw std::runtime_error(fmt::format("{}: cannot list the directory ({})", dir.string(), ec.message()));
  std::sort(out.begin(), out.end(), [](const FileDigest& a, const FileDigest& b) { return a.name < b.name; });
  size_t total = 0, done = 0;
  for (FileDigest& d : out) {
    const auto it =
        std::find_if(known.begin(), known.end(), [&](const FileDigest& k) { return k.name == d.name; });
    if (it != known.end() && !it->sha256.empty() && same_stat(*it, d))
      d.sha256 = it->sha256;
    else
      total += d.size;
  }
  for (FileDigest& d : out) {
    if (!d.sha256.empty()) continue;
    d.sha256 = file_sha256(dir / d.name, [&](size_t n) {
      done += n;
      if (progress) progress(done, total);
    });
  }
  return out;
}

std::string executable_sha256() {
  static const std::string sha = file_sha256("/proc/self/exe");
  return sha;
}

std::string code_sha256(const fs::path& source_dir, const fs::path& pymodule_dir) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::string> memo;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(source_dir.string(), pymodule_dir.string());
  if (const auto it = memo.find(key); it != memo.end()) return it->second;
  std::string lines = "exe " + executable_sha256() + "\n";
  std::error_code ec;
  const fs::path pkg = source_dir / "python" / "latentq";
  std::vector<std::string> files;
  if (!source_dir.empty() && fs::is_directory(pkg, ec))
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(pkg, ec))
      if (e.is_regular_file(ec) && e.path().extension() == ".py")
        files.push_back(fs::relative(e.path(), pkg, ec).generic_string());
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) lines += "py " + f + " " + file_sha256(pkg / f) + "\n";
  if (!pymodule_dir.empty() && fs::is_directory(pymodule_dir, ec)) {
    std::vector<std::string> mods;
    for (const fs::directory_entry& e : fs::directory_iterator(pymodule_dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("_core", 0) == 0 && n.size() > 3 && n.substr(n.size() - 3) == ".so") mods.push_back(n);
    }
    std::sort(mods.begin(), mods.end());
    for (const std::string& m : mods) lines += "so " + m + " " + file_sha256(pymodule_dir / m) + "\n";
  }
  return memo[key] = sha256_hex(lines);
}

namespace {
/// The identity of an existing path (device, inode), or nullopt.
bool same_file(const fs::path& a, const fs::path& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/// `p` absolute, with symlinks resolved for the part of it that exists.
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  const fs::path r = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal() : r;
}

bool inside(const fs::path& child, const fs::path& dir) {
  const fs::path rel = child.lexically_relative(dir);
  return !rel.empty() && rel.native().rfind("..", 0) != 0 && rel != ".";
}
}  // namespace

void refuse_output_over_input(const std::vector<PathRole>& inputs, const std::vector<PathRole>& outputs) {
  std::error_code ec;
  for (const PathRole& o : outputs) {
    if (o.path.empty()) continue;
    const fs::path ro = resolved(o.path);
    for (const PathRole& i : inputs) {
      if (i.path.empty()) continue;
      const fs::path ri = resolved(i.path);
      const bool same = ro == ri || same_file(o.path, i.path);
      const bool within = !same && fs::is_directory(ri, ec) && inside(ro, ri);
      if (same || within)
        throw std::invalid_argument(fmt::format(
            "{} {} {} {} {}: a command never writes over what it reads; choose another output", o.role,
            o.path.string(), same ? "is" : "lies inside", i.role, i.path.string()));
    }
  }
}

}  // namespace latentq
