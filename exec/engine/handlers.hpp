// The engine's handlers: one per step kind, in one table (exec/engine/handlers.cpp), as the
// simulator has one per step kind (sim/replay.cpp). A handler issues the step's work on the
// backend's streams, the io engine, the collectives or the host lane and returns at once with a
// Token the dispatcher polls; none blocks. Each reads what a step means from its typed fields and
// the schedule's tables (units, chunks, buffers at the plan's offsets), never from a name.
// Thread-safety: the dispatcher's thread.
#pragma once

#include "exec/engine/context.hpp"
#include "exec/engine/token.hpp"

namespace memwall::exec {

// The handler of s.kind. An error names what failed (path and offset for I/O).
Result<Token> issue_step(EngineContext& e, const Step& s);

}  // namespace memwall::exec
