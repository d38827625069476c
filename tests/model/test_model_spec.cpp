// The model catalogue holds every configuration the paper names, under names that say which
// table they come from; model YAML files and shapes from flags are validated.
#include <gtest/gtest.h>

#include "model/analysis.hpp"
#include "model/model_spec.hpp"

namespace memwall {
namespace {

TEST(Catalogue, Fig2aRowsAreThePapers) {
  std::vector<ModelSpec> rows = fig2a_models();
  ASSERT_EQ(rows.size(), 5u);
  struct Row { int layers; long hidden_k; double params_t; };
  const Row paper[] = {{80, 10, 0.10}, {100, 20, 0.50}, {128, 25, 1.01}, {195, 64, 10.05}, {315, 160, 101.47}};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].layers, paper[i].layers);
    EXPECT_EQ(rows[i].hidden, paper[i].hidden_k * 1024);
    EXPECT_NEAR(params_eq1(rows[i].layers, rows[i].hidden) / 1e12, paper[i].params_t, 0.006) << rows[i].name;
  }
}

TEST(Catalogue, TablesDisagreeAndNamesSaySo) {
  EXPECT_EQ(find_catalogue_entry("fig2a-10T")->spec.layers, 195);
  EXPECT_EQ(find_catalogue_entry("table1-10T")->spec.layers, 200);
  CatalogueEntry t20 = *find_catalogue_entry("table1-20T");
  EXPECT_EQ(t20.spec.hidden, 88 * 1024);
  ASSERT_EQ(t20.setups.size(), 1u);
  EXPECT_DOUBLE_EQ(t20.setups[0].bsz, 1.25);
  EXPECT_EQ(t20.setups[0].mp, 8);
  EXPECT_EQ(t20.setups[0].gpus, 512);
  // Table 4-8 models are there with the paper's shapes.
  EXPECT_EQ(find_catalogue_entry("table4-1.4B")->spec.hidden, 1536);
  EXPECT_EQ(find_catalogue_entry("table4-1000B")->spec.heads, 256);
  EXPECT_EQ(find_catalogue_entry("table5-h64K")->spec.layers, 1);
  EXPECT_EQ(find_catalogue_entry("table6-8B")->setups.size(), 4u);
  EXPECT_EQ(find_catalogue_entry("table7-8B")->setups.back().bsz, 16);
  EXPECT_EQ(find_catalogue_entry("table8-h64K")->setups[0].optim_tier, "nvme");
  for (const auto& e : model_catalogue()) {
    EXPECT_EQ(e.spec.hidden % e.spec.heads, 0) << e.spec.name;
    if (e.published_params == 0) {
      EXPECT_EQ(e.spec.seq, 1024) << e.spec.name;  // the paper's (Sec. 4.2)
    }
  }
}

// Issue 31: an unknown name suggests the close ones, or points at `memwall models` (the whole
// catalogue is not dumped into one error line); names are case-insensitive.
TEST(Catalogue, UnknownNameSuggestsCloseOnes) {
  Result<ModelSpec> r = load_model("gpt-5");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("unknown model \"gpt-5\""), std::string::npos) << r.error();
  EXPECT_NE(r.error().find("`memwall models` lists"), std::string::npos) << r.error();
  EXPECT_EQ(r.error().find("fig2a-10T"), std::string::npos) << r.error();
  r = load_model("fig2a-10");
  EXPECT_NE(r.error().find("(did you mean "), std::string::npos) << r.error();
  EXPECT_NE(r.error().find("fig2a-10T"), std::string::npos) << r.error();
  r = load_model("FIG2A-10t");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->name, "fig2a-10T");
}

TEST(ModelSpecYaml, ParsesAndValidates) {
  Result<ModelSpec> ok = parse_model_spec("name: mini\nlayers: 2\nhidden: 1K\nheads: 8\nseq: 256\n", "mini.yaml");
  ASSERT_TRUE(ok.ok()) << ok.error();
  EXPECT_EQ(ok->hidden, 1024);
  EXPECT_EQ(ok->seq, 256);
  EXPECT_EQ(ok->vocab, 50257);

  Result<ModelSpec> bad = parse_model_spec("layers: 2\nhidden: 1000\nheads: 7\n", "m.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("m.yaml:3: heads: expected a divisor of hidden 1000"), std::string::npos) << bad.error();
  bad = parse_model_spec("layers: 2\nhidden: 1024\nheads: 8\nwidth: 3\n", "m.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("m.yaml:4: width: unknown field"), std::string::npos) << bad.error();
  bad = parse_model_spec("layers: 0\nhidden: 1024\nheads: 8\n", "m.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("m.yaml:1: layers: expected an integer from 1 to 100000, got \"0\""), std::string::npos) << bad.error();
}

TEST(ModelSpecFlags, ShapeIsChecked) {
  EXPECT_TRUE(model_from_shape(4, 4096, 32).ok());
  EXPECT_FALSE(model_from_shape(0, 4096, 32).ok());
  EXPECT_FALSE(model_from_shape(4, 4096, 0).ok());
  Result<ModelSpec> r = model_from_shape(4, 4096, 30);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--heads"), std::string::npos) << r.error();
}

}  // namespace
}  // namespace memwall
