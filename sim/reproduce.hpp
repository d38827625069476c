// Reproduction of the paper's evaluation (seed 000, Sec. 8: Fig. 5a-c, 8, 9, 10) by simulation:
// one profile (dgx2, scaled with nodes), the catalogue's Table 1 and Table 6-8 configurations,
// no constants tuned per figure. Each row carries the paper's number where the paper states one
// and says when the simulation disagrees by more than 15 %. Runs each simulation in a child
// process (simulate_isolated). Not thread-safe (forks).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sim/replay.hpp"

namespace memwall::sim {

// One modelled effect's share of a row: the row simulated again with that effect alone turned off
// (reproduction_effects() names them, with their sources).
struct EffectMeasure {
  std::string name;    // "reserve"
  double without = 0;  // the row's value with the effect off (0: does not fit then)
};

struct ReproRow {
  std::string figure;     // "fig5a"
  std::string label;      // "10T on 512 GPUs"
  std::string model;      // catalogue name
  std::string strategy;   // placement actually simulated
  int gpus = 0;
  double bsz = 0;
  int mp = 1;
  std::string metric;     // "tflops_per_gpu", "backward_speedup", ...
  double value = 0;       // simulated
  double paper = 0;       // the paper's number, 0 when it gives none
  std::string paper_text; // what the paper says, in its words
  bool disagrees = false; // |value - paper| > 15 % of paper
  std::string note;
  // What the simulated iteration is made of (limited_by): its two busiest resources and the share
  // of the step after backward (the optimizer), from the replay: what moves the row.
  std::string limited_by;
  // The effects memwall models that this row's simulation includes, each measured by turning it off
  // alone: which of them move the row, and how far.
  std::vector<EffectMeasure> effects;
};

// The effects `reproduce` measures, in the order rows list them: {name, what it is and its source,
// what turning it off means}.
struct EffectInfo {
  const char* name;
  const char* label;   // a few words, for the tables
  const char* source;  // what it is, where it comes from, and what "off" simulates
};
const std::vector<EffectInfo>& reproduction_effects();

using Progress = std::function<void(const std::string&)>;

// fig5a, fig5b, fig5c, fig8, fig9, fig10, and seed004: 1-bit Adam and sparse attention (DeepSpeed's
// blog) as what-ifs on Table 1's 10B model.
std::vector<std::string> reproduction_figures();
Result<std::vector<ReproRow>> reproduce(const std::string& figure, const HardwareProfile& node,
                                        const Progress& progress = {});

std::string repro_csv(const std::vector<ReproRow>& rows);
std::string repro_markdown(const std::string& figure, const std::vector<ReproRow>& rows);

}  // namespace memwall::sim
