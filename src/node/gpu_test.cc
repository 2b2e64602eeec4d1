#include "ember/gpu.h"

#include <gtest/gtest.h>

namespace ember::gpu {
namespace {

using Strings = std::vector<std::string>;

TEST(VisibleDevicesTest, WithoutAPresetTheAddressesAreUsedAsTheyAre) {
  auto v = VisibleDevices({"2", "3"}, std::nullopt);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, (Strings{"2", "3"}));
  auto uuid = VisibleDevices({"GPU-5d0e2b9c"}, std::nullopt);
  ASSERT_TRUE(uuid.ok());
  EXPECT_EQ(*uuid, (Strings{"GPU-5d0e2b9c"}));
}

TEST(VisibleDevicesTest, APresetListingTheAddressesIsNarrowedToThem) {
  // spark-rapids style: the executor may use GPUs 2 and 3, and Spark assigned 3.
  auto v = VisibleDevices({"3"}, std::string_view("2, 3"));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, (Strings{"3"}));
}

TEST(VisibleDevicesTest, AddressesThatIndexThePresetAreRemapped) {
  // A discovery script that numbered the executor's own GPUs 0..n-1.
  auto v = VisibleDevices({"1", "0"}, std::string_view("6,7"));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, (Strings{"7", "6"}));
  auto uuids = VisibleDevices({"1"}, std::string_view("GPU-aaa,GPU-bbb"));
  ASSERT_TRUE(uuids.ok());
  EXPECT_EQ(*uuids, (Strings{"GPU-bbb"}));
}

TEST(VisibleDevicesTest, AnAddressListedInThePresetIsNotReadAsAnIndex) {
  // "0" is listed: it is GPU 0, not the preset's first entry ("1").
  auto v = VisibleDevices({"0"}, std::string_view("1,0"));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, (Strings{"0"}));
}

TEST(VisibleDevicesTest, APresetThatCannotHoldTheAddressesIsRefusedNamingBoth) {
  auto past = VisibleDevices({"2"}, std::string_view("6,7"));  // neither listed nor an index
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("GPU 2"), std::string::npos) << past.status().ToString();
  EXPECT_NE(past.status().message().find("CUDA_VISIBLE_DEVICES=\"6,7\""), std::string::npos);
  auto mixed = VisibleDevices({"6", "1"}, std::string_view("6,7"));
  EXPECT_FALSE(mixed.ok());
  for (const char* hidden : {"", "-1", "NoDevFiles", " , "}) {
    auto none = VisibleDevices({"0"}, std::string_view(hidden));
    ASSERT_FALSE(none.ok()) << hidden;
    EXPECT_NE(none.status().message().find("hides every GPU"), std::string::npos) << none.status().ToString();
  }
}

TEST(VisibleDevicesTest, NoOrRepeatedAddressesAreRefused) {
  EXPECT_FALSE(VisibleDevices({}, std::nullopt).ok());
  auto twice = VisibleDevices({"1", "1"}, std::nullopt);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("repeat"), std::string::npos);
}

TEST(SplitVisibleDevicesTest, TrimsAndDropsEmptyEntries) {
  EXPECT_EQ(SplitVisibleDevices(" 0, 1,,2 "), (Strings{"0", "1", "2"}));
  EXPECT_EQ(SplitVisibleDevices(""), Strings{});
}

TEST(CheckDistinctTest, DistinctGpusPass) {
  EXPECT_TRUE(CheckDistinct({{"worker:0", "10.0.0.1", {"0", "1"}},
                             {"worker:1", "10.0.0.1", {"2", "3"}},
                             {"worker:2", "10.0.0.2", {"0"}}})  // another host's GPU 0
                  .ok());
}

TEST(CheckDistinctTest, TwoNodesOnOneGpuOfAHostAreNamedWithTheGpu) {
  Status s = CheckDistinct({{"worker:0 (executor 0)", "10.0.0.1", {"0"}},
                            {"worker:1 (executor 1)", "10.0.0.1", {"1"}},
                            {"worker:2 (executor 2)", "10.0.0.1", {"1"}}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("worker:1 (executor 1) and worker:2 (executor 2)"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("GPU 1 of host 10.0.0.1"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("gpus_per_node=0.5"), std::string::npos);
}

TEST(CheckDistinctTest, AUuidNamesOneGpuWhateverHostReportsIt) {
  // Two addresses of one machine (two NICs): the UUID still matches.
  Status s = CheckDistinct({{"worker:0", "10.0.0.1", {"GPU-abc"}}, {"worker:1", "192.168.0.1", {"GPU-abc"}}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("GPU GPU-abc"), std::string::npos) << s.ToString();
}

TEST(UuidsTest, WithoutTheLibraryItIsNotFound) {
  auto u = Uuids({"0"}, NvmlOptions{"libember-no-such-nvml.so.1"});
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), StatusCode::kNotFound);
  EXPECT_NE(u.status().message().find("libember-no-such-nvml.so.1"), std::string::npos);
}

TEST(UuidsTest, IndicesBecomeUuidsAndUuidsStay) {
  auto u = Uuids({"2", "GPU-given", "0"}, NvmlOptions{EMBER_FAKE_NVML});
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(*u, (Strings{"GPU-fake-2", "GPU-given", "GPU-fake-0"}));
}

TEST(UuidsTest, AGpuTheHostLacksIsNamed) {
  auto u = Uuids({"1", "9"}, NvmlOptions{EMBER_FAKE_NVML});
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), StatusCode::kIOError);
  EXPECT_NE(u.status().message().find("no GPU 9"), std::string::npos) << u.status().ToString();
  EXPECT_NE(u.status().message().find("Invalid Argument"), std::string::npos);
  auto bad = Uuids({"x1"}, NvmlOptions{EMBER_FAKE_NVML});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("neither a GPU index nor a GPU UUID"), std::string::npos);
}

}  // namespace
}  // namespace ember::gpu
