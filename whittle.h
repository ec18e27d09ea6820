#pragma once
// whittle: model compression on LibTorch. The umbrella header: includes the whole public API.

#include "graph/error.h"
#include "graph/version.h"
#include "graph/graph.h"
#include "graph/graph_module.h"
#include "graph/op_registry.h"
#include "graph/serialize.h"
