/* dice_confine: runs one compile-stage command confined (compile/confine.py builds and drives it).
 *
 *   dice_confine [-N] [-w DIR]... [-r PATH]... [-d DEV]... [-m BYTES] [-t SECONDS] [-f BYTES]
 *                [-p N] [-o N] [-n NICE] [-s BPF] [-g CGROUP]... [-R FD] -- COMMAND [ARG]...
 *
 * The wrapper is the parent of COMMAND and stays outside its confinement; the command's process
 * (and everything it starts, which inherits all of it) gets, in this order:
 *   -N  new network, PID, IPC and UTS namespaces (inside a new user namespace when not root): no
 *       interface but a loopback that is down, no other process addressable by pid, host name
 *       "dice-compile";
 *   -g  membership of a cgroup (its cgroup.procs file), joined first, before the namespaces;
 *   rlimits: -m data segment (RLIMIT_DATA), -t CPU seconds, -f file size, -p processes (RLIMIT_NPROC,
 *       which the kernel does not enforce for root), -o open files; no core files;
 *   an empty capability bounding set (root then gains no capability when it execs) and empty
 *       capability sets, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG;
 *   Landlock: read and execute beneath each -r path, read and write beneath each -w folder (the
 *       first is also TMPDIR and HOME), read and write of each -d device node, nothing else; no TCP
 *       (ABI >= 4); signals and abstract unix sockets scoped to the sandbox (ABI >= 6);
 *   -s  a seccomp filter (raw BPF as libseccomp exports it; confine.py builds it with pyseccomp);
 *   -n  a nice increment.
 * Any layer asked for that cannot be applied stops the wrapper before COMMAND runs: the report
 * says "setup" and why. The namespace's first process applies the layers and runs COMMAND as its
 * own child (a PID namespace's init ignores SIGXCPU and SIGXFSZ), then tells the wrapper, on a
 * pipe COMMAND never holds (close-on-exec), either why COMMAND did not start or how it ended, so
 * nothing COMMAND prints can pass for a setup failure.
 *
 * -R FD: at the end the wrapper writes one line to FD:
 *   "exit CODE MAXRSS_KB USER_S SYS_S"  or  "signal SIG MAXRSS_KB USER_S SYS_S"  or  "setup WHY"
 * with the resource use of COMMAND's whole process tree (RUSAGE_CHILDREN: MAXRSS is the largest
 * single process, the times are summed). It then exits as COMMAND did (the same code, or the
 * same signal).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#define MAX_PATHS 64
#define SYS_LL_CREATE 444
#define SYS_LL_ADD 445
#define SYS_LL_RESTRICT 446
#define LL_EXECUTE 1ULL
#define LL_WRITE_FILE 2ULL
#define LL_READ_FILE 4ULL
#define LL_READ_DIR 8ULL
#define LL_MAKE_CHAR (1ULL << 6)
#define LL_MAKE_BLOCK (1ULL << 11)
#define LL_TRUNCATE (1ULL << 14)
#define LL_IOCTL_DEV (1ULL << 15)
#define LL_FILE_ONLY (LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV)

struct ll_ruleset_attr {
  uint64_t handled_fs, handled_net, scoped;
};
struct ll_path_beneath {
  uint64_t allowed;
  int32_t parent_fd;
} __attribute__((packed));

static const char *rw[MAX_PATHS], *ro[MAX_PATHS], *dev[MAX_PATHS], *cgroups[4];
static int n_rw, n_ro, n_dev, n_cgroups;
static int error_pipe = -1;

/* Child side: reports why a layer failed through the close-on-exec pipe, then exits. */
static void fail(const char *what) {
  char text[512];
  int n = snprintf(text, sizeof text, "E%s: %s", what, strerror(errno));
  if (error_pipe >= 0 && write(error_pipe, text, n) < 0) {
  }
  _exit(125);
}

static void add(const char **list, int *count, const char *value) {
  if (*count < MAX_PATHS) list[(*count)++] = value;
}

static int write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == (ssize_t)strlen(text) ? 0 : -1;
}

static int set_limit(int which, rlim_t soft, rlim_t hard) {
  struct rlimit old, want = {soft, hard};
  if (getrlimit(which, &old) == 0 && old.rlim_max != RLIM_INFINITY) {
    if (want.rlim_max > old.rlim_max) want.rlim_max = old.rlim_max;
    if (want.rlim_cur > want.rlim_max) want.rlim_cur = want.rlim_max;
  }
  return setrlimit(which, &want);
}

static int landlock_abi(void) {
  long abi = syscall(SYS_LL_CREATE, NULL, 0, 1U /* LANDLOCK_CREATE_RULESET_VERSION */);
  return abi < 0 ? 0 : (int)abi;
}

static void landlock_rule(int ruleset, const char *path, uint64_t access) {
  int fd = open(path, O_PATH | O_CLOEXEC);
  if (fd < 0) return; /* a folder this host does not have */
  struct stat st;
  if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) access &= LL_FILE_ONLY;
  struct ll_path_beneath rule = {access, fd};
  long rc = syscall(SYS_LL_ADD, ruleset, 1 /* LANDLOCK_RULE_PATH_BENEATH */, &rule, 0);
  close(fd);
  if (rc < 0) fail("landlock_add_rule");
}

static void landlock(void) {
  int abi = landlock_abi();
  if (abi < 1) {
    errno = EOPNOTSUPP;
    fail("landlock");
  }
  uint64_t fs = (1ULL << 13) - 1; /* EXECUTE .. MAKE_SYM */
  if (abi >= 2) fs |= 1ULL << 13;  /* REFER */
  if (abi >= 3) fs |= LL_TRUNCATE;
  if (abi >= 5) fs |= LL_IOCTL_DEV;
  struct ll_ruleset_attr attr = {fs, 3 /* BIND_TCP | CONNECT_TCP, never allowed */,
                                 3 /* abstract unix sockets, signals */};
  size_t size = abi >= 6 ? sizeof attr : abi >= 4 ? 2 * sizeof(uint64_t) : sizeof(uint64_t);
  int ruleset = (int)syscall(SYS_LL_CREATE, &attr, size, 0);
  if (ruleset < 0) fail("landlock_create_ruleset");
  uint64_t read = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR;
  for (int i = 0; i < n_ro; i++) landlock_rule(ruleset, ro[i], read);
  for (int i = 0; i < n_rw; i++) landlock_rule(ruleset, rw[i], fs & ~(LL_MAKE_CHAR | LL_MAKE_BLOCK));
  for (int i = 0; i < n_dev; i++) landlock_rule(ruleset, dev[i], LL_READ_FILE | LL_WRITE_FILE);
  if (syscall(SYS_LL_RESTRICT, ruleset, 0) < 0) fail("landlock_restrict_self");
  close(ruleset);
}

static void drop_capabilities(void) {
  for (int cap = 0; prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0; cap++) {
  }
  struct {
    uint32_t version;
    int pid;
  } header = {0x20080522 /* _LINUX_CAPABILITY_VERSION_3 */, 0};
  uint32_t data[6] = {0};
  if (syscall(SYS_capset, &header, data) < 0) fail("capset");
}

/* In the wrapper itself (a PID namespace takes effect for its children): "" or what failed. */
static const char *namespaces(void) {
  uid_t uid = getuid();
  gid_t gid = getgid();
  int flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS;
  if (uid != 0) flags |= CLONE_NEWUSER;
  if (unshare(flags) < 0) return "unshare";
  if (uid != 0) {
    char map[64];
    if (write_file("/proc/self/setgroups", "deny") < 0) return "setgroups";
    snprintf(map, sizeof map, "%u %u 1", uid, uid);
    if (write_file("/proc/self/uid_map", map) < 0) return "uid_map";
    snprintf(map, sizeof map, "%u %u 1", gid, gid);
    if (write_file("/proc/self/gid_map", map) < 0) return "gid_map";
  }
  if (sethostname("dice-compile", 12) < 0) return "sethostname";
  return "";
}

static int load_bpf(const char *path, struct sock_fprog *prog) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  static struct sock_filter code[4096];
  ssize_t n = read(fd, code, sizeof code);
  close(fd);
  if (n <= 0 || n % sizeof(struct sock_filter) != 0) {
    errno = EINVAL;
    return -1;
  }
  prog->len = (unsigned short)(n / sizeof(struct sock_filter));
  prog->filter = code;
  return 0;
}

/* The namespace's first process (the PID namespace's init, which ignores every signal it has no
 * handler for, SIGXCPU and SIGXFSZ included): runs the command as its child, so that the rlimits'
 * signals reach it, and reports "S<wait status>" (or "E<why>" if it did not start) on the pipe. */
static int run_command(char **command) {
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) < 0) fail("pipe");
  pid_t pid = fork();
  if (pid < 0) fail("fork");
  if (pid == 0) {
    close(exec_pipe[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    execvp(command[0], command);
    char text[512];
    int n = snprintf(text, sizeof text, "%s: %s", command[0], strerror(errno));
    if (write(exec_pipe[1], text, n) < 0) {
    }
    _exit(127);
  }
  close(exec_pipe[1]);
  char text[512];
  ssize_t got = read(exec_pipe[0], text, sizeof text - 1);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  char line[600];
  int n = got > 0 ? snprintf(line, sizeof line, "E%.*s", (int)got, text)
                  : snprintf(line, sizeof line, "S%d", status);
  if (write(error_pipe, line, n) < 0) {
  }
  return got > 0 ? 125 : 0;
}

int main(int argc, char **argv) {
  int opt, report = -1, nice_level = 0, new_ns = 0;
  long long memory = -1, cpu = -1, fsize = -1, nproc = -1, nofile = -1;
  const char *bpf_path = NULL;
  while ((opt = getopt(argc, argv, "+Nw:r:d:m:t:f:p:o:n:s:g:R:")) != -1) {
    switch (opt) {
      case 'N': new_ns = 1; break;
      case 'w': add(rw, &n_rw, optarg); break;
      case 'r': add(ro, &n_ro, optarg); break;
      case 'd': add(dev, &n_dev, optarg); break;
      case 'm': memory = atoll(optarg); break;
      case 't': cpu = atoll(optarg); break;
      case 'f': fsize = atoll(optarg); break;
      case 'p': nproc = atoll(optarg); break;
      case 'o': nofile = atoll(optarg); break;
      case 'n': nice_level = atoi(optarg); break;
      case 's': bpf_path = optarg; break;
      case 'g': if (n_cgroups < 4) cgroups[n_cgroups++] = optarg; break;
      case 'R': report = atoi(optarg); break;
      default: fprintf(stderr, "dice_confine: bad arguments\n"); return 125;
    }
  }
  if (optind >= argc) {
    fprintf(stderr, "dice_confine: no command\n");
    return 125;
  }
  if (report >= 0) fcntl(report, F_SETFD, FD_CLOEXEC);
  FILE *out = report >= 0 ? fdopen(report, "w") : NULL;
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) < 0) return 125;
  struct sock_fprog prog = {0, NULL};
  char why[512] = "";
  if (bpf_path && load_bpf(bpf_path, &prog) < 0)
    snprintf(why, sizeof why, "seccomp filter %s: %s", bpf_path, strerror(errno));
  /* The cgroups first, as the caller's own user (a user namespace would change who writes). */
  for (int i = 0; i < n_cgroups && !why[0]; i++) {
    char procs[4096];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", cgroups[i]);
    if (write_file(procs, "0") < 0)
      snprintf(why, sizeof why, "joining cgroup %s: %s", cgroups[i], strerror(errno));
  }
  const char *ns = new_ns && !why[0] ? namespaces() : "";
  if (ns[0]) snprintf(why, sizeof why, "%s: %s", ns, strerror(errno));
  if (why[0]) {
    if (out) fprintf(out, "setup %s\n", why);
    fprintf(stderr, "dice_confine: %s\n", why);
    return 125;
  }
  pid_t child = fork();
  if (child < 0) {
    if (out) fprintf(out, "setup fork: %s\n", strerror(errno));
    return 125;
  }
  if (child == 0) {
    close(pipe_fds[0]);
    error_pipe = pipe_fds[1];
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) fail("PR_SET_PDEATHSIG");
    if (memory > 0 && set_limit(RLIMIT_DATA, memory, memory) < 0) fail("RLIMIT_DATA");
    if (cpu > 0 && set_limit(RLIMIT_CPU, cpu, cpu + 5) < 0) fail("RLIMIT_CPU");
    if (fsize > 0 && set_limit(RLIMIT_FSIZE, fsize, fsize) < 0) fail("RLIMIT_FSIZE");
    if (nproc > 0 && set_limit(RLIMIT_NPROC, nproc, nproc) < 0) fail("RLIMIT_NPROC");
    if (nofile > 0 && set_limit(RLIMIT_NOFILE, nofile, nofile) < 0) fail("RLIMIT_NOFILE");
    if (set_limit(RLIMIT_CORE, 0, 0) < 0) fail("RLIMIT_CORE");
    if (nice_level && setpriority(PRIO_PROCESS, 0, getpriority(PRIO_PROCESS, 0) + nice_level) < 0)
      fail("setpriority");
    if (n_rw > 0 && (setenv("TMPDIR", rw[0], 1) < 0 || setenv("HOME", rw[0], 1) < 0))
      fail("setenv");
    drop_capabilities();
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) fail("PR_SET_NO_NEW_PRIVS");
    if (n_ro + n_rw + n_dev > 0) landlock();
    if (prog.filter && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
      fail("seccomp");
    _exit(run_command(argv + optind));
  }
  close(pipe_fds[1]);
  signal(SIGINT, SIG_IGN);
  char setup[512];
  ssize_t got = read(pipe_fds[0], setup, sizeof setup - 1);
  setup[got > 0 ? got : 0] = '\0';
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (got > 0 && setup[0] == 'S') { /* the command's own status, as its first process reported */
    status = atoi(setup + 1);
    got = 0;
  } else if (got > 0 && setup[0] == 'E') {
    memmove(setup, setup + 1, strlen(setup));
  }
  struct rusage use;
  getrusage(RUSAGE_CHILDREN, &use);
  if (out) {
    if (got > 0)
      fprintf(out, "setup %s\n", setup);
    else
      fprintf(out, "%s %d %ld %ld.%06ld %ld.%06ld\n", WIFSIGNALED(status) ? "signal" : "exit",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), use.ru_maxrss,
              (long)use.ru_utime.tv_sec, (long)use.ru_utime.tv_usec, (long)use.ru_stime.tv_sec,
              (long)use.ru_stime.tv_usec);
    fclose(out);
  }
  if (got > 0) {
    fprintf(stderr, "dice_confine: %s\n", setup);
    return 125;
  }
  if (WIFSIGNALED(status)) {
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(WTERMSIG(status), SIG_DFL);
    kill(getpid(), WTERMSIG(status));
    return 128 + WTERMSIG(status);
  }
  return WEXITSTATUS(status);
}
