// The dispatcher: the one loop that runs a schedule (ENGINE-NOTES.md, "Recommended structure").
// A step is issued through the handler of its kind (exec/engine/handlers.hpp) once every step it
// depends on has completed, lowest id first; collective steps go strictly in schedule order, the
// same on every rank. Memory needs no admission: the plan's offsets and the dependencies it added
// make every order safe, so nothing here can fail for memory or wait for room. Completions are
// polled, never waited on one at a time. The first error wins: nothing more is issued, what is in
// flight drains, and the error names the step.
// The watchdog decides "stuck" by progress, not silence: any completion on this rank, any piece of
// host work, any block the io engine moves and (ranks of one node) any completion on another rank
// counts; a run is stuck when none happened for EngineOptions::stall_timeout_s, or for 20 times the
// longest expected time of what is in flight (its bytes or FLOPs over the profile's rates) if that
// is longer, and then it says which steps it waited on, on which resource, for how long.
// Thread-safety: the engine's thread.
#pragma once

#include <string>
#include <vector>

#include "exec/engine/context.hpp"
#include "model/timeline.hpp"

namespace memwall::exec {

// What the loop needs of a schedule (EngineContext::tables), made once per schedule.
DispatchTables dispatch_tables(const Schedule& s, const HardwareProfile& p);

// Runs e.sched once. times[id]: when each step was issued and seen complete (seconds from the start).
Result<bool> run_schedule(EngineContext& e, const DispatchTables& t, std::vector<StepTime>& times);

}  // namespace memwall::exec
