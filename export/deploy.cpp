#include "export/deploy.h"

#include "fuse/qat_batchnorm.h"

namespace whittle {

Graph deploy_graph(const Graph& graph) {
  Graph g = graph.clone(/*clone_tensors=*/true);
  fuse::finalize_qat_batchnorm(g);
  g.infer_shapes();
  g.validate();
  return g;
}

}  // namespace whittle
