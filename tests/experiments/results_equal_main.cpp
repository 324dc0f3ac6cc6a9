// lq_results_equal A.h5 B.h5 — strict comparison of two latentq results files for the batch tests:
// the same groups in the same order, each with the same columns (names, order, types) and the same
// rows in the same order, float64 bit for bit (latentq/batch.h table_difference). Root and group
// attributes are not compared (they hold creation times, shard numbers, ...).
// Exit status: 0 equal ("equal: <groups>" on stdout), 1 different (the first difference on
// stderr), 2 unreadable file or usage error.
#include <fmt/format.h>

#include <iostream>

#include "latentq/batch.h"
#include "latentq/results.h"

int main(int argc, char** argv) {
  using namespace latentq;
  if (argc != 3) {
    std::cerr << "usage: lq_results_equal A.h5 B.h5\n";
    return 2;
  }
  try {
    const std::vector<std::string> ga = list_tables(argv[1]), gb = list_tables(argv[2]);
    if (ga != gb) {
      std::cerr << fmt::format("groups differ: [{}] in {}, [{}] in {}\n", fmt::join(ga, ", "), argv[1], fmt::join(gb, ", "),
                               argv[2]);
      return 1;
    }
    size_t rows = 0;
    for (const std::string& g : ga) {
      const ColumnTable a = read_table(argv[1], g), b = read_table(argv[2], g);
      if (const std::string d = table_difference(a, b); !d.empty()) {
        std::cerr << fmt::format("/{} differs between {} and {}: {}\n", g, argv[1], argv[2], d);
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
