/* SPDX-License-Identifier: MIT */
/* The C tests' two checks: a call that must return LF_OK, a condition that must hold. Either
 * prints "<program>: FAILED …" (what the CTest expressions look for) and returns 1 from the
 * enclosing function. */
#ifndef LAVAFLOW_TESTS_CAPI_CHECK_H
#define LAVAFLOW_TESTS_CAPI_CHECK_H
#include <lavaflow/lavaflow.h>
#include <stdio.h>

#define CHECK(call)                                                                                           \
  do {                                                                                                        \
    lf_status s_ = (call);                                                                                    \
    if (s_ != LF_OK) {                                                                                        \
      printf("%s: FAILED %s:%d: %s -> %s: %s\n", LF_TEST_NAME, __FILE__, __LINE__, #call, lf_status_name(s_), \
             lf_last_error());                                                                                \
      return 1;                                                                                               \
    }                                                                                                         \
  } while (0)
#define EXPECT(cond)                                                                      \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      printf("%s: FAILED %s:%d: expected %s\n", LF_TEST_NAME, __FILE__, __LINE__, #cond); \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)
#endif
