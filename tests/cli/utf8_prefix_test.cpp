// utf8_prefix: cards and manifests cut model text to a length; a cut inside a character would leave bytes that are
// not UTF-8, which nlohmann::json refuses to serialise (kiln qualify aborted on such an answer on 2026-12-02).
#include "utf8_prefix.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace kiln::cli {
namespace {

TEST(Utf8Prefix, NeverSplitsACharacter) {
  const std::string s = "ab\xC3\xA9" "c\xE2\x82\xAC" "d\xF0\x9F\x98\x80";  // a b é c € d 😀
  for (size_t max = 0; max <= s.size() + 1; ++max) {
    const std::string p = utf8_prefix(s, max);
    EXPECT_LE(p.size(), max);
    EXPECT_EQ(s.compare(0, p.size(), p), 0);
    EXPECT_NO_THROW((void)nlohmann::json(p).dump()) << "max " << max;
  }
  EXPECT_EQ(utf8_prefix(s, 3), "ab");                 // inside é
  EXPECT_EQ(utf8_prefix(s, 4), "ab\xC3\xA9");         // after é
  EXPECT_EQ(utf8_prefix(s, 7), "ab\xC3\xA9" "c");     // inside €
  EXPECT_EQ(utf8_prefix(s, 100), s);
}

}  // namespace
}  // namespace kiln::cli
