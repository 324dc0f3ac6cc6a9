// Test helpers shared by the study suites: run the latentq CLI in-process and capture it.
#pragma once

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "latentq/cli.h"

/// EXPECT that `needle` occurs in `haystack`, printing the haystack otherwise.
#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "'" << (needle) << "' not in:\n" << (haystack)

namespace lqtest {

/// Exit code and captured stdout / stderr of one in-process CLI call.
struct Outcome {
  int rc;
  std::string out, err;
};

/// latentq::run_cli({"latentq", args...}) with stdout and stderr captured (progress_bar: as on a terminal).
inline Outcome cli(std::vector<std::string> args, bool progress_bar = false) {
  args.insert(args.begin(), "latentq");
  std::ostringstream out, err;
  const int rc = latentq::run_cli(args, out, err, progress_bar);
  return {rc, out.str(), err.str()};
}

}  // namespace lqtest
