// SwapFile layout: one preallocated file per rank and state, shards at aligned offsets in order.
// (Round trips of the sizes through a SwapFile are in test_io_engine.cpp.)
#include "exec/io/swap_file.hpp"
#include "tests/exec/io/test_support.hpp"

namespace memwall::io {
namespace {

TEST(SwapFile, Names) {
  EXPECT_EQ(*swap_file_name(3, "optim32"), "rank0003.optim32.swap");
  EXPECT_EQ(*swap_file_name(12, "act_ckpt"), "rank0012.act_ckpt.swap");
  EXPECT_FALSE(swap_file_name(0, "optimizer").ok());
  EXPECT_FALSE(swap_file_name(-1, "grad16").ok());
}

TEST(SwapFile, ShardsAtAlignedOffsetsInOneFile) {
  testing::ScratchDir dir;
  auto e = make_engine(EngineKind::uring);
  ASSERT_TRUE(e.ok()) << e.error();
  const std::vector<std::uint64_t> sizes = {10, 4096, 4097, 0, 8192, 1};
  auto s = SwapFile::create(**e, dir.path(), 0, "param16", sizes);
  ASSERT_TRUE(s.ok()) << s.error();
  const std::vector<std::uint64_t> offsets = {0, 4096, 8192, 16384, 16384, 24576};
  ASSERT_EQ(s->shards(), sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(s->shard(i).offset, offsets[i]) << i;
    EXPECT_EQ(s->shard(i).bytes, sizes[i]);
    EXPECT_EQ(s->shard(i).slot_bytes, align_up(sizes[i]));
  }
  EXPECT_EQ(s->file_bytes(), 28672u);
  EXPECT_EQ(s->file().size_bytes(), 28672u);
  // Creating it again for a new run starts from a clean, right-sized file.
  auto again = SwapFile::create(**e, dir.path(), 0, "param16", std::vector<std::uint64_t>{1});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->file().size_bytes(), 4096u);
  auto bad = SwapFile::create(**e, dir.path() + "/missing", 0, "param16", sizes);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("/missing/rank0000.param16.swap"), std::string::npos) << bad.error();
}

}  // namespace
}  // namespace memwall::io
