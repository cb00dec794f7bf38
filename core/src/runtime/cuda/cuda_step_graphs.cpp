#include "runtime/cuda/cuda_model_step.h"

namespace kiln::cuda {

void StepGraphs::clear() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

cudaGraphExec_t StepGraphs::find(const GraphKey& key) const {
  for (const auto& [k, e] : graphs_)
    if (k == key) return e;
  return nullptr;
}

void StepGraphs::prepare_for(const GraphKey& key) {
  // A moved scratch buffer invalidates every captured step; a full table drops its oldest graph.
  if (!graphs_.empty() && graphs_.front().first.scratch != key.scratch) clear();
  if (graphs_.size() >= kMaxGraphs) {
    cudaGraphExecDestroy(graphs_.front().second);
    graphs_.erase(graphs_.begin());
  }
}

Result<cudaGraphExec_t> StepGraphs::finish_capture(const GraphKey& key, cudaStream_t stream, const Status& captured) {
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!captured.ok()) {
    if (graph) cudaGraphDestroy(graph);
    return captured;
  }
  KILN_RETURN_IF_ERROR(cuda_ok(end, "graph capture"));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  KILN_RETURN_IF_ERROR(cuda_ok(inst, "graph instantiate"));
  graphs_.emplace_back(key, exec);
  return exec;
}

}  // namespace kiln::cuda
