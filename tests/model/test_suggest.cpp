// "Did you mean": edit distance against hand-counted cases, and which names are offered.
#include <gtest/gtest.h>

#include "model/suggest.hpp"

namespace memwall {
namespace {

TEST(Suggest, EditDistanceCountsInsertionsDeletionsSubstitutionsAndSwaps) {
  EXPECT_EQ(edit_distance("model", "model"), 0);
  EXPECT_EQ(edit_distance("modle", "model"), 1);       // one swap of neighbours
  EXPECT_EQ(edit_distance("--stratgy", "--strategy"), 1);
  EXPECT_EQ(edit_distance("dgx-a10", "dgx-a100"), 1);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(edit_distance("ZeRO3", "zero3"), 0);       // case is ignored
}

TEST(Suggest, OffersOnlyCloseNamesClosestFirst) {
  const std::vector<std::string> flags = {"--model", "--layers", "--hidden", "--heads", "--seq", "--vocab", "--profile"};
  EXPECT_EQ(closest_names("--modle", flags), std::vector<std::string>{"--model"});
  EXPECT_EQ(closest_names("--head", flags), (std::vector<std::string>{"--heads"}));
  EXPECT_TRUE(closest_names("--frobnicate", flags).empty());
  EXPECT_EQ(did_you_mean("--frobnicate", flags), "");
  EXPECT_EQ(did_you_mean("--layer", flags), " (did you mean --layers?)");
  const std::vector<std::string> models = {"table1-10B", "table1-1T", "table1-10T", "table4-70B"};
  EXPECT_EQ(closest_names("table1-10", models).front(), "table1-10B");
  EXPECT_EQ(closest_names("TABLE1-10b", models).front(), "table1-10B");
  EXPECT_EQ(did_you_mean("tabel4-70B", models), " (did you mean table4-70B?)");
}

}  // namespace
}  // namespace memwall
