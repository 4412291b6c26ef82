/* SPDX-License-Identifier: MIT */
/* The C API from C: a producer process streams messages to a consumer process over a channel, a
 * buffer's fd crosses a fork and is imported there, the pool rents and reports, and bad calls
 * fail with a status and a message. Exit 0 when everything held, 1 otherwise. */
#include <lavaflow/lavaflow.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LF_TEST_NAME "capi example"
#include "check.h"

enum { kMessages = 200, kWords = 1024 };

static uint32_t word(uint64_t message, uint32_t i) { return (uint32_t)(message * 2654435761u) ^ i; }

static int consume(const char* name) {
  lf_consumer_options o = LF_CONSUMER_OPTIONS_INIT;
  lf_consumer* c = NULL;
  CHECK(lf_consumer_open(name, &o, &c));
  for (uint64_t m = 0; m < kMessages; ++m) {
    lf_message* msg = NULL;
    CHECK(lf_consumer_receive(c, LF_FOREVER, &msg));
    lf_message_info info;
    lf_message_info_get(msg, &info);
    EXPECT(info.sequence == m && info.user_tag == m + 7 && info.size == kWords * sizeof(uint32_t));
    EXPECT(lf_message_size(msg) == info.size);
    const uint32_t* w = (const uint32_t*)lf_message_data(msg);
    for (uint32_t i = 0; i < kWords; ++i) EXPECT(w[i] == word(m, i));
    lf_message_release(msg);
  }
  /* The producer closes after its last message: the next receive says so. */
  lf_message* none = NULL;
  EXPECT(lf_consumer_receive(c, 10000000000LL, &none) == LF_PEER_LOST && none == NULL);
  lf_consumer_destroy(c);
  return 0;
}

/* The consumer process is forked before the producer exists: a producer runs a service thread, and
 * a fork taken while another thread holds a lock (the allocator's, the sanitizer's thread registry)
 * leaves the child waiting on it forever. The child starts once the parent says the channel is
 * there, or exits if the parent closes the pipe without a channel. */
static int channel(void) {
  char name[64];
  snprintf(name, sizeof name, "capi-example-%d", (int)getpid());
  int go[2];
  EXPECT(pipe(go) == 0);
  const pid_t child = fork();
  EXPECT(child >= 0);
  if (child == 0) {
    close(go[1]);
    char ready = 0;
    const ssize_t n = read(go[0], &ready, 1);
    close(go[0]);
    _exit(n == 1 ? consume(name) : 2);
  }
  close(go[0]);
  lf_producer_options o = LF_PRODUCER_OPTIONS_INIT;
  o.slot_size = kWords * sizeof(uint32_t);
  o.transport = LF_TRANSPORT_SHM;
  lf_producer* p = NULL;
  const lf_status created = lf_producer_create(name, &o, &p);
  if (created == LF_OK) EXPECT(write(go[1], "g", 1) == 1);
  close(go[1]);
  if (created != LF_OK) {
    waitpid(child, NULL, 0);
    CHECK(created);
  }
  const char* reason = NULL;
  EXPECT(strcmp(lf_producer_route(p, &reason), "shm") == 0 && reason && *reason);
  CHECK(lf_producer_wait_for_consumers(p, 1, 10000000000LL));
  for (uint64_t m = 0; m < kMessages; ++m) {
    lf_loan* loan = NULL;
    CHECK(lf_producer_loan(p, LF_FOREVER, &loan));
    EXPECT(lf_loan_size(loan) == o.slot_size && lf_buffer_size(lf_loan_buffer(loan)) == o.slot_size);
    uint32_t* w = (uint32_t*)lf_loan_data(loan);
    for (uint32_t i = 0; i < kWords; ++i) w[i] = word(m, i);
    lf_message_info info;
    CHECK(lf_producer_publish(p, loan, kWords * sizeof(uint32_t), m + 7, &info));
    EXPECT(info.sequence == m);
  }
  CHECK(lf_producer_flush(p, 10000000000LL));
  lf_producer_destroy(p);
  int st = 0;
  EXPECT(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  return 0;
}

/* A buffer's fd crosses a fork; the child imports it, checks the parent's bytes and answers. */
static int buffer_across_fork(void) {
  lf_buffer* b = NULL;
  CHECK(lf_buffer_allocate(NULL, LF_CPU_SHARED, 4096, &b));
  EXPECT(lf_buffer_get_kind(b) == LF_CPU_SHARED && lf_buffer_size(b) == 4096);
  memset(lf_buffer_data(b), 0x5a, 4096);
  lf_descriptor d;
  int fd = -1;
  CHECK(lf_buffer_export(b, &d, &fd));
  const pid_t child = fork();
  if (child == 0) {
    lf_buffer* mine = NULL;
    if (lf_buffer_import(NULL, &d, fd, &mine) != LF_OK) _exit(2);
    unsigned char* bytes = (unsigned char*)lf_buffer_data(mine);
    for (int i = 0; i < 4096; ++i)
      if (bytes[i] != 0x5a) _exit(3);
    bytes[0] = 0xa5;
    lf_buffer_destroy(mine);
    _exit(0);
  }
  close(fd);
  int st = 0;
  EXPECT(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT(((unsigned char*)lf_buffer_data(b))[0] == 0xa5);
  lf_buffer_destroy(b);
  return 0;
}

/* A descriptor whose size claims more than the fd's object holds is refused, and the fd stays the
 * caller's. */
static int import_refuses_a_lie(void) {
  lf_buffer* b = NULL;
  CHECK(lf_buffer_allocate(NULL, LF_CPU_SHARED, 4096, &b));
  lf_buffer* big = NULL;
  CHECK(lf_buffer_allocate(NULL, LF_CPU_SHARED, 1 << 20, &big));
  lf_descriptor small_d, big_d;
  int small_fd = -1, big_fd = -1;
  CHECK(lf_buffer_export(b, &small_d, &small_fd));
  CHECK(lf_buffer_export(big, &big_d, &big_fd));
  lf_buffer* out = NULL;
  const lf_status s = lf_buffer_import(NULL, &big_d, small_fd, &out);
  EXPECT(s != LF_OK && out == NULL && strlen(lf_last_error()) > 0);
  EXPECT(close(small_fd) == 0);
  close(big_fd);
  lf_descriptor garbage;
  memset(&garbage, 0xff, sizeof garbage);
  EXPECT(lf_buffer_import(NULL, &garbage, 0, &out) == LF_MALFORMED);
  lf_buffer_destroy(b);
  lf_buffer_destroy(big);
  return 0;
}

static int pool(void) {
  lf_pool_options o = LF_POOL_OPTIONS_INIT;
  lf_pool* p = NULL;
  CHECK(lf_pool_create(NULL, &o, &p));
  lf_buffer* b = NULL;
  CHECK(lf_pool_rent(p, LF_CPU_SHARED, 1000, &b));
  EXPECT(lf_buffer_size(b) == 1000 && lf_buffer_data(b) != NULL);
  lf_buffer_destroy(b);
  size_t needed = 0;
  EXPECT(lf_pool_stats_json(p, NULL, 0, &needed) == LF_INVALID_ARGUMENT && needed > 1);
  char* json = (char*)malloc(needed);
  CHECK(lf_pool_stats_json(p, json, needed, NULL));
  EXPECT(strstr(json, "\"allocation.all.allocated\": 1") != NULL);
  free(json);
  lf_pool_destroy(p);
  return 0;
}

static int errors(void) {
  lf_producer* p = NULL;
  EXPECT(lf_producer_create("no spaces allowed", NULL, &p) == LF_INVALID_ARGUMENT && p == NULL);
  EXPECT(strstr(lf_last_error(), "name") != NULL);
  EXPECT(lf_producer_create(NULL, NULL, &p) == LF_INVALID_ARGUMENT);
  lf_producer_options small = LF_PRODUCER_OPTIONS_INIT;
  small.struct_size = 4;
  EXPECT(lf_producer_create("x", &small, &p) == LF_INVALID_ARGUMENT);
  lf_consumer_options co = LF_CONSUMER_OPTIONS_INIT;
  co.connect_timeout_ns = 0;
  lf_consumer* c = NULL;
  EXPECT(lf_consumer_open("capi-nobody-here", &co, &c) != LF_OK && c == NULL);
  lf_buffer* b = NULL;
  EXPECT(lf_buffer_allocate(NULL, (lf_buffer_kind)99, 16, &b) == LF_INVALID_ARGUMENT);
  EXPECT(lf_buffer_allocate(NULL, LF_GPU_DEVICE_LOCAL, 16, &b) == LF_INVALID_ARGUMENT);
  EXPECT(strcmp(lf_status_name(LF_PEER_LOST), "LF_PEER_LOST") == 0);
  EXPECT(strcmp(lf_status_name((lf_status)1000), "unknown") == 0);
  /* NULL handles are harmless. */
  lf_buffer_destroy(NULL);
  lf_producer_destroy(NULL);
  lf_message_release(NULL);
  return 0;
}

/* On a Vulkan device (lavapipe here): a GPU buffer exported and imported into the same context. */
static int gpu(void) {
  lf_context_options o = LF_CONTEXT_OPTIONS_INIT;
  lf_context* ctx = NULL;
  if (lf_context_create(&o, &ctx) != LF_OK) {
    printf("no Vulkan device (%s): GPU part skipped\n", lf_last_error());
    return 0;
  }
  printf("Vulkan device: %s\n", lf_context_device_name(ctx));
  lf_buffer* b = NULL;
  CHECK(lf_buffer_allocate(ctx, LF_GPU_HOST_VISIBLE, 1 << 16, &b));
  memset(lf_buffer_data(b), 0x42, 1 << 16);
  lf_descriptor d;
  int fd = -1;
  CHECK(lf_buffer_export(b, &d, &fd));
  lf_buffer* imported = NULL;
  CHECK(lf_buffer_import(ctx, &d, fd, &imported));
  EXPECT(lf_buffer_get_kind(imported) == LF_GPU_HOST_VISIBLE && lf_buffer_size(imported) == 1 << 16);
  EXPECT(((unsigned char*)lf_buffer_data(imported))[65535] == 0x42);
  lf_cuda* cuda = NULL;
  const lf_status s = lf_cuda_create(ctx, &cuda);
  printf("CUDA over this device: %s%s%s\n", lf_status_name(s), s == LF_OK ? "" : ": ",
         s == LF_OK ? "" : lf_last_error());
  lf_cuda_destroy(cuda);
  lf_buffer_destroy(imported);
  lf_buffer_destroy(b);
  lf_context_destroy(ctx);
  return 0;
}

int main(void) {
  int major = -1, minor = -1, patch = -1;
  lf_version(&major, &minor, &patch);
  EXPECT(major == LAVAFLOW_VERSION_MAJOR && minor == LAVAFLOW_VERSION_MINOR && patch == LAVAFLOW_VERSION_PATCH);
  EXPECT(lf_abi_version() == LAVAFLOW_C_ABI_VERSION);
  int failed = 0;
  failed |= errors();
  failed |= buffer_across_fork();
  failed |= import_refuses_a_lie();
  failed |= pool();
  failed |= channel();
  failed |= gpu();
  if (!failed) printf("C API example: all checks held (lavaflow %d.%d.%d)\n", major, minor, patch);
  return failed;
}
