/* onnxc's parallel launcher: dynamic chunks over a persistent pool, linked into every CPU artifact.
 *
 * TVM's kernels run their parallel loops through the function pointer
 * `__TVMBackendParallelLaunch` that the kernel library exports; TVM's loader points it at
 * TVM's thread pool, which gives each of T threads one fixed 1/T of the loop and makes the
 * caller wait for the slowest.  On a machine that also runs other work (every shared or
 * virtualised host), one descheduled thread stalls every kernel for a time slice: measured on
 * 2 vCPUs, 2-thread inference slower than 1-thread.  runtime/parallel.py repoints the
 * library's `__TVMBackendParallelLaunch` at onnxc_parallel_launch below, which splits the loop
 * into T x CHUNKS tasks that the caller and the pool's threads claim one at a time from one
 * atomic counter (what onnxruntime's and OpenMP's dynamic schedules do): a thread that is
 * descheduled holds back one small chunk, not half the kernel.
 *
 * The split is valid because TVM's codegen computes a task's range from (task_id, num_task)
 * alone (src/target/llvm/codegen_cpu.cc: step = ceil(extent / num_task)).  Kernels that call
 * TVMBackendParallelBarrier need num_task threads running at once; their library exports
 * `__TVMBackendParallelBarrier`, and runtime/parallel.py leaves such libraries on TVM's pool.
 *
 * Job protocol: one 64-bit ticket holds (generation:24 | num_task:20 | next:20).  A thread
 * claims task `next` by compare-and-swap while the generation is the one it joined, so it
 * reads the job's function and data only after a successful claim, when the job cannot have
 * finished (the claimed task is pending).  Idle workers spin about SPIN_NS, then sleep on a
 * condition variable; the caller wakes sleepers only when there are any.  One caller at a
 * time: a launch that finds the pool busy (another Python thread inside a kernel) runs on
 * TVM's pool instead (`fallback`).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} onnxc_penv;
typedef int (*onnxc_lambda)(int task_id, onnxc_penv* penv, void* cdata);
typedef int (*onnxc_launch_fn)(onnxc_lambda flambda, void* cdata, int num_task);

/* tvm-ffi's error setter (libtvm_ffi, loaded before any kernel library); weak so that the
   object links into a library without it */
extern void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message)
    __attribute__((weak));
static __thread int caller_task_failed;

#define MAX_WORKERS 255
#define GEN_SHIFT 40
#define N_SHIFT 20
#define FIELD_MASK ((1ull << 20) - 1)
#define SPIN_NS 2000000ll /* idle workers spin 2 ms before sleeping (between kernels: < 0.1 ms) */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static struct {
  _Atomic uint64_t ticket;
  _Atomic int done;
  _Atomic int error;
  _Atomic int sleepers;
  _Atomic int busy;
  _Atomic int active_workers; /* workers that join jobs: threads - 1 */
  onnxc_lambda flambda;
  void* cdata;
  onnxc_penv env;
  uint32_t gen;
  int started; /* worker threads created */
  int want;    /* threads asked for, the caller included */
  int forked;  /* this process is a fork of one that had workers */
  int chunks;  /* tasks per thread */
  onnxc_launch_fn fallback;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  pthread_t threads[MAX_WORKERS];
} P = {.chunks = 4, .mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static inline uint32_t gen_of(uint64_t t) { return (uint32_t)(t >> GEN_SHIFT); }

/* Claim and run tasks of generation `gen` until none is left. */
static void run_tasks(uint32_t gen) {
  uint64_t t = atomic_load(&P.ticket);
  for (;;) {
    if (gen_of(t) != gen) return;
    uint32_t n = (uint32_t)((t >> N_SHIFT) & FIELD_MASK), next = (uint32_t)(t & FIELD_MASK);
    if (next >= n) return;
    if (!atomic_compare_exchange_weak(&P.ticket, &t, t + 1)) continue;
    if (P.flambda((int)next, &P.env, P.cdata) != 0) {
      atomic_store(&P.error, 1);
      caller_task_failed = 1; /* thread-local: tells the caller whether its own error is set */
    }
    atomic_fetch_add(&P.done, 1);
    t = atomic_load(&P.ticket);
  }
}

static void* worker_main(void* arg) {
  int index = (int)(intptr_t)arg;
  uint32_t seen = gen_of(atomic_load(&P.ticket));
  int64_t idle_since = now_ns();
  for (;;) {
    uint64_t t = atomic_load(&P.ticket);
    if (gen_of(t) != seen && index < atomic_load(&P.active_workers)) {
      seen = gen_of(t);
      run_tasks(seen);
      idle_since = now_ns();
      continue;
    }
    seen = gen_of(t); /* a job this worker sat out (pool shrunk) is not waited for */
    for (int i = 0; i < 64; ++i) cpu_relax();
    if (now_ns() - idle_since < SPIN_NS) continue;
    pthread_mutex_lock(&P.mu);
    atomic_fetch_add(&P.sleepers, 1);
    while (gen_of(atomic_load(&P.ticket)) == seen) pthread_cond_wait(&P.wake, &P.mu);
    atomic_fetch_sub(&P.sleepers, 1);
    pthread_mutex_unlock(&P.mu);
    idle_since = now_ns();
  }
  return NULL;
}

/* Start workers until `want` - 1 run; returns how many take part in jobs. */
static int start_workers(int want) {
  while (P.started < want - 1) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&P.threads[P.started], &attr, worker_main, (void*)(intptr_t)P.started);
    pthread_attr_destroy(&attr);
    if (rc != 0) break;
    P.started++;
  }
  int workers = want - 1 < P.started ? want - 1 : P.started;
  atomic_store(&P.active_workers, workers);
  return workers;
}

static void reset_after_fork(void) {
  /* the child has only the forking thread: no workers.  The first launch starts them again
     (TVM's own pool hangs in a forked child, so the fallback is no help there) */
  P.started = 0;
  P.forked = 1;
  atomic_store(&P.active_workers, 0);
  atomic_store(&P.busy, 0);
  atomic_store(&P.sleepers, 0);
  pthread_mutex_init(&P.mu, NULL);
  pthread_cond_init(&P.wake, NULL);
}

/* Use `threads` threads in all (the caller + threads - 1 workers) and `chunks` tasks per thread
   per kernel; `fallback` is the launcher TVM's loader installed.  Returns the threads in use. */
int onnxc_pool_configure(int threads, int chunks, onnxc_launch_fn fallback) {
  static int atfork_done = 0;
  if (!atfork_done) {
    pthread_atfork(NULL, NULL, reset_after_fork);
    atfork_done = 1;
  }
  if (threads < 1) threads = 1;
  if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
  if (chunks >= 1 && chunks <= 64) P.chunks = chunks;
  if (fallback) P.fallback = fallback;
  P.want = threads;
  return start_workers(threads) + 1;
}

int onnxc_parallel_launch(onnxc_lambda flambda, void* cdata, int num_task) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&P.busy, &expected, 1)) { /* another caller has it */
    if (P.fallback && !P.forked) return P.fallback(flambda, cdata, num_task);
    onnxc_penv env = {NULL, 1};
    return flambda(0, &env, cdata);
  }
  int workers = atomic_load(&P.active_workers);
  if (workers < P.want - 1 && P.forked) workers = start_workers(P.want);
  if (workers == 0) {
    atomic_store(&P.busy, 0);
    onnxc_penv env = {NULL, 1};
    return flambda(0, &env, cdata);
  }
  int n = num_task > 0 ? num_task : (workers + 1) * P.chunks;
  if (n > (int)FIELD_MASK) n = (int)FIELD_MASK;
  P.flambda = flambda;
  P.cdata = cdata;
  P.env.sync_handle = NULL;
  P.env.num_task = n;
  atomic_store(&P.done, 0);
  atomic_store(&P.error, 0);
  P.gen = (P.gen + 1) & 0xFFFFFFu;
  atomic_store(&P.ticket, ((uint64_t)P.gen << GEN_SHIFT) | ((uint64_t)n << N_SHIFT));
  if (atomic_load(&P.sleepers) > 0) {
    pthread_mutex_lock(&P.mu);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.mu);
  }
  caller_task_failed = 0;
  run_tasks(P.gen);
  for (int spins = 0; atomic_load(&P.done) < n; ++spins) {
    if (spins < 4096) cpu_relax();
    else sched_yield(); /* a claimed task's thread was descheduled: let it run */
  }
  int failed = atomic_load(&P.error);
  atomic_store(&P.busy, 0);
  if (failed && !caller_task_failed && TVMFFIErrorSetRaisedFromCStr)
    /* the failing task ran on a worker, whose error state is its own thread's */
    TVMFFIErrorSetRaisedFromCStr("RuntimeError",
                                 "a parallel task of this kernel failed on a worker thread");
  return failed ? -1 : 0;
}
