/* fusegrad's CPU launcher: runs a list of kernels, each over [0, n) work items, on a pool of native threads.

   Every kernel has an entry point `void NAME_entry(void **bufs, long long start, long long end)` (the C
   renderer writes it). A parallel kernel is cut into chunks, and its chunks into one contiguous range per
   thread (the calling thread's first). Each thread claims its own range's chunks in order with an atomic
   counter, then the other ranges' (a worker that wakes late finds its range taken by the others). So each
   thread streams one contiguous part of the buffers. The sum of 2^24 floats' kernel on a 2-core Zen 4 VM, its 8
   chunks run by OpenMP: 0.63-0.65 ms so, 0.93-1.05 ms with the chunks taken in turn, while the VM's memory system
   was quiet (the same 1.2-1.4 ms either way while it was busy). The kernel is finished when every chunk is done
   and every worker has acknowledged it (so no worker can still be reading it when the next one is set up). Between kernels the workers spin
   for a while (the next kernel of a step follows within microseconds) and then sleep on a condition
   variable. No Python object is touched here: ctypes releases the GIL around these calls.

   Several Python threads may launch at once. The pool runs one kernel at a time: a caller owns it (an atomic
   flag) from posting a kernel until every worker has acknowledged it; a caller that finds it owned runs its
   kernel's chunks itself, trying again between chunks. Everything else a launch needs lives in the caller's
   own job (fg_job), so callers never share state but the pool.

   A job runs for about slice_ns and then returns 1 (not finished) so that the calling thread gets back to
   Python, where a signal handler (KeyboardInterrupt) can run; calling fg_run again goes on where it stopped.
   fg_cancel stops a job: nothing more is claimed, and it returns once no worker runs any of its chunks (the
   buffers may be freed then). Chunks are small (runtime/cpu.py cuts long kernels finely), so both come soon. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef void (*fg_entry)(void **, long long, long long);

/* One launch of `count` kernels, owned by its caller (runtime/cpu.py mirrors this layout). */
typedef struct {
  long long count;
  void **entries;               /* kernel i calls entries[i] on bufs[i] over n[i] items in parts[i] chunks */
  void ***bufs;
  const long long *n;
  const long long *parts;
  long long slice_ns;           /* return to the caller after about this long */
  long long k;                  /* the kernel in progress */
  long long chunk;              /* its next chunk, while it runs on the calling thread */
  long long pooled;             /* 1: kernel k is posted to the pool, which this job owns */
} fg_job;

static struct {
  int threads;                  /* workers + the caller */
  pthread_t *tids;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  atomic_long generation;       /* bumped for each parallel kernel */
  atomic_int sleepers;
  atomic_int owner;             /* 1 while a job owns the pool */
  /* the kernel being run */
  fg_entry fn;
  void **bufs;
  long long n;
  long long parts;
  struct fg_range {             /* thread i's chunks: next to claim, end; a cache line each */
    atomic_llong next;
    long long end;
    char pad[64 - 2 * sizeof(long long)];
  } *ranges;
  atomic_llong done;            /* chunks finished */
  atomic_int acks;              /* workers finished with this kernel */
  pid_t pid;                    /* a forked child has no workers: it runs everything itself */
} P;

static const long SPIN = 1 << 14;    /* pause loops a worker spins before it sleeps (~180 us on a Xeon) */

/* The next chunk for thread `slot` (its own range first, then the others'), or -1 when none is left. */
static long long claim(int slot) {
  for (int k = 0; k < P.threads; k++) {
    struct fg_range *r = &P.ranges[(slot + k) % P.threads];
    if (atomic_load_explicit(&r->next, memory_order_relaxed) >= r->end) continue;
    long long i = atomic_fetch_add_explicit(&r->next, 1, memory_order_acq_rel);
    if (i < r->end) return i;
  }
  return -1;
}

static void run_chunks(int slot) {
  long long i;
  while ((i = claim(slot)) >= 0) {
    P.fn(P.bufs, P.n * i / P.parts, P.n * (i + 1) / P.parts);
    atomic_fetch_add_explicit(&P.done, 1, memory_order_acq_rel);
  }
}

static inline void pause_cpu(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void *worker(void *arg) {
  int slot = (int)(intptr_t)arg;
  long seen = 0;    /* the generation when the pool started: a kernel may be posted before this thread runs */
  for (;;) {
    long spins = 0, g;
    while ((g = atomic_load_explicit(&P.generation, memory_order_acquire)) == seen) {
      if (++spins < SPIN) { pause_cpu(); continue; }
      pthread_mutex_lock(&P.lock);
      atomic_fetch_add(&P.sleepers, 1);
      while (atomic_load(&P.generation) == seen) pthread_cond_wait(&P.wake, &P.lock);
      atomic_fetch_sub(&P.sleepers, 1);
      pthread_mutex_unlock(&P.lock);
      spins = 0;
    }
    seen = g;
    run_chunks(slot);
    atomic_fetch_add_explicit(&P.acks, 1, memory_order_acq_rel);
  }
  return NULL;
}

int fg_pool_start(int threads) {
  if (P.tids) return P.threads;
  if (threads < 1) threads = 1;
  pthread_mutex_init(&P.lock, NULL);
  pthread_cond_init(&P.wake, NULL);
  atomic_store(&P.generation, 0);
  atomic_store(&P.owner, 0);
  P.tids = calloc((size_t)threads, sizeof(pthread_t));
  if (posix_memalign((void **)&P.ranges, 64, (size_t)threads * sizeof *P.ranges)) P.ranges = NULL;
  if (!P.tids || !P.ranges) { free(P.tids); free(P.ranges); P.tids = NULL; P.ranges = NULL; return 0; }
  P.threads = 1;
  P.pid = getpid();
  for (int i = 1; i < threads; i++) {
    if (pthread_create(&P.tids[i], NULL, worker, (void *)(intptr_t)i) != 0) break;
    P.threads++;
  }
  return P.threads;
}

/* Take the pool for kernel k of job j, chunks from j->chunk on; 0 when another job has it (or none exists). */
static int post(fg_job *j) {
  long long k = j->k;
  if (P.threads <= 1 || getpid() != P.pid) return 0;
  int free_ = 0;
  if (atomic_load_explicit(&P.owner, memory_order_relaxed) ||
      !atomic_compare_exchange_strong(&P.owner, &free_, 1)) return 0;
  P.fn = (fg_entry)j->entries[k]; P.bufs = j->bufs[k]; P.n = j->n[k]; P.parts = j->parts[k];
  atomic_store_explicit(&P.done, j->chunk, memory_order_relaxed);
  atomic_store_explicit(&P.acks, 0, memory_order_relaxed);
  long long left = P.parts - j->chunk;   /* the chunks not yet run, in one range per thread */
  for (int s = 0; s < P.threads; s++) {
    P.ranges[s].end = j->chunk + left * (s + 1) / P.threads;
    atomic_store_explicit(&P.ranges[s].next, j->chunk + left * s / P.threads, memory_order_relaxed);
  }
  atomic_fetch_add(&P.generation, 1);    /* sequentially consistent: ordered before the sleepers check */
  if (atomic_load(&P.sleepers) > 0) {
    pthread_mutex_lock(&P.lock);
    pthread_cond_broadcast(&P.wake);
    pthread_mutex_unlock(&P.lock);
  }
  j->pooled = 1;
  return 1;
}

static void release_pool(fg_job *j) {
  j->pooled = 0;
  atomic_store_explicit(&P.owner, 0, memory_order_release);
}

/* Help with the pooled kernel and wait for it; 1 when it is finished, 0 when the deadline passed first. */
static int finish_pooled(long long deadline) {
  long long i;
  while ((i = claim(0)) >= 0) {
    P.fn(P.bufs, P.n * i / P.parts, P.n * (i + 1) / P.parts);
    atomic_fetch_add_explicit(&P.done, 1, memory_order_acq_rel);
    if (now_ns() > deadline) return 0;
  }
  long spins = 0;
  while (atomic_load_explicit(&P.done, memory_order_acquire) < P.parts ||
         atomic_load_explicit(&P.acks, memory_order_acquire) < P.threads - 1) {
    pause_cpu();
    if ((++spins & 255) == 0) {
      if (now_ns() > deadline) return 0;
      if (spins > SPIN) sched_yield();   /* a worker may be waiting for this core */
    }
  }
  return 1;
}

/* Run job j from where it stopped: 0 when every kernel is done, 1 when it stopped after about j->slice_ns. */
int fg_run(fg_job *j) {
  long long deadline = now_ns() + j->slice_ns;
  while (j->k < j->count) {
    if (j->pooled) {
      if (!finish_pooled(deadline)) return 1;
      release_pool(j);
      j->k++; j->chunk = 0;
      continue;
    }
    long long k = j->k, n = j->n[k], parts = j->parts[k] > 1 ? j->parts[k] : 1;
    fg_entry fn = (fg_entry)j->entries[k];
    while (j->chunk < parts) {
      if (parts > 1 && post(j)) break;
      long long c = j->chunk++;
      fn(j->bufs[k], n * c / parts, n * (c + 1) / parts);
      if (j->chunk < parts && now_ns() > deadline) return 1;
    }
    if (j->pooled) continue;
    j->k++; j->chunk = 0;
    if (j->k < j->count && now_ns() > deadline) return 1;
  }
  return 0;
}

/* Stop job j: no chunk of it is claimed any more, and none runs when this returns. */
void fg_cancel(fg_job *j) {
  if (!j->pooled) return;
  for (int s = 0; s < P.threads; s++) atomic_store(&P.ranges[s].next, P.ranges[s].end);
  long spins = 0;
  while (atomic_load_explicit(&P.acks, memory_order_acquire) < P.threads - 1) {
    pause_cpu();
    if (++spins > SPIN) sched_yield();
  }
  release_pool(j);
}
