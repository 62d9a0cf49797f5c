#include "util/shell_words.h"

#include <fmt/format.h>

namespace detaudit {

Status split_shell_words(std::string_view text, std::string_view what,
                         std::vector<std::string>* words) {
  words->clear();
  std::string word;
  bool in_word = false;  // '' is a word of its own
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words->push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (i + 1 < text.size()) word += text[++i];
      continue;
    }
    if (c != '\'' && c != '"') {
      word += c;
      continue;
    }
    const size_t open = i;
    for (++i; i < text.size() && text[i] != c; ++i) {
      if (c == '"' && text[i] == '\\' && i + 1 < text.size() &&
          std::string_view("\"\\$`").find(text[i + 1]) != std::string_view::npos)
        ++i;
      word += text[i];
    }
    if (i == text.size())
      return Status::error(
          fmt::format("{}: the quote at character {} is never closed: {}", what, open + 1, text));
  }
  if (in_word) words->push_back(std::move(word));
  return Status();
}

std::string sh_quote(std::string_view word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string sh_words(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + sh_quote(w);
  return out;
}

}  // namespace detaudit
