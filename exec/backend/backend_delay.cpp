#include "exec/backend/backend_delay.hpp"

#include <chrono>
#include <map>
#include <random>
#include <thread>

namespace memwall::exec {
namespace {

using Clock = std::chrono::steady_clock;

struct DelayCtx {
  std::unique_ptr<Backend> real;
  BackendOps ops{};
  std::mt19937_64 rng;
  std::uniform_real_distribution<double> delay;
  std::map<Event, Clock::time_point> ready_at;  // per event: when its last record may be reported done
  std::function<double(std::uint64_t)> delay_for, synchronize_delay_for;
  std::uint64_t records = 0, synchronizes = 0;
};

DelayCtx& D(void* ctx) { return *static_cast<DelayCtx*>(ctx); }

// Forwards one table entry to the real backend with the real context.
template <typename F>
struct Fwd;
template <typename R, typename... A>
struct Fwd<R (*)(void*, A...)> {
  template <R (*BackendOps::*M)(void*, A...)>
  static R call(void* ctx, A... a) {
    DelayCtx& d = D(ctx);
    return (d.real->ops().*M)(d.real->ctx(), a...);
  }
};

void event_record(void* ctx, Event e, Stream s) {
  DelayCtx& d = D(ctx);
  d.real->ops().event_record(d.real->ctx(), e, s);
  const double s_late = d.delay_for ? d.delay_for(d.records) : d.delay(d.rng);
  ++d.records;
  d.ready_at[e] = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s_late));
}

bool event_query(void* ctx, Event e) {
  DelayCtx& d = D(ctx);
  if (!d.real->ops().event_query(d.real->ctx(), e)) return false;
  auto it = d.ready_at.find(e);
  return it == d.ready_at.end() || Clock::now() >= it->second;
}

void event_synchronize(void* ctx, Event e) {
  DelayCtx& d = D(ctx);
  d.real->ops().event_synchronize(d.real->ctx(), e);
  if (auto it = d.ready_at.find(e); it != d.ready_at.end()) std::this_thread::sleep_until(it->second);
}

void synchronize(void* ctx) {
  DelayCtx& d = D(ctx);
  d.real->ops().synchronize(d.real->ctx());
  const double s_late = d.synchronize_delay_for(d.synchronizes++);
  if (s_late > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s_late));
}

void event_destroy(void* ctx, Event e) {
  DelayCtx& d = D(ctx);
  d.ready_at.erase(e);
  d.real->ops().event_destroy(d.real->ctx(), e);
}

void destroy(void* ctx) { delete static_cast<DelayCtx*>(ctx); }

}  // namespace

#define MEMWALL_FWD(name) \
  ops.name = real.name ? &Fwd<decltype(BackendOps::name)>::template call<&BackendOps::name> : nullptr

std::unique_ptr<Backend> delaying_backend(std::unique_ptr<Backend> inner, const DelayOptions& o) {
  auto* d = new DelayCtx;
  d->rng.seed(o.seed);
  d->delay = std::uniform_real_distribution<double>(0.0, o.max_delay_s);
  d->delay_for = o.delay_for;
  d->synchronize_delay_for = o.synchronize_delay_for;
  const BackendOps& real = inner->ops();
  BackendCaps caps = inner->caps();
  BackendOps& ops = d->ops;
  MEMWALL_FWD(alloc);
  MEMWALL_FWD(free);
  MEMWALL_FWD(used_bytes);
  MEMWALL_FWD(memset_zero);
  MEMWALL_FWD(stream_create);
  MEMWALL_FWD(copy_h2d_async);
  MEMWALL_FWD(copy_d2h_async);
  MEMWALL_FWD(copy_d2d_async);
  MEMWALL_FWD(event_create);
  MEMWALL_FWD(stream_wait_event);
  MEMWALL_FWD(synchronize);
  MEMWALL_FWD(host_register);
  MEMWALL_FWD(host_unregister);
  MEMWALL_FWD(gemm);
  MEMWALL_FWD(encoder_forward);
  MEMWALL_FWD(encoder_backward);
  MEMWALL_FWD(layernorm_forward);
  MEMWALL_FWD(layernorm_backward);
  MEMWALL_FWD(rmsnorm_forward);
  MEMWALL_FWD(rmsnorm_backward);
  MEMWALL_FWD(rope);
  MEMWALL_FWD(bias_forward);
  MEMWALL_FWD(bias_backward);
  MEMWALL_FWD(attention_scores_forward);
  MEMWALL_FWD(attention_context_forward);
  MEMWALL_FWD(attention_context_backward);
  MEMWALL_FWD(attention_scores_backward);
  MEMWALL_FWD(gelu_forward);
  MEMWALL_FWD(gelu_backward);
  MEMWALL_FWD(glu_forward);
  MEMWALL_FWD(glu_backward);
  MEMWALL_FWD(residual_forward);
  MEMWALL_FWD(accumulate);
  MEMWALL_FWD(crossentropy_forward);
  MEMWALL_FWD(crossentropy_backward);
  MEMWALL_FWD(to_fp32);
  MEMWALL_FWD(from_fp32);
  MEMWALL_FWD(accumulate_to);
  MEMWALL_FWD(adam_update);
  MEMWALL_FWD(sum_squares);
MEMWALL_FWD(sticky_error);
  MEMWALL_FWD(native_stream);
  MEMWALL_FWD(set_host_threads);
  ops.event_record = event_record;
  ops.event_query = event_query;
  ops.event_synchronize = event_synchronize;
  ops.event_destroy = event_destroy;
  if (o.synchronize_delay_for) ops.synchronize = synchronize;
  ops.destroy = destroy;
  d->real = std::move(inner);
  caps.name += "+delays";
  return std::make_unique<Backend>(&d->ops, d, caps);
}

}  // namespace memwall::exec
