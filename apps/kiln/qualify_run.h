// One arm of `kiln qualify`: a recipe's server started (or a running one), the gates, the depth and concurrency
// sweeps and the capacity report, with everything it wrote named for the evidence manifest.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "qualify_gates.h"
#include "serve_sweeps.h"

namespace kiln::cli {

struct QualifyOptions {
  std::vector<std::string> sets;         // --set, passed to the server
  std::vector<std::string> plugin_dirs;  // --plugin-dir, passed to the server
  std::string base_url;                  // drive this running server instead of starting one
  std::string api_key_env;
  std::vector<std::string> gates;     // the gates to run (all by default)
  GateSettings gate;                  // needle_depths / tool_depth empty / 0: sized to the served context
  std::vector<int64_t> sweep_depths;  // empty: sized to the served context
  int64_t sweep_output_len = 64;
  std::vector<int64_t> concurrency;
  int64_t sweep_input_len = 128, requests_per_level = 0;
  int port = 0;  // of the server started here; 0 = any free one
  int startup_timeout_s = 900;
};

struct QualifyRun {
  std::string label, recipe_file;
  nlohmann::json recipe;      // its files with their SHA-256, and the resolved recipe's
  nlohmann::json checkpoint;  // checkpoint_revision()
  std::string model, capacity;
  std::string server;  // which server was measured: started here (and its log) or the running one at --base-url
  int64_t max_model_len = 0;
  std::vector<GateResult> gates;
  std::vector<DepthResult> depths;
  std::vector<LevelResult> levels;
  std::string error;               // what cut the run short ("" when it ran to the end)
  std::string server_exit;         // how the server it started ended
  std::vector<std::string> files;  // artifacts written: server log, transcript

  // Decode tok/s and TTFT of a lone request (the sweeps' lowest concurrency); 0 when not measured.
  double decode_tok_s() const;
  double ttft_s() const;
  int64_t gates_passed() const;
  int64_t gates_applicable() const;
  const GateResult* gate(const std::string& name) const;
};

// The names of the gates, in the order they run.
const std::vector<std::string>& gate_names();

// Runs one arm; files are named `<prefix><suffix>.…` ("" for the candidate, ".incumbent" for the incumbent).
// A recipe that does not load is an error message in `error` with no gate run.
QualifyRun run_qualification(const std::string& label, const std::string& recipe_file, const QualifyOptions& o,
                             const std::string& prefix, const std::string& suffix);

}  // namespace kiln::cli
