/* fusegrad's CPU launcher: runs a list of kernels, each over [0, n) work items, on a pool of native threads.

   Every kernel has an entry point `void NAME_entry(void **bufs, long long start, long long end)` (the C
   renderer writes it). A parallel kernel is cut into chunks that the calling thread and the workers claim
   with an atomic counter; the caller goes on when every chunk is done and every worker has acknowledged the
   kernel (so no worker can still be reading it when the next one is set up). Between kernels the workers spin
   for a while (the next kernel of a step follows within microseconds) and then sleep on a condition
   variable. No Python object is touched here: ctypes releases the GIL around fg_run. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

typedef void (*fg_entry)(void **, long long, long long);

static struct {
  int threads;                  /* workers + the caller */
  pthread_t *tids;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  atomic_long generation;       /* bumped for each parallel kernel */
  atomic_int sleepers;
  /* the kernel being run */
  fg_entry fn;
  void **bufs;
  long long n;
  int parts;
  atomic_int next;              /* next chunk to claim */
  atomic_int done;              /* chunks finished */
  atomic_int acks;              /* workers finished with this kernel */
  pid_t pid;                    /* a forked child has no workers: it runs everything itself */
} P;

static const long SPIN = 1 << 12;    /* pause loops a worker spins before it sleeps (about 100 us) */

static void run_chunks(void) {
  int i;
  while ((i = atomic_fetch_add_explicit(&P.next, 1, memory_order_acq_rel)) < P.parts) {
    long long s = P.n * i / P.parts, e = P.n * (i + 1) / P.parts;
    P.fn(P.bufs, s, e);
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

static void *worker(void *arg) {
  (void)arg;
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
    run_chunks();
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
  P.tids = calloc((size_t)threads, sizeof(pthread_t));
  if (!P.tids) return 0;
  P.threads = 1;
  P.pid = getpid();
  for (int i = 1; i < threads; i++) {
    if (pthread_create(&P.tids[i], NULL, worker, NULL) != 0) break;
    P.threads++;
  }
  return P.threads;
}

/* Run count kernels in order. Kernel i calls entries[i] on bufs[i] over n[i] items, cut into parts[i] chunks
   (1: on the calling thread only). */
void fg_run(int count, void **entries, void ***bufs, const long long *n, const int *parts) {
  for (int k = 0; k < count; k++) {
    fg_entry fn = (fg_entry)entries[k];
    if (parts[k] <= 1 || P.threads <= 1 || getpid() != P.pid) { fn(bufs[k], 0, n[k]); continue; }
    P.fn = fn; P.bufs = bufs[k]; P.n = n[k]; P.parts = parts[k];
    atomic_store_explicit(&P.done, 0, memory_order_relaxed);
    atomic_store_explicit(&P.acks, 0, memory_order_relaxed);
    atomic_store_explicit(&P.next, 0, memory_order_relaxed);
    atomic_fetch_add(&P.generation, 1);    /* sequentially consistent: ordered before the sleepers check */
    if (atomic_load(&P.sleepers) > 0) {
      pthread_mutex_lock(&P.lock);
      pthread_cond_broadcast(&P.wake);
      pthread_mutex_unlock(&P.lock);
    }
    run_chunks();
    while (atomic_load_explicit(&P.done, memory_order_acquire) < P.parts ||
           atomic_load_explicit(&P.acks, memory_order_acquire) < P.threads - 1) pause_cpu();
  }
}
