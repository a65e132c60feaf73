// What the kernel of this machine charges for the things a one-shot call is made of, measured
// without stsd: scripts/bench compiles and runs it (cc -O2) and prints its lines beside the
// latency tables. Medians of many repetitions, in microseconds.
//
//   page      a fresh anonymous page: allocated, zeroed, mapped (MAP_POPULATE of 66 pages)
//   cow       a forked child writing 66 pages it shares with its parent (per page)
//   fork      fork + _exit + waitpid of this small process
//   pte       what fork + _exit adds per page of mapped memory the child inherits (4 MiB of
//             read-only anonymous memory, present in the parent): with one page-table entry
//             per 4 KiB page (copied at fork, cleared at exit), and with the same memory in
//             two 2 MiB transparent huge pages (one entry each), when the kernel has them
//   wake      a one-byte ping-pong between two processes over a socket pair, one round
//             trip: on two different CPUs, and both on one CPU
//   floor     a fresh process per call with nothing else: a parent holding a heap the size of
//             stsd's zygote's (648 KiB, present) forks a child per call over a new socket
//             pair; the child reads a byte, writes 47 pages of the heap (the copy-on-write
//             faults a forked worker takes in a one-shot `stats-summary` call), answers a byte
//             and waits; the parent reads the answer, kills and reaps it. CPU per call of the
//             parent and its children (getrusage; on the CPUs it started with), the median of
//             5 batches of 400: what the kernel charges for the process alone, before any
//             JavaScript, Landlock, seccomp, MCP or supervisor
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGES 66
#define PAGE 4096

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static double page_us(void) {
    enum { N = 301 };
    static double v[N];
    for (int i = 0; i < N; i++) {
        double t = now_us();
        void *p = mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        v[i] = (now_us() - t) / PAGES;
        munmap(p, PAGES * PAGE);
    }
    return median(v, N);
}

static double cow_us(void) {
    enum { N = 201 };
    static double v[N];
    char *p = mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(p, 1, PAGES * PAGE);
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    for (int i = 0; i < N; i++) {
        pid_t c = fork();
        if (c == 0) {
            double t = now_us();
            for (int o = 0; o < PAGES * PAGE; o += PAGE)
                p[o] = 2;
            double d = (now_us() - t) / PAGES;
            if (write(fd[1], &d, sizeof d) != sizeof d)
                _exit(1);
            _exit(0);
        }
        if (read(fd[0], &v[i], sizeof v[i]) != sizeof v[i])
            v[i] = -1;
        waitpid(c, 0, 0);
    }
    return median(v, N);
}

/* fork + _exit + waitpid of this process as it is now, the median of 201 */
static double fork_us(void) {
    enum { N = 201 };
    static double v[N];
    for (int i = 0; i < N; i++) {
        double t = now_us();
        pid_t c = fork();
        if (c == 0)
            _exit(0);
        waitpid(c, 0, 0);
        v[i] = now_us() - t;
    }
    return median(v, N);
}

/* fork + _exit + waitpid with `mib` MiB of read-only anonymous memory present in this
   process, in 4 KiB pages (huge 0) or transparent huge pages (huge 1). Returns -1 when huge
   pages were asked for and not given. */
static double fork_with_us(int mib, int huge) {
    size_t len = (size_t)mib << 20, align = 2 << 20;
    char *raw = mmap(0, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return -1;
    char *p = (char *)(((unsigned long)raw + align - 1) & ~(align - 1));
    madvise(p, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    memset(p, 1, len);
    mprotect(p, len, PROT_READ);
    if (huge) {
        // Whether the kernel gave huge pages: AnonHugePages in this process's rollup.
        FILE *f = fopen("/proc/self/smaps_rollup", "r");
        char line[256];
        long kib = 0;
        while (f && fgets(line, sizeof line, f))
            if (strncmp(line, "AnonHugePages:", 14) == 0)
                kib = atol(line + 14);
        if (f)
            fclose(f);
        if (kib < (long)(len >> 10)) {
            munmap(raw, len + align);
            return -1;
        }
    }
    double us = fork_us();
    munmap(raw, len + align);
    return us;
}

static double wake_us(int a, int b) {
    enum { N = 2001 };
    static double v[N];
    int sv[2];
    char x = 0;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0)
        return -1;
    pid_t c = fork();
    if (c == 0) {
        pin(b);
        for (int i = 0; i < N; i++)
            if (read(sv[1], &x, 1) != 1 || write(sv[1], &x, 1) != 1)
                _exit(1);
        _exit(0);
    }
    pin(a);
    usleep(10000);
    for (int i = 0; i < N; i++) {
        double t = now_us();
        if (write(sv[0], &x, 1) != 1 || read(sv[0], &x, 1) != 1)
            return -1;
        v[i] = now_us() - t;
    }
    waitpid(c, 0, 0);
    close(sv[0]);
    close(sv[1]);
    return median(v, N);
}

static double rusage_us(int who) {
    struct rusage r;
    getrusage(who, &r);
    return r.ru_utime.tv_sec * 1e6 + r.ru_utime.tv_usec + r.ru_stime.tv_sec * 1e6 +
           r.ru_stime.tv_usec;
}

/* The CPUs this process may use when it starts (wake_us pins it to one, then another). */
static cpu_set_t start_cpus;

static double floor_us(void) {
    enum { BATCHES = 5, CALLS = 400, HEAP_PAGES = 162, WRITTEN = 47 };
    static double v[BATCHES];
    // The CPUs this process started with, as stsd's processes have (wake_us pinned it).
    if (sched_setaffinity(0, sizeof start_cpus, &start_cpus) != 0)
        return -1;
    char *heap = malloc((size_t)HEAP_PAGES * PAGE);
    if (!heap)
        return -1;
    memset(heap, 1, (size_t)HEAP_PAGES * PAGE);
    double result = -1;
    for (int b = 0; b < BATCHES; b++) {
        double cpu0 = rusage_us(RUSAGE_SELF) + rusage_us(RUSAGE_CHILDREN);
        for (int i = 0; i < CALLS; i++) {
            int sv[2];
            char x = 0;
            if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
                goto out;
            pid_t c = fork();
            if (c == 0) {
                close(sv[0]); // the parent's end: a parent that goes away is seen (EOF)
                if (read(sv[1], &x, 1) != 1)
                    _exit(1);
                for (int k = 0; k < WRITTEN; k++)
                    heap[(size_t)k * HEAP_PAGES / WRITTEN * PAGE] = 2;
                if (write(sv[1], &x, 1) != 1)
                    _exit(1);
                pause();
                _exit(0);
            }
            close(sv[1]);
            int answered = c > 0 && write(sv[0], &x, 1) == 1 && read(sv[0], &x, 1) == 1;
            close(sv[0]);
            if (c > 0) {
                kill(c, SIGKILL);
                waitpid(c, 0, 0);
            }
            if (!answered)
                goto out;
        }
        v[b] = (rusage_us(RUSAGE_SELF) + rusage_us(RUSAGE_CHILDREN) - cpu0) / CALLS;
    }
    result = median(v, BATCHES);
out:
    free(heap);
    return result;
}

int main(void) {
    if (sched_getaffinity(0, sizeof start_cpus, &start_cpus) != 0) {
        CPU_ZERO(&start_cpus);
        CPU_SET(0, &start_cpus);
    }
    printf("  a fresh anonymous page (allocated, zeroed, mapped)     %6.2f\n", page_us());
    printf("  a page copied on a forked child's first write          %6.2f\n", cow_us());
    double base = fork_us();
    printf("  fork + _exit + waitpid of a small process              %6.1f\n", base);
    double small = fork_with_us(4, 0), huge = fork_with_us(4, 1);
    if (small >= 0)
        printf("  ... added per 4 KiB page the child inherits mapped      %6.3f\n",
               (small - base) / 1024);
    if (huge >= 0)
        printf("  ... the same memory in 2 MiB huge pages, per 4 KiB     %6.3f\n",
               (huge - base) / 1024);
    if (sysconf(_SC_NPROCESSORS_ONLN) > 1)
        printf("  socket ping-pong round trip, two CPUs                  %6.1f\n", wake_us(0, 1));
    printf("  socket ping-pong round trip, one CPU                   %6.1f\n", wake_us(0, 0));
    double floor = floor_us();
    if (floor >= 0)
        printf("  a fresh process per call, nothing else: CPU per call   %6.1f\n", floor);
    return 0;
}
