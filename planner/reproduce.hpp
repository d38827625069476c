// The paper's model-scale results (Sec. 8.5): the largest model a strategy trains (Fig. 6), the
// largest hidden size per tiling factor (Fig. 7), and their reproduction tables.
// Pure functions over value types.
#pragma once

#include <string>

#include "model/result.hpp"
#include "planner/search.hpp"

namespace memwall::planner {

// ---- Model scale (paper Sec. 8.5) ----

// Fig. 6: the largest model one strategy trains on a profile, grown as in Table 4: along Table 4's
// rows, layers grow at a row's hidden size (and heads) until the next row's parameter count, then
// that row takes over. bsz 1, mp 1 (4 for three_d, as in Table 4), act_ckpt gpu or cpu, ci and
// tiling free. Parameters are Eq. 1's. Also the largest of Table 4's own models that fits: the
// paper tried those six sizes (1.4B, 10B, 13B, 20B, 70B, 1T), so each bar of Fig. 6 is one of them.
struct MaxModel {
  std::string strategy;
  double max_params = 0;  // Eq. 1
  int layers = 0;
  long hidden = 0;
  int heads = 0;
  Evaluated plan;         // the configuration that fits it
  std::string stops_because;  // the binding limit of the next model on the path
  int table4_row = -1;        // the largest of Table 4's models that fits, its index (-1: none)
  std::string table4_label;   // Table 4's name for it ("20B")
  double table4_params = 0;   // its Eq. 1 count
  int table4_layers = 0;
  long table4_hidden = 0;
};
Result<MaxModel> max_model_size(const std::string& strategy, const HardwareProfile& p, const FitOptions& o = {});

// Fig. 7: the largest hidden size (multiple of 1024, 16 heads) of a one-layer model that fits with
// a given tiling factor, parameters partitioned (ZeRO-3 family), bsz 1.
struct MaxHidden {
  int tiling = 1;
  long hidden = 0;           // on a 1K grid
  long hidden_pow2 = 0;      // on the paper's grid (Table 5: 8K, 16K, 32K, 64K)
  Evaluated plan;
};
MaxHidden max_hidden_size(int tiling, const HardwareProfile& p, const FitOptions& o);

// The reproduction tables: CSV and Markdown, the paper's numbers beside memwall's.
struct Reproduction {
  std::string csv;
  std::string markdown;
};
Result<Reproduction> reproduce_fig6(const HardwareProfile& p);
Result<Reproduction> reproduce_fig7(const HardwareProfile& p, double max_alloc_bytes);

}  // namespace memwall::planner
