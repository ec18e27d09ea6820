/* A fault-injection library for the kill-anywhere test (tests/reference/kill_resume_test.py),
 * loaded with LD_PRELOAD into `whittle run`: it kills the process with SIGKILL at the moment a
 * chosen file operation happens, so that the test reaches the instants a timer rarely hits (half of
 * a checkpoint's bytes written, the temporary complete but not renamed, ...).
 *
 *   WHITTLE_KILL_AT=<call>:<substring>:<n>
 *
 * <call> is write (write, writev, pwrite, pwrite64: the n-th one writes half of its bytes, then the
 * process is killed), fsync (fsync, fdatasync: killed before it), or rename (killed before it).
 * Only calls on a file whose path contains <substring> count (for write and fsync the path of the
 * descriptor, for rename the new name); the n-th (1-based) such call is the one.
 *
 *   WHITTLE_ENOSPC=<substring>
 *
 * makes every write to a file whose path contains <substring> fail with ENOSPC, as on a full disk
 * (the bad-input test, tests/reference/reliability_test.py). Without either variable the library
 * only passes calls on. Test code only: never linked into whittle. */
#include <errno.h>
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static char g_call[16];
static char g_substring[256];
static long g_target = -1;
static long g_count = 0;
static int g_parsed = 0;

static void parse(void) {
  if (g_parsed) return;
  g_parsed = 1;
  const char* spec = getenv("WHITTLE_KILL_AT");
  if (!spec) return;
  const char* a = strchr(spec, ':');
  const char* b = a ? strrchr(spec, ':') : NULL;
  if (!a || b == a || (size_t)(a - spec) >= sizeof g_call || (size_t)(b - a - 1) >= sizeof g_substring) {
    fprintf(stderr, "kill_shim: WHITTLE_KILL_AT='%s' is not <call>:<substring>:<n>\n", spec);
    abort();
  }
  memcpy(g_call, spec, (size_t)(a - spec));
  memcpy(g_substring, a + 1, (size_t)(b - a - 1));
  g_target = atol(b + 1);
}

/* True when the file open on `fd` has a path containing `substring`. */
static int fd_path_contains(int fd, const char* substring) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  return strstr(path, substring) != NULL;
}

/* True when this call is the one to die at. */
static int hit(const char* call, int fd, const char* name) {
  parse();
  if (g_target < 0 || strcmp(call, g_call) != 0) return 0;
  if (!(name ? strstr(name, g_substring) != NULL : fd_path_contains(fd, g_substring))) return 0;
  return ++g_count == g_target;
}

/* True when writes to `fd` are to fail as on a full disk. */
static int full_disk(int fd) {
  static const char* substring = NULL;
  static int parsed = 0;
  if (!parsed) {
    substring = getenv("WHITTLE_ENOSPC");
    parsed = 1;
  }
  if (!substring || fd <= 2 || !fd_path_contains(fd, substring)) return 0;
  errno = ENOSPC;
  return 1;
}

static void die(void) {
  kill(getpid(), SIGKILL);
  for (;;) pause();
}

#define REAL(name, ret, ...)                               \
  static ret (*real_##name)(__VA_ARGS__) = NULL;           \
  if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name);

ssize_t write(int fd, const void* buf, size_t count) {
  REAL(write, ssize_t, int, const void*, size_t)
  if (hit("write", fd, NULL)) {
    real_write(fd, buf, count / 2);
    die();
  }
  if (full_disk(fd)) return -1;
  return real_write(fd, buf, count);
}

ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  REAL(pwrite, ssize_t, int, const void*, size_t, off_t)
  if (hit("write", fd, NULL)) {
    real_pwrite(fd, buf, count / 2, offset);
    die();
  }
  if (full_disk(fd)) return -1;
  return real_pwrite(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void* buf, size_t count, off_t offset) {
  REAL(pwrite64, ssize_t, int, const void*, size_t, off_t)
  if (hit("write", fd, NULL)) {
    real_pwrite64(fd, buf, count / 2, offset);
    die();
  }
  if (full_disk(fd)) return -1;
  return real_pwrite64(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  REAL(writev, ssize_t, int, const struct iovec*, int)
  if (hit("write", fd, NULL)) {
    if (iovcnt > 0) real_writev(fd, iov, 1);
    die();
  }
  if (full_disk(fd)) return -1;
  return real_writev(fd, iov, iovcnt);
}

int fsync(int fd) {
  REAL(fsync, int, int)
  if (hit("fsync", fd, NULL)) die();
  return real_fsync(fd);
}

int fdatasync(int fd) {
  REAL(fdatasync, int, int)
  if (hit("fsync", fd, NULL)) die();
  return real_fdatasync(fd);
}

int rename(const char* from, const char* to) {
  REAL(rename, int, const char*, const char*)
  if (hit("rename", -1, to)) die();
  return real_rename(from, to);
}
