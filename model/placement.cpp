#include "model/placement.hpp"

#include <utility>

#include "model/suggest.hpp"
#include "model/yaml_reader.hpp"

namespace memwall {

const char* to_string(Tier t) {
  switch (t) {
    case Tier::gpu: return "gpu";
    case Tier::cpu: return "cpu";
    case Tier::nvme: return "nvme";
  }
  return "?";
}

Result<Tier> parse_tier(std::string_view text) {
  if (text == "gpu") return Tier::gpu;
  if (text == "cpu") return Tier::cpu;
  if (text == "nvme") return Tier::nvme;
  return make_error("expected a tier (gpu, cpu or nvme), got \"" + std::string(text) + "\"");
}

const char* to_string(State s) {
  switch (s) {
    case State::param16: return "param16";
    case State::grad16: return "grad16";
    case State::optim32: return "optim32";
    case State::act_ckpt: return "act_ckpt";
  }
  return "?";
}

const StatePlacement& Placement::of(State s) const {
  switch (s) {
    case State::param16: return param16;
    case State::grad16: return grad16;
    case State::optim32: return optim32;
    case State::act_ckpt: return act_ckpt;
  }
  return param16;
}
StatePlacement& Placement::of(State s) { return const_cast<StatePlacement&>(std::as_const(*this).of(s)); }

namespace {

struct PresetRow {
  const char* name;
  StatePlacement param16, grad16, optim32;
  ParamFetch fetch;
  bool layer_major;
  Tier act_ckpt;
};

constexpr StatePlacement G{Tier::gpu, false}, Gp{Tier::gpu, true}, Cp{Tier::cpu, true}, Np{Tier::nvme, true},
    C{Tier::cpu, false};

// Table 2 (optimizer + gradient, parameters), then the baselines of Sec. 8 and seed 002. L2L keeps
// the activations it stashes between layers in host memory, which is why its GPU memory stays flat
// as layers are added.
constexpr PresetRow kPresets[] = {
    {"data_parallel", G, G, G, ParamFetch::allgather, false, Tier::gpu},
    {"zero2", G, Gp, Gp, ParamFetch::allgather, false, Tier::gpu},
    {"zero_offload", G, Cp, Cp, ParamFetch::broadcast, false, Tier::gpu},
    {"zero3", Gp, Gp, Gp, ParamFetch::allgather, false, Tier::gpu},
    {"zero_inf_cpu", Cp, Cp, Cp, ParamFetch::allgather, false, Tier::gpu},
    {"zero_inf_nvme", Np, Np, Np, ParamFetch::allgather, false, Tier::gpu},
    {"three_d", G, G, G, ParamFetch::allgather, false, Tier::gpu},
    {"l2l", C, C, C, ParamFetch::allgather, true, Tier::cpu},
};

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& p : kPresets) out.emplace_back(p.name);
  return out;
}

Result<Placement> preset(std::string_view name) {
  for (const auto& row : kPresets)
    if (lower_ascii(row.name) == lower_ascii(name)) {  // ZeRO3 is zero3
      Placement p;
      p.name = row.name;
      p.param16 = row.param16;
      p.grad16 = row.grad16;
      p.optim32 = row.optim32;
      p.act_ckpt = {row.act_ckpt, false};
      p.fetch = row.fetch;
      p.layer_major = row.layer_major;
      return p;
    }
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  std::string near = did_you_mean(name, preset_names());
  if (!near.empty()) near = near.substr(0, near.size() - 1) + "; ";
  else near = " (";
  return make_error("--strategy: unknown strategy \"" + std::string(name) + "\"" + near + "expected one of: " + names +
                    ", or a placement .yaml file)");
}

Result<Placement> validate(const Placement& p) {
  const std::string who = "placement " + p.name + ": ";
  if (p.act_ckpt.tier == Tier::nvme)
    return make_error(who + "act_ckpt on nvme is not supported: checkpoints go to gpu or cpu (paper Sec. 5.1.2)");

  // ZeRO's stages nest: partitioned parameters imply partitioned gradients imply partitioned
  // optimizer states (stage 3 > 2 > 1).
  if (p.param16.partitioned && !p.grad16.partitioned)
    return make_error(who + "param16 partitioned but grad16 not: gradients of partitioned parameters are reduce-scattered to their owners");
  if (p.grad16.partitioned && !p.optim32.partitioned)
    return make_error(who + "grad16 partitioned but optim32 not: the optimizer needs every gradient where it runs");
  // Gradients flow to the optimizer: they live on the GPU or where the optimizer runs.
  if (p.grad16.tier != Tier::gpu && p.grad16.tier != p.optim32.tier)
    return make_error(who + "grad16 on " + to_string(p.grad16.tier) + " but optim32 on " + to_string(p.optim32.tier) +
                      ": gradients stay on gpu or go where the optimizer states are");
  if (p.grad16.tier == Tier::nvme && !p.param16.partitioned)
    return make_error(who + "grad16 on nvme with param16 unpartitioned: NVMe gradient offload needs partitioned parameters (ZeRO-Infinity, Sec. 5.1)");
  if (!p.layer_major) {
    for (State s : {State::param16, State::grad16, State::optim32})
      if (p.of(s).tier != Tier::gpu && !p.of(s).partitioned)
        return make_error(who + to_string(s) + " on " + to_string(p.of(s).tier) +
                          " must be partitioned: every data-parallel rank would otherwise move a full copy");
  }
  return p;
}

Result<Placement> parse_placement(std::string_view yaml_text, const std::string& source) {
  try {
    YamlReader r(source, yaml_text);
    const YAML::Node& root = r.root();
    r.only_keys(root, "", {"preset", "param16", "grad16", "optim32", "act_ckpt", "fetch"});
    Placement p;
    std::string base = r.text_or(root, "", "preset", "");
    if (!base.empty()) {
      Result<Placement> b = preset(base);
      if (!b) r.fail(root["preset"], "preset", b.error());
      p = *b;
    }
    p.name = base.empty() ? "custom" : base + "+custom";
    for (State s : {State::param16, State::grad16, State::optim32, State::act_ckpt}) {
      YAML::Node n = root[to_string(s)];
      if (!n.IsDefined() || n.IsNull()) {
        if (base.empty()) r.fail(root, to_string(s), "missing field (no preset to take it from)");
        continue;
      }
      if (!n.IsMap()) r.fail(n, to_string(s), "expected {tier: gpu|cpu|nvme, partitioned: true|false}");
      r.only_keys(n, to_string(s), {"tier", "partitioned"});
      Result<Tier> t = parse_tier(r.text(n, to_string(s), "tier"));
      if (!t) r.fail(n["tier"], std::string(to_string(s)) + ".tier", t.error());
      p.of(s).tier = *t;
      p.of(s).partitioned = r.boolean_or(n, to_string(s), "partitioned", p.of(s).partitioned);
    }
    std::string fetch = r.text_or(root, "", "fetch", p.fetch == ParamFetch::broadcast ? "broadcast" : "allgather");
    if (fetch != "allgather" && fetch != "broadcast")
      r.fail(root["fetch"], "fetch", "expected allgather or broadcast, got \"" + fetch + "\"");
    p.fetch = fetch == "broadcast" ? ParamFetch::broadcast : ParamFetch::allgather;
    Result<Placement> ok = validate(p);
    if (!ok) throw InputError(source + ": " + ok.error());
    return p;
  } catch (const InputError& e) {
    return make_error(e.what());
  } catch (const YAML::Exception& e) {
    return make_error(source + ": " + e.what());
  }
}

Result<Placement> load_placement(const std::string& name_or_path, const std::vector<std::string>& overrides) {
  Placement p;
  if (name_or_path.ends_with(".yaml") || name_or_path.ends_with(".yml")) {
    Result<std::string> text = read_input_file(name_or_path, "placement");
    if (!text) return make_error(text.error());
    Result<Placement> r = parse_placement(*text, name_or_path);
    if (!r) return r;
    p = *r;
  } else {
    Result<Placement> r = preset(name_or_path);
    if (!r) return r;
    p = *r;
  }
  for (const std::string& o : overrides) {
    auto eq = o.find('=');
    std::string key = o.substr(0, eq);
    State s;
    if (key == "param16") s = State::param16;
    else if (key == "grad16") s = State::grad16;
    else if (key == "optim32") s = State::optim32;
    else if (key == "act_ckpt") s = State::act_ckpt;
    else return make_error("--place: expected STATE=TIER with STATE one of param16, grad16, optim32, act_ckpt, got \"" + o + "\"");
    if (eq == std::string::npos) return make_error("--place: expected STATE=TIER, got \"" + o + "\"");
    std::string tier = o.substr(eq + 1);
    // act_ckpt=TIER/p: each tensor-slicing rank keeps 1/mp of every checkpoint (partition_activations)
    const bool sliced = s == State::act_ckpt && tier.ends_with("/p");
    if (sliced) tier.resize(tier.size() - 2);
    Result<Tier> t = parse_tier(tier);
    if (!t) return make_error("--place " + key + ": " + t.error() + (s == State::act_ckpt ? " (or TIER/p: partitioned across mp)" : ""));
    p.of(s).tier = *t;
    if (s == State::act_ckpt) p.act_ckpt.partitioned = sliced;
    if (s != State::act_ckpt && *t != Tier::gpu && !p.layer_major) p.of(s).partitioned = true;
    p.name += "+" + o;
  }
  return validate(p);
}

}  // namespace memwall
