// `kiln serve` / `kiln generate` with one process per rank: a recipe whose parallel.tensor = W > 1 over a
// process-based collective (transport.backend = "socket" on CPU ranks; "nccl" for GPU ranks once the CUDA runner
// shards) is run by W processes. This process starts the other ranks of its node itself — /proc/self/exe re-run
// with the same arguments and the torchrun-style variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
// (kiln/launch_env.h) — and becomes its node's first rank. One node by default (a free port on 127.0.0.1); several
// with --nnodes/--node-rank/--master-addr/--master-port (each node runs the same command with its --node-rank).
// A process started with RANK or WORLD_SIZE already set (torchrun, a job script, a child of this launcher) starts
// nothing: it is that rank.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "cli_common.h"
#include "kiln/status.h"
#include "model/model_loader.h"
#include "recipe/recipe.h"

namespace kiln::cli {

struct RankLaunchOptions {
  int nnodes = 1;
  int node_rank = 0;
  int nproc_per_node = 0;  // 0: parallel.tensor / nnodes
  std::string master_addr;  // default 127.0.0.1 (one node); required with --nnodes > 1
  int master_port = 0;      // default: a free port (one node); required with --nnodes > 1
};

void add_rank_launch_options(po::options_description& desc, RankLaunchOptions& opts);

// The rank processes this one started. While the ranks start (until started()), a watcher thread ends the launch
// as soon as one of them exits: it names the rank, its exit status and its last stderr lines, stops the other
// local ranks and exits this process with status 1 — rank 0 would otherwise wait the whole rendezvous timeout for
// a rank that is gone. Their stderr passes through this process, each line prefixed "[rank r] ". The destructor
// waits for them (they exit once rank 0's model is gone), and kills those that do not within a few seconds.
class LocalRanks {
 public:
  LocalRanks();
  LocalRanks(LocalRanks&& other) noexcept;
  LocalRanks& operator=(LocalRanks&&) = delete;
  ~LocalRanks();
  // Start-up is over (this rank's model loaded, or failed to on its own): a rank that exits from now on is the
  // running group's business (calls fail naming it), or the consequence of this process's own failure.
  void started();
  struct Watch;

 private:
  friend Result<LocalRanks> launch_local_ranks(const Recipe&, const RankLaunchOptions&, int, char**);
  std::unique_ptr<Watch> watch_;
};

// Before the model is loaded: starts this node's other ranks when the recipe runs ranks as processes and the
// environment names no rank, and sets this process's own rank variables. Nothing for a recipe of one rank, or one
// whose ranks are threads (`local`).
Result<LocalRanks> launch_local_ranks(const Recipe& recipe, const RankLaunchOptions& opts, int argc, char** argv);

// A rank other than 0: executes rank 0's calls until it stops; the exit code.
int run_follower_rank(LoadedModel& model);

// For the help texts.
extern const char* const kRankLaunchHelp;

}  // namespace kiln::cli
