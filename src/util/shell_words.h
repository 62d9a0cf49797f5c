// Words of a command line as sh reads them, and back: `detaudit resume --stop-args "..."` is
// split as the user's shell would split it, and the commands it hands to sh are quoted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace detaudit {

// sh's word splitting without its expansions: blanks separate words; '...' keeps everything;
// "..." keeps all but \" \\ \$ \` (the backslash goes); a backslash outside quotes keeps the
// next character. An unclosed quote is an error naming `what` (the flag).
Status split_shell_words(std::string_view text, std::string_view what,
                         std::vector<std::string>* words);

// One word in single quotes, for sh -c.
std::string sh_quote(std::string_view word);
// The words, each quoted, separated by spaces.
std::string sh_words(const std::vector<std::string>& words);

}  // namespace detaudit
