// libFuzzer harness: the thresholds file of the regression gate (parse_thresholds,
// study/gate/regress.cpp; latentq/regress.h). The input is the file's text. Properties: it returns or
// throws std::invalid_argument / std::runtime_error naming the file; every threshold it returns has a
// location in that file, and its quantizer is empty (no filter), a glob, a name that is not a spec (with the
// reason in quantizer_error), or a canonical spec string.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "latentq/regress.h"
#include "latentq/transform.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string source = "fuzz-thresholds.toml";
  std::vector<latentq::Threshold> th;
  if (!lqfuzz::run([&] { th = latentq::parse_thresholds(text, source); }, source, "parse_thresholds")) return 0;
  for (const latentq::Threshold& t : th) {
    if (t.where.rfind(source, 0) != 0) lqfuzz::fail("a threshold without its location: '" + t.where + "'");
    if (t.quantizer.empty() || t.quantizer_glob) continue;
    if (!t.quantizer_error.empty()) {
      bool parses = true;
      try {
        (void)latentq::TransformedSpec::parse(t.quantizer);
      } catch (const std::invalid_argument&) {
        parses = false;
      }
      if (parses) lqfuzz::fail("a threshold's quantizer parses but has quantizer_error: '" + t.quantizer + "'");
      continue;
    }
    if (latentq::TransformedSpec::parse(t.quantizer).to_string() != t.quantizer)
      lqfuzz::fail("a threshold's quantizer is not canonical: '" + t.quantizer + "'");
  }
  return 0;
}
