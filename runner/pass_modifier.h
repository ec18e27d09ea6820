#pragma once
// The recipe modifier `graph_pass`: runs a registered graph pass (graph/pass_registry.h, `whittle
// inspect --passes`) on the model once, before training: an architecture rewrite of a loaded
// checkpoint, such as bireal_shortcuts before binarizing it.

namespace whittle::runner {

/// Registers the `graph_pass` modifier with register_modifier (called by register_builtin_modifiers).
/// Its settings: `pass` (the pass's name) and the pass's own options; the entry's targets and
/// ignore go to the pass as its targets and ignore. Its state is {"applied": bool}, so a resumed
/// run (whose saved graph holds the rewrite) does not run the pass again.
void register_graph_pass_modifier();

}  // namespace whittle::runner
