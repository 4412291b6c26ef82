/* SPDX-License-Identifier: MIT */
/* The C API's collectives from C, one process per rank under `lavaflow-launch -n N`: all_reduce,
 * all_gather, broadcast, reduce_scatter and barrier with known answers, and bad calls refused.
 * Prints "capi collectives rank R: OK" when everything held. */
#include <lavaflow/lavaflow.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LF_TEST_NAME "capi collectives"
#include "check.h"

enum { kCount = 10007 };
static const int64_t kTimeout = 30000000000LL;

int main(void) {
  lf_communicator* c = NULL;
  CHECK(lf_communicator_open_launched(&c));
  const uint32_t r = lf_communicator_rank(c), n = lf_communicator_size(c);

  float* x = malloc(sizeof(float) * kCount);
  float* y = malloc(sizeof(float) * kCount);
  for (int i = 0; i < kCount; ++i) x[i] = (float)(r + 1) * (float)(i % 13);
  CHECK(lf_all_reduce(c, x, y, kCount, LF_F32, LF_SUM, kTimeout));
  for (int i = 0; i < kCount; ++i) EXPECT(y[i] == (float)(n * (n + 1) / 2) * (float)(i % 13));
  CHECK(lf_all_reduce(c, x, x, kCount, LF_F32, LF_MAX, kTimeout)); /* in place */
  EXPECT(x[12] == (float)n * 12.0f);

  int64_t mine[3] = {r, r * 10, -(int64_t)r};
  int64_t* all = malloc(sizeof(int64_t) * 3 * n);
  CHECK(lf_all_gather(c, mine, all, 3, LF_I64, kTimeout));
  for (uint32_t k = 0; k < n; ++k) EXPECT(all[3 * k] == k && all[3 * k + 1] == 10 * k && all[3 * k + 2] == -(int64_t)k);

  int32_t word[4] = {0, 0, 0, 0};
  if (r == n - 1) word[0] = 42, word[3] = -7;
  CHECK(lf_broadcast(c, word, 4, n - 1, LF_I32, kTimeout));
  EXPECT(word[0] == 42 && word[3] == -7);

  int32_t* blocks = malloc(sizeof(int32_t) * 2 * n);
  for (uint32_t k = 0; k < 2 * n; ++k) blocks[k] = (int32_t)k;
  int32_t mine2[2] = {0, 0};
  CHECK(lf_reduce_scatter(c, blocks, mine2, 2, LF_I32, LF_SUM, kTimeout));
  EXPECT(mine2[0] == (int32_t)(2 * r * n) && mine2[1] == (int32_t)((2 * r + 1) * n));
  CHECK(lf_barrier(c, kTimeout));

  /* Bad calls are refused on every rank alike, before anything is sent. */
  EXPECT(lf_all_reduce(c, x, y, kCount, (lf_dtype)17, LF_SUM, kTimeout) == LF_INVALID_ARGUMENT);
  EXPECT(lf_all_reduce(c, x, y, kCount, LF_F32, (lf_reduce_op)-1, kTimeout) == LF_INVALID_ARGUMENT);
  EXPECT(lf_all_reduce(c, NULL, y, kCount, LF_F32, LF_SUM, kTimeout) == LF_INVALID_ARGUMENT);
  EXPECT(lf_all_gather(c, x, y, (size_t)-1, LF_F32, kTimeout) == LF_INVALID_ARGUMENT);
  EXPECT(lf_barrier(NULL, kTimeout) == LF_INVALID_ARGUMENT);
  CHECK(lf_barrier(c, kTimeout)); /* still in step */

  free(x);
  free(y);
  free(all);
  free(blocks);
  lf_communicator_destroy(c);
  printf("capi collectives rank %u: OK\n", r);
  return 0;
}
