// Token: how the dispatcher learns that a step's work is done. A handler issues work and returns
// at once with a token of what it waits on: a backend event, an io handle, a host-lane task or
// collective operations, or nothing (done already). `then`, when set, is a second stage started
// once the first is done (a copy off the device, then host work on what it brought), so no
// handler blocks. Owned and polled by the dispatcher's thread only.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "exec/backend/backend.hpp"
#include "exec/engine/collectives.hpp"
#include "exec/engine/host_lane.hpp"
#include "exec/io/io_engine.hpp"
#include "model/result.hpp"

namespace memwall::exec {

struct Token {
  enum Kind { none, event, io, host, collective } kind = none;
  Event ev = nullptr;
  io::IoHandle handle;
  std::shared_ptr<HostTask> task;
  std::vector<std::unique_ptr<CollectiveOp>> ops;
  std::function<Result<Token>()> then;
};

}  // namespace memwall::exec
