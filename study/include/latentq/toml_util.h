// latentq/toml_util.h — the one TOML entry point of the CLI's config readers (study config, probe
// sections, thresholds), so every syntax error reads the same.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <toml++/toml.h>

namespace latentq {

/// Parse TOML `text` read from `source` (a path or "<embedded default>").
/// Throws std::invalid_argument "<source>:<line>:<column>: TOML syntax error: <description>".
inline toml::table parse_toml(std::string_view text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw std::invalid_argument(
        fmt::format("{}:{}:{}: TOML syntax error: {}", source, b.line, b.column, e.description()));
  }
}

}  // namespace latentq
