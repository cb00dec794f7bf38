#include "model/mla_moe_cpu_instance.h"

#include <omp.h>

#include <algorithm>
#include <string>

#include "builtin/inproc_collective.h"
#include "model/sharded_weight_source.h"
#include "model/tensor_parallel_instance.h"

namespace kiln {

Result<std::unique_ptr<MlaMoeCpuInstance>> MlaMoeCpuInstance::create_rank(const ModelConfig& config,
                                                                         const BuildContext& ctx,
                                                                         const WeightSource& source, TensorShard shard,
                                                                         Collective* context_group) {
  KILN_ASSIGN_OR_RETURN(ModelWeights weights,
                        load_model_weights(config, source, *ctx.format, ctx.load_mtp, ctx.precision, shard));
  auto model = std::make_unique<MlaMoeModel>(config, std::move(weights));
  model->set_threads(ctx.threads);
  model->set_collective(ctx.collective);
  if (context_group)
    model->set_decode_context(context_group, DecodeContextShard{context_group->rank(), context_group->world_size()});
  return std::unique_ptr<MlaMoeCpuInstance>(new MlaMoeCpuInstance(std::move(model), *ctx.device));
}

Result<std::unique_ptr<MlaMoeCpuInstance>> MlaMoeCpuInstance::create(const ModelConfig& config, const BuildContext& ctx) {
  return create_rank(config, ctx, *ctx.source, {}, nullptr);
}

Result<std::unique_ptr<ModelInstance>> MlaMoeCpuInstance::create_process_rank(const ModelConfig& config,
                                                                            const BuildContext& ctx) {
  const int world = ctx.collective->world_size(), rank = ctx.collective->rank();
  const int context = std::max(ctx.decode_context, 1);
  KILN_RETURN_IF_ERROR(check_rank_process_group(ctx));
  KILN_RETURN_IF_ERROR(check_tensor_parallel_units(config, world));
  KILN_RETURN_IF_ERROR(check_decode_context_groups(world, context));
  if (context > 1 && (!ctx.context_collective || ctx.context_collective->world_size() != context))
    return internal_error("rank " + std::to_string(rank) + " has no decode-context group of " + std::to_string(context));
  const TensorShard shard{rank, world};
  auto source = std::make_unique<ShardedWeightSource>(*ctx.source, config, shard);
  auto instance = create_rank(config, ctx, *source, shard, context > 1 ? ctx.context_collective : nullptr);
  if (!instance.ok())
    return instance.status().with_context("tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(world));
  (*instance)->rank_source_ = std::move(source);
  (*instance)->model().set_private_cache(true);
  return std::unique_ptr<ModelInstance>(std::move(instance).value());
}

Result<std::unique_ptr<ModelInstance>> MlaMoeCpuInstance::create_tensor_parallel(const ModelConfig& config,
                                                                               const BuildContext& ctx) {
  const int world = ctx.tensor_parallel, context = std::max(ctx.decode_context, 1);
  KILN_RETURN_IF_ERROR(check_tensor_parallel_units(config, world));
  // Decode-context groups: ranks g·D .. g·D + D − 1 (none when D = 1).
  KILN_ASSIGN_OR_RETURN(auto context_groups, TensorParallelInstance::make_context_groups(world, context));
  auto group = std::make_unique<builtin::InprocGroup>(world);
  // The machine's threads shared among the ranks, which run at once.
  const int threads = std::max(1, (ctx.threads > 0 ? ctx.threads : omp_get_max_threads()) / world);
  std::vector<TensorParallelInstance::Rank> ranks(world);
  for (int r = 0; r < world; ++r) {
    const TensorShard shard{r, world};
    ranks[r].collective = group->endpoint(r);
    if (context > 1) ranks[r].context_collective = context_groups[r / context]->endpoint(r % context);
    ranks[r].source = std::make_unique<ShardedWeightSource>(*ctx.source, config, shard);
    BuildContext rank_ctx = ctx;
    rank_ctx.collective = ranks[r].collective.get();
    rank_ctx.threads = threads;
    auto instance = create_rank(config, rank_ctx, *ranks[r].source, shard, ranks[r].context_collective.get());
    if (!instance.ok())
      return instance.status().with_context("tensor-parallel rank " + std::to_string(r) + " of " + std::to_string(world));
    ranks[r].instance = std::move(instance).value();
  }
  return std::unique_ptr<ModelInstance>(
      new TensorParallelInstance(std::move(group), std::move(context_groups), std::move(ranks)));
}

}  // namespace kiln
