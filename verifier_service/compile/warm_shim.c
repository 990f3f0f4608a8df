/* Preloaded into a warm nvcc front end (cudafe++ or cicc; front_ends.py).
 *
 * The first time the tool opens the file named by DICE_WARM_PATH for reading, it gets a stream
 * that reads the pipe DICE_WARM_FD instead: the server writes the shared header prefix into the
 * pipe at once and the candidate's own text later, so the tool parses the headers before the
 * candidate exists. The tool sees what it would see reading the file: fread on a stream returns
 * short only at end of file, ftell reports the bytes consumed, and the stat that follows the open
 * reports a regular file. Every later open of the path (diagnostics reread source lines) opens
 * the real file, which the server keeps at that path.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int state; /* 0: not opened yet; 1: the pipe is open, its stat not yet faked; 2: done */

typedef struct {
  int fd;
  off64_t pos;
} feed;

static ssize_t feed_read(void *cookie, char *buf, size_t size) {
  feed *f = cookie;
  ssize_t got;
  do {
    got = read(f->fd, buf, size);
  } while (got < 0 && errno == EINTR);
  if (got > 0) f->pos += got;
  return got;
}

static int feed_seek(void *cookie, off64_t *offset, int whence) {
  feed *f = cookie;
  if (whence == SEEK_CUR && *offset == 0) { /* ftell */
    *offset = f->pos;
    return 0;
  }
  errno = ESPIPE;
  return -1;
}

static int feed_close(void *cookie) {
  feed *f = cookie;
  close(f->fd);
  free(f);
  return 0;
}

static int is_warm_path(const char *path) {
  const char *warm = getenv("DICE_WARM_PATH");
  return warm != NULL && path != NULL && strcmp(path, warm) == 0;
}

typedef FILE *(*fopen_fn)(const char *, const char *);

static FILE *warm_open(const char *path, const char *mode, const char *real_name) {
  if (state == 0 && is_warm_path(path) && mode[0] == 'r' && getenv("DICE_WARM_FD") != NULL) {
    feed *f = calloc(1, sizeof *f);
    if (f == NULL) return NULL;
    f->fd = atoi(getenv("DICE_WARM_FD"));
    cookie_io_functions_t io = {feed_read, NULL, feed_seek, feed_close};
    FILE *stream = fopencookie(f, "r", io);
    if (stream == NULL) {
      free(f);
      return NULL;
    }
    state = 1;
    return stream;
  }
  fopen_fn real = (fopen_fn)dlsym(RTLD_NEXT, real_name);
  if (real == NULL) {
    errno = ENOSYS;
    return NULL;
  }
  return real(path, mode);
}

FILE *fopen(const char *path, const char *mode) { return warm_open(path, mode, "fopen"); }
FILE *fopen64(const char *path, const char *mode) { return warm_open(path, mode, "fopen64"); }

/* The stat right after the warm open: a regular file (the tools refuse anything else). */
static int fake_stat(const char *path, struct stat *buf) {
  if (state != 1 || !is_warm_path(path)) return 0;
  state = 2;
  memset(buf, 0, sizeof *buf);
  buf->st_mode = S_IFREG | 0644;
  buf->st_nlink = 1;
  buf->st_blksize = 4096;
  return 1;
}

/* glibc 2.33 and later keep __xstat only as a versioned compatibility symbol. */
static void *real_symbol(const char *name) {
  void *found = dlvsym(RTLD_NEXT, name, "GLIBC_2.2.5");
  return found != NULL ? found : dlsym(RTLD_NEXT, name);
}

int __xstat(int ver, const char *path, struct stat *buf) {
  if (fake_stat(path, buf)) return 0;
  int (*real)(int, const char *, struct stat *) = real_symbol("__xstat");
  if (real != NULL) return real(ver, path, buf);
  return stat(path, buf);
}

int __xstat64(int ver, const char *path, struct stat64 *buf) {
  if (fake_stat(path, (struct stat *)buf)) return 0;
  int (*real)(int, const char *, struct stat64 *) = real_symbol("__xstat64");
  if (real != NULL) return real(ver, path, buf);
  return stat64(path, buf);
}

int stat(const char *path, struct stat *buf) {
  if (fake_stat(path, buf)) return 0;
  int (*real)(const char *, struct stat *) = dlsym(RTLD_NEXT, "stat");
  if (real == NULL) {
    errno = ENOSYS;
    return -1;
  }
  return real(path, buf);
}

int stat64(const char *path, struct stat64 *buf) {
  if (fake_stat(path, (struct stat *)buf)) return 0;
  int (*real)(const char *, struct stat64 *) = dlsym(RTLD_NEXT, "stat64");
  if (real == NULL) {
    errno = ENOSYS;
    return -1;
  }
  return real(path, buf);
}
