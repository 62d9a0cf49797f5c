#include "util/shell_words.h"

#include <gtest/gtest.h>

namespace detaudit {
namespace {

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> words;
  const Status s = split_shell_words(text, "--stop-args", &words);
  EXPECT_TRUE(s.ok()) << s.message();
  return words;
}

TEST(ShellWordsTest, BlanksSeparateWordsAndQuotesKeepThemWhole) {
  using W = std::vector<std::string>;
  EXPECT_EQ(split("  --stop-at 10\t--save ck.pt\n"), (W{"--stop-at", "10", "--save", "ck.pt"}));
  EXPECT_EQ(split("--save '/tmp/my run/ck.pt'"), (W{"--save", "/tmp/my run/ck.pt"}));
  EXPECT_EQ(split("--note \"a \\\"b\\\" \\$HOME\""), (W{"--note", "a \"b\" $HOME"}));
  EXPECT_EQ(split("--name=it\\'s a''b \"\""), (W{"--name=it's", "ab", ""}));
  EXPECT_EQ(split("'it'\\''s'"), (W{"it's"}));
  EXPECT_EQ(split(""), W{});
}

TEST(ShellWordsTest, AnUnclosedQuoteNamesTheFlagAndWhere) {
  std::vector<std::string> words;
  const Status s = split_shell_words("--save 'ck.pt", "--stop-args", &words);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ExitCode::kUsage);
  EXPECT_EQ(s.message(), "--stop-args: the quote at character 8 is never closed: --save 'ck.pt");
}

TEST(ShellWordsTest, QuotedWordsReadBackAsTheyWere) {
  const std::vector<std::string> words = {"python", "train.py", "--out", "my dir", "it's", ""};
  std::vector<std::string> back;
  ASSERT_TRUE(split_shell_words(sh_words(words), "words", &back).ok());
  EXPECT_EQ(back, words);
}

}  // namespace
}  // namespace detaudit
