#include <gtest/gtest.h>

#include "longhaul/v1/data_plane.grpc.pb.h"
#include "longhaul/v1/tensor.pb.h"

namespace longhaul {
namespace {

TEST(TensorFrameChunk, RoundTripsThroughTheWireFormat) {
  v1::TensorFrameChunk c;
  c.set_job_id(7);
  c.set_step(123);
  c.set_micro_batch(3);
  c.set_direction(v1::DIRECTION_BACKWARD);
  c.set_chunk_index(1);
  c.set_chunk_count(4);
  c.set_frame_bytes(1 << 20);
  c.set_data(std::string("\0\1\2\3", 4));
  const std::string wire = c.SerializeAsString();
  v1::TensorFrameChunk d;
  ASSERT_TRUE(d.ParseFromString(wire));
  EXPECT_EQ(d.step(), 123u);
  EXPECT_EQ(d.direction(), v1::DIRECTION_BACKWARD);
  EXPECT_EQ(d.data(), std::string("\0\1\2\3", 4));
}

TEST(StageLink, ServiceIsGenerated) {
  EXPECT_STREQ(v1::StageLink::service_full_name(), "longhaul.v1.StageLink");
}

}  // namespace
}  // namespace longhaul
