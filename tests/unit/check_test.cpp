// Contracts written as code (src/util/check.h): a broken one names itself and where, and stops
// the process. The unit tests are always built with them checked.
#include "util/check.h"

#include <gtest/gtest.h>

#include "stream/stream_writer.h"

#ifndef DETAUDIT_CHECKS
#error "the unit tests check the contracts: build them with DETAUDIT_CHECKS"
#endif

namespace detaudit {
namespace {

TEST(CheckDeathTest, ABrokenContractNamesItselfAndWhereThenAborts) {
  const int two = 2;
  DETAUDIT_DCHECK(two == 2, "two is two");  // a kept contract says nothing
  EXPECT_DEATH(DETAUDIT_DCHECK(two == 3, "two is three"),
               "detaudit: internal check failed at .*check_test.cpp:[0-9]+: two is three "
               "\\(two == 3\\)");
}

TEST(CheckDeathTest, AStreamBufferEnteredTwiceIsABug) {
  hooks::StreamBuffer buffer;
  ASSERT_TRUE(buffer.enter_write());
  EXPECT_DEATH(buffer.enter_write(), "entered by its one op thread, never twice");
  buffer.leave_write();
  EXPECT_TRUE(buffer.enter_write());  // entered again once left
  buffer.leave_write();
}

}  // namespace
}  // namespace detaudit
