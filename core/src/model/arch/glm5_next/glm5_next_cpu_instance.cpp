#include "model/arch/glm5_next/glm5_next_cpu_instance.h"

#include <omp.h>

#include <algorithm>
#include <string>

#include "builtin/inproc_collective.h"
#include "model/arch/glm5_next/glm5_next_sharded_source.h"
#include "model/tensor_parallel_instance.h"

namespace kiln::glm5_next {

Result<std::unique_ptr<Glm5NextCpuInstance>> Glm5NextCpuInstance::create_rank(const Glm5NextConfig& config,
                                                                             const BuildContext& ctx,
                                                                             TensorShard shard,
                                                                             Collective* context_group) {
  KILN_ASSIGN_OR_RETURN(Glm5NextWeights weights,
                        load_glm5_next_weights(config, *ctx.source, *ctx.format, ctx.load_mtp, ctx.precision, shard));
  auto model = std::make_unique<Glm5NextModel>(config, std::move(weights));
  model->set_precision(ctx.precision);
  model->set_threads(ctx.threads);
  if (shard.sharded()) model->set_collective(ctx.collective);
  if (context_group)
    model->set_decode_context(context_group, DecodeContextShard{context_group->rank(), context_group->world_size()});
  return std::unique_ptr<Glm5NextCpuInstance>(new Glm5NextCpuInstance(std::move(model), *ctx.device));
}

Result<std::unique_ptr<Glm5NextCpuInstance>> Glm5NextCpuInstance::create(const Glm5NextConfig& config,
                                                                         const BuildContext& ctx) {
  return create_rank(config, ctx, {}, nullptr);
}

Result<std::unique_ptr<ModelInstance>> Glm5NextCpuInstance::create_process_rank(const Glm5NextConfig& config,
                                                                              const BuildContext& ctx) {
  const int world = ctx.collective->world_size(), rank = ctx.collective->rank();
  KILN_RETURN_IF_ERROR(check_rank_process_group(ctx));
  KILN_RETURN_IF_ERROR(check_glm5_next_tensor_parallel_units(config, world));
  const int context = std::max(ctx.decode_context, 1);
  KILN_RETURN_IF_ERROR(check_decode_context_groups(world, context));
  if (context > 1 && (!ctx.context_collective || ctx.context_collective->world_size() != context))
    return internal_error("rank " + std::to_string(rank) + " has no decode-context group of " + std::to_string(context));
  // Drafting works here too: the state copies the engine makes in rank 0's pool (a KDA slot to its snapshot before
  // verification, back after a rejection) reach the other processes with the next step (RankLeaderInstance).
  auto instance = create_rank(config, ctx, TensorShard{rank, world}, context > 1 ? ctx.context_collective : nullptr);
  if (!instance.ok())
    return instance.status().with_context("tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(world));
  (*instance)->model().set_private_cache(true);
  return std::unique_ptr<ModelInstance>(std::move(instance).value());
}

Result<std::unique_ptr<ModelInstance>> Glm5NextCpuInstance::create_tensor_parallel(const Glm5NextConfig& config,
                                                                                 const BuildContext& ctx) {
  const int world = ctx.tensor_parallel;
  KILN_RETURN_IF_ERROR(check_glm5_next_tensor_parallel_units(config, world));
  const int context = std::max(ctx.decode_context, 1);
  KILN_ASSIGN_OR_RETURN(auto context_groups, TensorParallelInstance::make_context_groups(world, context));
  auto group = std::make_unique<builtin::InprocGroup>(world);
  // The machine's threads shared among the ranks, which run at once.
  const int threads = std::max(1, (ctx.threads > 0 ? ctx.threads : omp_get_max_threads()) / world);
  std::vector<TensorParallelInstance::Rank> ranks(world);
  for (int r = 0; r < world; ++r) {
    ranks[r].collective = group->endpoint(r);
    if (context > 1) ranks[r].context_collective = context_groups[r / context]->endpoint(r % context);
    BuildContext rank_ctx = ctx;
    rank_ctx.collective = ranks[r].collective.get();
    rank_ctx.threads = threads;
    // The weights view the checkpoint through the rank's own sharded source (Glm5NextWeights::sharded), so the rank
    // needs no source of its own beyond the checkpoint.
    auto instance = create_rank(config, rank_ctx, TensorShard{r, world}, ranks[r].context_collective.get());
    if (!instance.ok())
      return instance.status().with_context("tensor-parallel rank " + std::to_string(r) + " of " + std::to_string(world));
    ranks[r].instance = std::move(instance).value();
  }
  return std::unique_ptr<ModelInstance>(
      new TensorParallelInstance(std::move(group), std::move(context_groups), std::move(ranks)));
}

}  // namespace kiln::glm5_next
