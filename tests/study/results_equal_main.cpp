// lq_results_equal A.h5 B.h5 [--rtol GROUP=REL ...] [--atol GROUP=ABS ...] — strict comparison of two latentq results
// files for the batch tests and the GPU check: the same groups in the same order, each with the same columns (names,
// order, types) and the same rows in the same order, float64 bit for bit (latentq/batch.h
// table_difference); a group named by --rtol / --atol compares finite float64 values to
// |x − y| ≤ REL · max(|x|, |y|) + ABS instead (`--rtol attention_error=2e-2 --atol attention_error=1e-9`: the
// device attention against the CPU's, gpu_check.sh); GROUP `*` sets them for every group not named (a study whose
// dump was computed on another device: `--rtol '*=1e-2'`). --shape-only GROUP compares that group's columns (names,
// order, types) and row count only: for rank statistics (/score_vs_attention's Spearman over as few as 2 quantizers
// flips from 1 to -1 when two KLs near a tie swap in their last bits, as the GPU's cuBLAS attention does).
// --numbers-only GROUP compares that group's columns and row count, and its int64 and float64 columns (to the group's
// tolerance), not its strings: for a choice between near-ties (/decision's mixed plan named one of two mixes of the same
// bytes and a planner objective within the tolerance: 5.873e-05 on the CPU, 5.874e-05 on the GPU, one H200, commit
// 54a5c3e); a flip that changes bytes or KL still differs. Root and group attributes are not compared (they hold
// creation times, shard numbers, ...).
// Exit status: 0 equal ("equal: <groups>" on stdout), 1 different (the first difference on
// stderr), 2 unreadable file or usage error.
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "latentq/batch.h"
#include "latentq/results.h"

namespace {
// t's int64 and float64 columns, in order (their units and definitions kept).
latentq::ColumnTable without_strings(const latentq::ColumnTable& t) {
  latentq::ColumnTable out;
  for (size_t i = 0; i < t.num_columns(); ++i) {
    const auto& [name, col] = t.columns()[i];
    if (!std::holds_alternative<std::vector<std::string>>(col)) out.add_column(name, col, t.docs()[i]);
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace latentq;
  const char* usage =
      "usage: lq_results_equal A.h5 B.h5 [--rtol GROUP=REL ...] [--atol GROUP=ABS ...] [--shape-only GROUP ...]\n"
      "       [--numbers-only GROUP ...]\n";
  std::map<std::string, double> rtol, atol;
  std::set<std::string> shape_only, numbers_only;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--rtol" || a == "--atol") && i + 1 < argc) {
      const std::string v = argv[++i];
      const size_t eq = v.find('=');
      char* end = nullptr;
      const double r = eq == std::string::npos ? 0 : std::strtod(v.c_str() + eq + 1, &end);
      if (eq == std::string::npos || eq == 0 || !end || *end != '\0' || !(r > 0)) {
        std::cerr << "lq_results_equal: " << a << " " << v << ": expected GROUP=VALUE with VALUE > 0\n" << usage;
        return 2;
      }
      (a == "--rtol" ? rtol : atol)[v.substr(0, eq)] = r;
    } else if (a == "--shape-only" && i + 1 < argc) {
      shape_only.insert(argv[++i]);
    } else if (a == "--numbers-only" && i + 1 < argc) {
      numbers_only.insert(argv[++i]);
    } else if (a.rfind("--", 0) == 0) {
      std::cerr << "lq_results_equal: unknown option " << a << "\n" << usage;
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (files.size() != 2) {
    std::cerr << usage;
    return 2;
  }
  const char* fa = files[0].c_str();
  const char* fb = files[1].c_str();
  try {
    const std::vector<std::string> ga = list_tables(fa), gb = list_tables(fb);
    if (ga != gb) {
      std::cerr << fmt::format("groups differ: [{}] in {}, [{}] in {}\n", fmt::join(ga, ", "), fa, fmt::join(gb, ", "),
                               fb);
      return 1;
    }
    size_t rows = 0;
    for (const std::string& g : ga) {
      ColumnTable a = read_table(fa, g), b = read_table(fb, g);
      if (shape_only.count(g) || numbers_only.count(g)) {
        if (a.names() != b.names() || a.num_rows() != b.num_rows()) {
          std::cerr << fmt::format("/{} differs in shape between {} and {}: columns [{}] x {} rows vs [{}] x {} rows\n",
                                   g, fa, fb, fmt::join(a.names(), ", "), a.num_rows(), fmt::join(b.names(), ", "),
                                   b.num_rows());
          return 1;
        }
        if (shape_only.count(g)) {
          rows += a.num_rows();
          continue;
        }
        a = without_strings(a);
        b = without_strings(b);
      }
      const auto tol = [&g](const std::map<std::string, double>& m) {
        return m.count(g) ? m.at(g) : m.count("*") ? m.at("*") : 0.0;
      };
      const double r = tol(rtol), at = tol(atol);
      if (const std::string d = table_difference(a, b, r, at); !d.empty()) {
        std::cerr << fmt::format("/{} differs between {} and {}{}: {}\n", g, fa, fb,
                                 r > 0 || at > 0 ? fmt::format(" (rtol {}, atol {})", r, at) : "", d);
        return 1;
      }
      rows += a.num_rows();
    }
    std::cout << fmt::format("equal: {} groups ({}), {} rows\n", ga.size(), fmt::join(ga, ", "), rows);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "lq_results_equal: " << e.what() << "\n";
    return 2;
  }
}
