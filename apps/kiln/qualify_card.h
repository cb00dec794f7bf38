// The outputs of `kiln qualify`: the result card (markdown) and the evidence manifest (JSON) that names every
// artifact with its SHA-256, the recipe and checkpoint it qualified, the plugins, commit, GPU and date.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "qualify_decision.h"
#include "qualify_run.h"

namespace kiln::cli {

struct QualifyReport {
  std::string command, date;
  nlohmann::json gpu, plugins, capabilities;
  const QualifyRun* candidate = nullptr;
  const QualifyRun* incumbent = nullptr;  // null without --against
  Decision decision;
};

std::string result_card(const QualifyReport& r);

// The manifest; `artifacts` are the files written (the card among them), each hashed here.
nlohmann::json evidence_manifest(const QualifyReport& r, const std::vector<std::string>& artifacts);

}  // namespace kiln::cli
