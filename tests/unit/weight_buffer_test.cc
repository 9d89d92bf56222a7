// WeightBuffer: large buffers start on a 2 MiB boundary (so every whole 2 MiB can be a huge page) and
// hold every element they were sized for; small ones are ordinary 64-byte-aligned memory; a request the
// system cannot map is an Error naming what the buffer was for.
#include <cstdint>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/weight_buffer.h"

namespace gemma4rt {
namespace {

uintptr_t address(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer); }

TEST(WeightBuffer, LargeBuffersStartOnAHugePageAndHoldEveryElement) {
  // An odd size, neither a whole page nor a whole huge page: the last element must still be writable.
  const size_t count = (size_t{5} << 20) / sizeof(float) + 1001;
  WeightBuffer<float> buffer;
  buffer.resize(count);
  ASSERT_EQ(buffer.size(), count);
  EXPECT_EQ(address(buffer.data()) % (size_t{2} << 20), 0u);
  for (size_t i = 0; i < count; ++i) buffer[i] = static_cast<float>(i);
  EXPECT_EQ(buffer[0], 0.0f);
  EXPECT_EQ(buffer[count - 1], static_cast<float>(count - 1));
  buffer.resize(7);  // replaced by a small buffer: the large mapping is given back
  EXPECT_EQ(buffer.size(), 7u);
  EXPECT_EQ(address(buffer.data()) % 64, 0u);
}

TEST(WeightBuffer, SmallAndEmptyBuffers) {
  WeightBuffer<uint16_t> buffer;
  EXPECT_EQ(buffer.size(), 0u);
  EXPECT_EQ(buffer.data(), nullptr);
  buffer.resize(1000);
  EXPECT_EQ(buffer.size(), 1000u);
  EXPECT_EQ(address(buffer.data()) % 64, 0u);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<uint16_t>(i);
  EXPECT_EQ(buffer[999], 999);
  buffer.resize(0);
  EXPECT_EQ(buffer.size(), 0u);
  EXPECT_EQ(buffer.data(), nullptr);
}

TEST(WeightBuffer, AnAllocationTheSystemRefusesNamesItsPurpose) {
  WeightBuffer<float> buffer;
  buffer.resize(16);
  try {
    buffer.resize(size_t{1} << 50, "the test's table");  // 4 PiB: more than any address space maps
    FAIL() << "a 4 PiB buffer was allocated";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("out of memory allocating 4503599627370496 bytes for the test's table"), std::string::npos)
        << message;
  }
  EXPECT_EQ(buffer.size(), 0u);  // the old contents were released first, and nothing replaced them
  EXPECT_EQ(buffer.data(), nullptr);
  // A count whose bytes do not fit in size_t is refused, not wrapped around to a small buffer.
  try {
    buffer.resize(std::numeric_limits<size_t>::max() / 2, "the test's table");
    FAIL() << "a buffer of 2^63 floats was allocated";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("elements of 4 bytes for the test's table: more than the address space"), std::string::npos) << message;
  }
  EXPECT_EQ(buffer.size(), 0u);
}

}  // namespace
}  // namespace gemma4rt
