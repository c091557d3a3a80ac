// check.h: the assertion helper of the standalone C++ test drivers (no test framework is
// installed on the build machines, and the drivers must build with only g++ and liburing).
//
// CHECK(cond) << "message" prints file:line, the condition and the message, then aborts, so a
// failing check fails the driver under every build (plain, ASan/UBSan, TSan) alike.
// CHECK_OK(status) does the same for a non-ok mtrains::Status, printing its message.
// Thread-safe: a failing check in any thread aborts the whole process.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/status.h"

namespace mtrains {
namespace testing {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* what) {
    out_ << file << ":" << line << ": CHECK failed: " << what << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::fprintf(stderr, "%s\n", out_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }
  template <typename T>
  CheckFailure& operator<<(const T& v) {
    out_ << v;
    return *this;
  }

 private:
  std::ostringstream out_;
};

inline const char* CodeName(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid-argument";
    case StatusCode::kOutOfRange: return "out-of-range";
    case StatusCode::kIoError: return "io-error";
    case StatusCode::kCorruption: return "corruption";
    case StatusCode::kClosed: return "closed";
    case StatusCode::kFormatError: return "format-error";
  }
  return "unknown";
}

// Runs one named test case, printing its name and wall time.
template <typename Fn>
void Run(const char* name, Fn fn) {
  std::fprintf(stderr, "[ RUN  ] %s\n", name);
  fn();
  std::fprintf(stderr, "[  OK  ] %s\n", name);
}

}  // namespace testing
}  // namespace mtrains

#define CHECK(cond) \
  if (cond) {       \
  } else            \
    ::mtrains::testing::CheckFailure(__FILE__, __LINE__, #cond)

#define CHECK_OK(expr)                                                                     \
  for (::mtrains::Status _check_st = (expr); !_check_st.ok(); _check_st = ::mtrains::Status()) \
  ::mtrains::testing::CheckFailure(__FILE__, __LINE__, #expr)                              \
      << "status " << ::mtrains::testing::CodeName(_check_st.code()) << ": "               \
      << _check_st.message() << " "

// Checks that `expr` yields a Status with code `want` (e.g. kCorruption).
#define CHECK_CODE(expr, want)                                                        \
  do {                                                                                \
    const ::mtrains::Status _st = (expr);                                             \
    CHECK(_st.code() == ::mtrains::StatusCode::want)                                  \
        << "got " << ::mtrains::testing::CodeName(_st.code()) << " (" << _st.message() \
        << "), want " #want;                                                          \
  } while (0)
