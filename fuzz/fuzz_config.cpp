// libFuzzer harness: study configs (parse_config, study/config; latentq/config.h), the probe sections
// ([svd], [cross_layer], [attention], [decode_order], [e2e]) included. The input is the config text.
// Properties: it returns or throws std::invalid_argument / std::runtime_error naming the config; a
// parsed config's quantizers have canonical names (a spec's parses back to it), and every mixed
// assignment answers spec_for()/transform_for() for a few layers or throws std::invalid_argument.
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "latentq/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace latentq;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string source = "fuzz-config.toml";
  StudyConfig c;
  if (!lqfuzz::run([&] { c = parse_config(text, source, "/fuzz/base"); }, source, "parse_config")) return 0;
  for (const Quantizer& q : c.all_quantizers()) {
    if (!q.is_mixed()) {
      if (TransformedSpec::parse(q.name).to_string() != q.name)
        lqfuzz::fail("a quantizer name that is not canonical: '" + q.name + "'");
      continue;
    }
    for (int layer : {0, 1, 2, 999})
      for (Target t : {Target::CKV, Target::KPE})
        (void)lqfuzz::run([&] { (void)q.spec_for(layer, t), (void)q.transform_for(layer, t); }, q.name, "spec_for");
  }
  if (!c.dump.empty() && !c.dump.is_absolute()) lqfuzz::fail("[input].dump not resolved: " + c.dump.string());
  if (!c.results.empty() && !c.results.is_absolute())
    lqfuzz::fail("[output].results not resolved: " + c.results.string());
  return 0;
}
