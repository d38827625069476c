// Unit parser and printer: binary and decimal prefixes stay distinct, bits are divided by 8,
// a missing unit is an error where one is required.
#include <gtest/gtest.h>

#include "model/units.hpp"

namespace memwall {
namespace {

double q(const char* text, Dimension d) {
  Result<double> r = parse_quantity(text, d);
  EXPECT_TRUE(r.ok()) << text << ": " << (r.ok() ? "" : r.error());
  return r.ok() ? *r : -1;
}

TEST(Units, SizesKeepBinaryAndDecimalApart) {
  EXPECT_DOUBLE_EQ(q("32 GiB", Dimension::bytes), 32.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(q("32 GB", Dimension::bytes), 32e9);
  EXPECT_DOUBLE_EQ(q("1.5 TB", Dimension::bytes), 1.5e12);
  EXPECT_DOUBLE_EQ(q("1.5 TiB", Dimension::bytes), 1.5 * 1099511627776.0);
  EXPECT_DOUBLE_EQ(q("512 B", Dimension::bytes), 512);
  EXPECT_DOUBLE_EQ(q("4KiB", Dimension::bytes), 4096);
  EXPECT_DOUBLE_EQ(q("  7 MiB ", Dimension::bytes), 7.0 * 1048576);
}

TEST(Units, BandwidthsInBytesAndBits) {
  EXPECT_DOUBLE_EQ(q("70 GB/s", Dimension::bandwidth), 70e9);
  EXPECT_DOUBLE_EQ(q("12 GiB/s", Dimension::bandwidth), 12.0 * 1073741824);
  EXPECT_DOUBLE_EQ(q("800 Gbps", Dimension::bandwidth), 100e9);
  EXPECT_DOUBLE_EQ(q("100 Gb/s", Dimension::bandwidth), 12.5e9);
  EXPECT_DOUBLE_EQ(q("400 Gbit/s", Dimension::bandwidth), 50e9);
  EXPECT_DOUBLE_EQ(q("1.5 TB/s", Dimension::bandwidth), 1.5e12);
}

TEST(Units, ComputeAndParameterRates) {
  EXPECT_DOUBLE_EQ(q("125 TFLOPS", Dimension::flops_rate), 125e12);
  EXPECT_DOUBLE_EQ(q("70 TFLOP/s", Dimension::flops_rate), 70e12);
  EXPECT_DOUBLE_EQ(q("62 Tflops", Dimension::flops_rate), 62e12);
  EXPECT_DOUBLE_EQ(q("7 PFLOPS", Dimension::flops_rate), 7e15);
  EXPECT_DOUBLE_EQ(q("1.5 G params/s", Dimension::param_rate), 1.5e9);
  EXPECT_DOUBLE_EQ(q("800M params/s", Dimension::param_rate), 800e6);
  // written as the profiles write it (calibrate printed 2048227566 params/s), and read back
  EXPECT_EQ(format_quantity(2048227566, Dimension::param_rate), "2.05 G params/s");
  EXPECT_DOUBLE_EQ(q(format_quantity(13.3e9, Dimension::param_rate).c_str(), Dimension::param_rate), 13.3e9);
}

TEST(Units, CountsTakeOptionalSuffix) {
  EXPECT_DOUBLE_EQ(q("4096", Dimension::count), 4096);
  EXPECT_DOUBLE_EQ(q("100M", Dimension::count), 100e6);
  EXPECT_DOUBLE_EQ(q("1.4B", Dimension::count), 1.4e9);
  EXPECT_DOUBLE_EQ(q("20T", Dimension::count), 20e12);
}

TEST(Units, MissingOrWrongUnitIsAnError) {
  for (auto [text, d] : {std::pair{"32", Dimension::bytes}, std::pair{"70", Dimension::bandwidth},
                         std::pair{"125", Dimension::flops_rate}, std::pair{"32 GB", Dimension::bandwidth},
                         std::pair{"70 GB/s", Dimension::bytes}, std::pair{"GiB", Dimension::bytes},
                         std::pair{"12 gib", Dimension::bytes}, std::pair{"", Dimension::count},
                         std::pair{"5 parsecs", Dimension::count}}) {
    Result<double> r = parse_quantity(text, d);
    EXPECT_FALSE(r.ok()) << "\"" << text << "\" parsed as " << (r.ok() ? *r : 0);
  }
  Result<double> r = parse_quantity("32", Dimension::bytes);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("unit is required"), std::string::npos) << r.error();
  EXPECT_NE(r.error().find("32 GiB"), std::string::npos) << r.error();
}

TEST(Units, HiddenSizesUseK1024) {
  EXPECT_EQ(*parse_hidden("64K"), 65536);
  EXPECT_EQ(*parse_hidden("160K"), 163840);
  EXPECT_EQ(*parse_hidden("4096"), 4096);
  EXPECT_FALSE(parse_hidden("64M").ok());
  EXPECT_FALSE(parse_hidden("-4").ok());
  EXPECT_FALSE(parse_hidden("0").ok());
}

TEST(Units, PrintingPicksThePrefix) {
  EXPECT_EQ(format_bytes(2013265920000.0), "1.83 TiB");
  EXPECT_EQ(format_bytes(64.0 * 1073741824), "64.0 GiB");
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_bandwidth(70e9), "70.0 GB/s");
  EXPECT_EQ(format_bandwidth(1.536e12), "1.54 TB/s");
  EXPECT_EQ(format_flops_rate(62e12), "62.0 TFLOPS");
  EXPECT_EQ(format_count(1.4e9), "1.40 B");
  EXPECT_EQ(format_g(1.25), "1.25");
}

TEST(Units, PrintedValuesParseBack) {
  for (double v : {1.0, 999.0, 1.5e3, 3.2e9, 7.7e12, 1.2e15}) {
    double back = q(format_bandwidth(v).c_str(), Dimension::bandwidth);
    EXPECT_NEAR(back, v, v * 5e-3) << format_bandwidth(v);
    back = q(format_bytes(v).c_str(), Dimension::bytes);
    EXPECT_NEAR(back, v, v * 5e-3) << format_bytes(v);
  }
}

// fig10's labels ("h2K, 5 layers") once split into two CSV columns and broke every reader.
TEST(Units, CsvFieldsQuoteOnlyWhatNeedsIt) {
  EXPECT_EQ(csv_field("zero3+act_ckpt=cpu"), "zero3+act_ckpt=cpu");
  EXPECT_EQ(csv_field("h2K, 5 layers"), "\"h2K, 5 layers\"");
  EXPECT_EQ(csv_field("say \"no\""), "\"say \"\"no\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(csv_field(""), "");
}

// quantile interpolates linearly between the sorted values, as numpy.percentile's default
// ("linear") does: np.percentile([5, 1, 4, 2, 3], [10, 50, 90]) = [1.4, 3, 4.6],
// np.percentile([1, 2, 3, 4], [0, 25, 50, 100]) = [1, 1.75, 2.5, 4]; median is its 0.5.
TEST(Units, QuantilesAsNumpyInterpolatesThem) {
  const std::vector<double> odd = {5, 1, 4, 2, 3}, even = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(quantile(odd, 0.1), 1.4);
  EXPECT_DOUBLE_EQ(quantile(odd, 0.5), 3);
  EXPECT_DOUBLE_EQ(quantile(odd, 0.9), 4.6);
  EXPECT_DOUBLE_EQ(quantile(even, 0), 1);
  EXPECT_DOUBLE_EQ(quantile(even, 0.25), 1.75);
  EXPECT_DOUBLE_EQ(quantile(even, 1), 4);
  EXPECT_DOUBLE_EQ(median(even), 2.5);
  EXPECT_DOUBLE_EQ(median(odd), 3);
  EXPECT_EQ(quantile({}, 0.5), 0);
  EXPECT_EQ(quantile({7}, 0.9), 7);
}

}  // namespace
}  // namespace memwall
