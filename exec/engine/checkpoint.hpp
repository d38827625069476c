// Checkpoints that survive offload (DeepSpeed issues #2082, #7549): Engine::save and Engine::resume
// (exec/engine/engine.hpp says what they promise). Every rank writes its 16-bit parameters and
// fp32 optimizer states from wherever they live; rank 0 writes the manifest last through a
// temporary file, fsync and rename. Collectives: call on every rank. The engine's thread.
#pragma once

#include <string>

#include "exec/engine/context.hpp"

namespace memwall::exec {

Result<bool> save_checkpoint(EngineContext& e, const std::string& dir, const RunPosition& at);
Result<RunPosition> resume_checkpoint(EngineContext& e, const std::string& dir);

}  // namespace memwall::exec
