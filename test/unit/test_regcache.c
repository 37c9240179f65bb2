/* The registration cache's bookkeeping, with a fake register/deregister
 * pair and a fake page table: lookup and containment, the window, LRU
 * eviction, refcounts, staleness after a remap, invalidation, errors. The
 * last tests use the real /proc/self/pagemap. */
#include "regcache.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define PS 4096u
#define NPAGES 512u
#define BASE ((uintptr_t)0x10000000u)
#define MAXMR (1024u * MR_CHUNK)
#define AT(page, off) ((const void *)(BASE + (uintptr_t)(page) * PS + (off)))

/* The fake address space: the identity of the page mapped at each virtual
 * page (0: none). */
static _Atomic uint64_t pages[NPAGES];
static _Atomic uint64_t next_id;

struct fake_mr {
	uintptr_t start;
	size_t len;
	bool live;
};

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
/* Every registration ever made, never reused (a deregistered one stays dead,
 * so a held entry's deregistration is seen): lkey - 1 indexes them, in
 * chunks allocated as needed, whose addresses never move. How many a test
 * makes depends on the scheduling (concurrent_gets_puts_and_remaps' senders
 * run until the remapper is done): a fixed table ran out on a slow host. */
#define MR_CHUNK 4096u
static struct fake_mr *mr_chunks[MAXMR / MR_CHUNK];

static struct fake_mr *mr_at(unsigned int i)
{
	return &mr_chunks[i / MR_CHUNK][i % MR_CHUNK];
}
static unsigned int nreg, ndereg;
static atomic_uint bad_dereg, bad_held; /* seen on other threads */
static int fail_reg[8]; /* errors for the next reg calls, in order, 0 ends */
static int ids_err;     /* page_ids fails with it */
static int flip_call;   /* page_ids call (1-based) after which a page changes */
static unsigned int flip_page, ids_calls;
static struct sv_regcache *rc;

static void remap(unsigned int page)
{
	pages[page] = ++next_id;
}

static int fake_reg(void *ctx, void *addr, size_t len, void **mr, uint32_t *lkey)
{
	cr_assert_eq(ctx, &fake_lock);
	pthread_mutex_lock(&fake_lock);
	int r = 0;
	if (fail_reg[0]) {
		r = fail_reg[0];
		memmove(fail_reg, fail_reg + 1, sizeof(fail_reg) - sizeof(fail_reg[0]));
		fail_reg[7] = 0;
	} else if (nreg >= MAXMR ||
		   (!mr_chunks[nreg / MR_CHUNK] &&
		    !(mr_chunks[nreg / MR_CHUNK] = calloc(MR_CHUNK, sizeof(struct fake_mr))))) {
		r = -ENOSPC;
	} else {
		struct fake_mr *m = mr_at(nreg++);
		*m = (struct fake_mr){.start = (uintptr_t)addr, .len = len, .live = true};
		*mr = m;
		*lkey = nreg;
	}
	pthread_mutex_unlock(&fake_lock);
	return r;
}

static void fake_dereg(void *ctx, void *mr)
{
	struct fake_mr *m = mr;
	pthread_mutex_lock(&fake_lock);
	if (!m->live)
		atomic_fetch_add(&bad_dereg, 1);
	m->live = false;
	ndereg++;
	pthread_mutex_unlock(&fake_lock);
}

static int fake_ids(void *ctx, uintptr_t start, size_t npages, uint64_t *ids)
{
	if (ids_err)
		return ids_err;
	for (size_t i = 0; i < npages; i++) {
		uintptr_t a = start + i * PS;
		ids[i] = a >= BASE && a < BASE + (uintptr_t)NPAGES * PS ? pages[(a - BASE) / PS] : 0;
	}
	if (++ids_calls == (unsigned int)flip_call)
		remap(flip_page);
	return 0;
}

static const struct sv_regcache_ops ops = {
	.reg = fake_reg,
	.dereg = fake_dereg,
	.page_ids = fake_ids,
};

static void make(uint32_t max_entries, size_t max_bytes, size_t window)
{
	struct sv_regcache_params prm = {
		.page_size = PS,
		.max_entries = max_entries,
		.max_bytes = max_bytes,
		.window = window,
	};
	cr_assert_eq(sv_regcache_create(&rc, &ops, &fake_lock, &prm), 0);
}

static void setup(void)
{
	for (unsigned int i = 0; i < NPAGES; i++)
		remap(i);
	make(64, 64u << 20, 0);
}

static void teardown(void)
{
	sv_regcache_destroy(rc);
	rc = NULL;
	cr_expect_eq(nreg, ndereg, "every registration is deregistered (%u vs %u)", nreg, ndereg);
	cr_expect_eq(atomic_load(&bad_dereg), 0, "a registration was deregistered twice");
}

static struct sv_regcache_stats stats(void)
{
	struct sv_regcache_stats st;
	sv_regcache_get_stats(rc, &st);
	return st;
}

static struct fake_mr *mr_of(const struct sv_regcache_ent *e)
{
	return mr_at(sv_regcache_lkey(e) - 1);
}

static struct sv_regcache_ent *get(const void *addr, size_t len)
{
	struct sv_regcache_ent *e;
	int r = sv_regcache_get(rc, addr, len, &e);
	cr_assert_eq(r, 0, "get: %s", strerror(-r));
	struct fake_mr *m = mr_of(e);
	cr_assert(m->live);
	cr_assert(m->start <= (uintptr_t)addr && (uintptr_t)addr + len <= m->start + m->len);
	return e;
}

TestSuite(regcache, .init = setup, .fini = teardown, .timeout = 20);

Test(regcache, miss_registers_whole_pages_then_nearby_buffers_hit)
{
	struct sv_regcache_ent *a = get(AT(3, 100), 5000);
	cr_assert_eq(mr_of(a)->start, BASE + 3 * PS);
	cr_assert_eq(mr_of(a)->len, 2 * PS);
	sv_regcache_put(rc, a);
	struct sv_regcache_ent *b = get(AT(4, 10), 100); /* same pages */
	cr_assert_eq(b, a);
	struct sv_regcache_ent *c = get(AT(3, 0), 2 * PS); /* exactly the entry */
	cr_assert_eq(c, a);
	sv_regcache_put(rc, b);
	sv_regcache_put(rc, c);
	struct sv_regcache_stats st = stats();
	cr_assert_eq(nreg, 1);
	cr_assert_eq(st.misses, 1);
	cr_assert_eq(st.hits, 2);
	cr_assert_eq(st.entries, 1);
	cr_assert_eq(st.bytes, 2 * PS);
	cr_assert_eq(ndereg, 0, "cached, not deregistered");
}

Test(regcache, request_must_fit_in_one_entry)
{
	sv_regcache_put(rc, get(AT(10, 0), PS));
	sv_regcache_put(rc, get(AT(11, 0), PS));
	struct sv_regcache_ent *e = get(AT(10, 100), PS); /* spans both */
	cr_assert_eq(mr_of(e)->start, BASE + 10 * PS);
	cr_assert_eq(mr_of(e)->len, 2 * PS);
	sv_regcache_put(rc, e);
	cr_assert_eq(nreg, 3);
	cr_assert_eq(stats().hits, 0);
}

Test(regcache, window_covers_the_present_pages_after_the_request)
{
	sv_regcache_destroy(rc);
	make(64, 64u << 20, 16 * PS);
	pages[52] = 0; /* not populated: the window stops before it */
	struct sv_regcache_ent *e = get(AT(40, 8), 100);
	cr_assert_eq(mr_of(e)->start, BASE + 40 * PS);
	cr_assert_eq(mr_of(e)->len, (52 - 40) * PS);
	sv_regcache_put(rc, e);
	for (unsigned int p = 40; p < 52; p++)
		sv_regcache_put(rc, get(AT(p, 0), PS));
	cr_assert_eq(nreg, 1);
	cr_assert_eq(stats().hits, 12);
	e = get(AT(53, 0), 1); /* the next window, a whole one */
	cr_assert_eq(nreg, 2);
	cr_assert_eq(mr_of(e)->start, BASE + 53 * PS);
	cr_assert_eq(mr_of(e)->len, 16 * PS);
	sv_regcache_put(rc, e);
	e = get(AT(60, 0), 20 * PS); /* longer than the window: just its pages */
	cr_assert_eq(mr_of(e)->start, BASE + 60 * PS);
	cr_assert_eq(mr_of(e)->len, 20 * PS);
	sv_regcache_put(rc, e);
	sv_regcache_put(rc, get(AT(39, 0), 2 * PS)); /* page 39 is not in any entry */
	cr_assert_eq(nreg, 4);
}

/* Pieces of one large write, as the transport posts them (payload =
 * buffer size - header: not page aligned), mostly hit. */
Test(regcache, sequential_pieces_of_a_large_write_mostly_hit)
{
	sv_regcache_destroy(rc);
	make(64, 64u << 20, 64 * PS);
	const size_t piece = 32768 - 24, total = 1u << 20;
	for (size_t off = 0; off < total; off += piece) {
		size_t l = total - off < piece ? total - off : piece;
		sv_regcache_put(rc, get(AT(0, off), l));
	}
	cr_assert_leq(nreg, 5, "%u registrations for 1 MiB in 256 KiB windows", nreg);
}

Test(regcache, window_is_bounded_by_max_bytes)
{
	sv_regcache_destroy(rc);
	make(64, 4 * PS, 64 * PS);
	struct sv_regcache_ent *e = get(AT(70, 0), PS);
	cr_assert_leq(mr_of(e)->len, 4 * PS);
	sv_regcache_put(rc, e);
	cr_assert_leq(stats().bytes, 4 * PS);
}

Test(regcache, refused_window_falls_back_to_the_request_pages)
{
	sv_regcache_destroy(rc);
	make(64, 64u << 20, 16 * PS);
	fail_reg[0] = -EFAULT; /* a guard page in the window, say */
	struct sv_regcache_ent *e = get(AT(20, 0), 10);
	cr_assert_eq(mr_of(e)->start, BASE + 20 * PS);
	cr_assert_eq(mr_of(e)->len, PS);
	sv_regcache_put(rc, e);
	cr_assert_eq(stats().entries, 1);
}

Test(regcache, request_on_unpopulated_page_is_registered_once_exactly)
{
	pages[5] = 0;
	struct sv_regcache_ent *e = get(AT(5, 123), 77);
	cr_assert_eq(mr_of(e)->start, (uintptr_t)AT(5, 123));
	cr_assert_eq(mr_of(e)->len, 77);
	cr_assert_eq(stats().entries, 0);
	cr_assert_eq(stats().uncached, 1);
	sv_regcache_put(rc, e);
	cr_assert_eq(ndereg, 1);
}

Test(regcache, remapped_page_makes_the_entry_stale)
{
	struct sv_regcache_ent *a = get(AT(8, 0), 3 * PS);
	uint32_t old = sv_regcache_lkey(a);
	sv_regcache_put(rc, a);
	remap(9); /* free() + munmap, then a new mapping at the same address */
	struct sv_regcache_ent *b = get(AT(8, 0), 3 * PS);
	cr_assert_neq(sv_regcache_lkey(b), old);
	cr_assert_eq(ndereg, 1, "the stale registration is dropped");
	struct sv_regcache_stats st = stats();
	cr_assert_eq(st.stale, 1);
	cr_assert_eq(st.hits, 0);
	cr_assert_eq(st.entries, 1);
	sv_regcache_put(rc, b);
}

Test(regcache, only_the_requested_pages_are_checked)
{
	sv_regcache_put(rc, get(AT(8, 0), 3 * PS));
	remap(10);
	struct sv_regcache_ent *e = get(AT(8, 0), PS); /* page 10 is not sent */
	cr_assert_eq(stats().hits, 1);
	sv_regcache_put(rc, e);
	sv_regcache_put(rc, get(AT(10, 0), 1));
	cr_assert_eq(stats().stale, 1);
}

Test(regcache, unmapped_page_is_stale_and_not_cached_again)
{
	sv_regcache_put(rc, get(AT(30, 0), PS));
	pages[30] = 0;
	struct sv_regcache_ent *e = get(AT(30, 0), PS);
	struct sv_regcache_stats st = stats();
	cr_assert_eq(st.stale, 1);
	cr_assert_eq(st.uncached, 1);
	cr_assert_eq(st.entries, 0);
	sv_regcache_put(rc, e);
	cr_assert_eq(ndereg, 2);
}

Test(regcache, stale_entry_in_use_is_deregistered_at_its_last_put)
{
	struct sv_regcache_ent *a = get(AT(12, 0), PS);
	remap(12);
	struct sv_regcache_ent *b = get(AT(12, 0), PS);
	cr_assert_neq(a, b);
	cr_assert_eq(ndereg, 0, "a is still in flight");
	cr_assert(mr_of(a)->live);
	sv_regcache_put(rc, a);
	cr_assert_eq(ndereg, 1);
	cr_assert_eq(stats().entries, 1);
	sv_regcache_put(rc, b);
	cr_assert_eq(ndereg, 1, "b stays cached");
}

Test(regcache, change_during_registration_is_not_cached)
{
	flip_page = 50;
	flip_call = 1; /* right after the read before registering */
	struct sv_regcache_ent *e = get(AT(50, 0), PS);
	cr_assert_eq(stats().entries, 0);
	cr_assert_eq(stats().uncached, 1);
	sv_regcache_put(rc, e);
	cr_assert_eq(ndereg, 1);
}

Test(regcache, lru_evicts_the_least_recently_used_idle_entry)
{
	sv_regcache_destroy(rc);
	make(2, 64u << 20, 0);
	struct sv_regcache_ent *a = get(AT(1, 0), 1), *b = get(AT(2, 0), 1);
	struct fake_mr *ma = mr_of(a), *mb = mr_of(b); /* b's entry is freed below */
	sv_regcache_put(rc, a);
	sv_regcache_put(rc, b);
	sv_regcache_put(rc, get(AT(1, 0), 1)); /* a is now the most recent */
	struct sv_regcache_ent *c = get(AT(3, 0), 1);
	cr_assert_eq(ndereg, 1);
	cr_assert(!mb->live, "b was the coldest");
	cr_assert(ma->live);
	sv_regcache_put(rc, c);
	struct sv_regcache_stats st = stats();
	cr_assert_eq(st.entries, 2);
	cr_assert_eq(st.evictions, 1);
}

Test(regcache, byte_bound_evicts_until_the_new_entry_fits)
{
	sv_regcache_destroy(rc);
	make(64, 4 * PS, 0);
	sv_regcache_put(rc, get(AT(0, 0), 2 * PS));
	sv_regcache_put(rc, get(AT(4, 0), PS));
	sv_regcache_put(rc, get(AT(8, 0), PS));
	cr_assert_eq(stats().bytes, 4 * PS);
	sv_regcache_put(rc, get(AT(12, 0), 2 * PS)); /* evicts the first (2 pages) */
	struct sv_regcache_stats st = stats();
	cr_assert_eq(st.evictions, 1);
	cr_assert_eq(st.bytes, 4 * PS);
	cr_assert_eq(st.entries, 3);
	struct sv_regcache_ent *big = get(AT(20, 0), 5 * PS); /* larger than the bound */
	cr_assert_eq(stats().uncached, 1);
	cr_assert_eq(stats().entries, 3);
	sv_regcache_put(rc, big);
}

Test(regcache, held_entries_are_never_evicted)
{
	sv_regcache_destroy(rc);
	make(1, 64u << 20, 0);
	struct sv_regcache_ent *a = get(AT(1, 0), 1);
	struct sv_regcache_ent *b = get(AT(2, 0), 1); /* no room: for one use */
	cr_assert(mr_of(a)->live);
	cr_assert_eq(stats().uncached, 1);
	cr_assert_eq(stats().evictions, 0);
	sv_regcache_put(rc, b);
	cr_assert_eq(ndereg, 1);
	sv_regcache_put(rc, a);
	cr_assert_eq(stats().entries, 1);
	cr_assert(mr_of(a)->live);
}

Test(regcache, invalidate_drops_idle_now_and_held_at_put)
{
	struct sv_regcache_ent *held = get(AT(40, 0), PS);
	sv_regcache_put(rc, get(AT(42, 0), PS));
	sv_regcache_put(rc, get(AT(60, 0), PS));
	sv_regcache_invalidate(rc, AT(40, 100), 3 * PS); /* overlaps 40 and 42 */
	cr_assert_eq(ndereg, 1, "the idle one at once");
	cr_assert(mr_of(held)->live);
	struct sv_regcache_stats st = stats();
	cr_assert_eq(st.invalidated, 2);
	cr_assert_eq(st.entries, 1);
	struct sv_regcache_ent *again = get(AT(40, 0), PS);
	cr_assert_neq(again, held, "no lookup finds an invalidated entry");
	sv_regcache_put(rc, held);
	cr_assert_eq(ndereg, 2);
	sv_regcache_put(rc, again);
	sv_regcache_put(rc, get(AT(60, 0), PS));
	cr_assert_eq(stats().hits, 1);
}

Test(regcache, flush_drops_only_idle_entries)
{
	struct sv_regcache_ent *held = get(AT(1, 0), 1);
	sv_regcache_put(rc, get(AT(2, 0), 1));
	sv_regcache_put(rc, get(AT(3, 0), 1));
	cr_assert_eq(sv_regcache_flush(rc), 2);
	cr_assert_eq(stats().entries, 1);
	sv_regcache_put(rc, held);
}

Test(regcache, out_of_memory_flushes_idle_entries_and_retries)
{
	sv_regcache_put(rc, get(AT(1, 0), 1));
	fail_reg[0] = -ENOMEM;
	struct sv_regcache_ent *e = get(AT(5, 0), 1);
	cr_assert_eq(ndereg, 1);
	sv_regcache_put(rc, e);
	fail_reg[0] = -ENOMEM; /* nothing idle to give back now but e */
	fail_reg[1] = -ENOMEM;
	struct sv_regcache_ent *f;
	cr_assert_eq(sv_regcache_get(rc, AT(9, 0), 1, &f), -ENOMEM);
	cr_assert_null(f);
	fail_reg[0] = -EINVAL;
	cr_assert_eq(sv_regcache_get(rc, AT(9, 0), 1, &f), -EINVAL);
	cr_assert_eq(sv_regcache_get(rc, AT(9, 0), 0, &f), -EINVAL);
}

Test(regcache, lost_page_identities_stop_caching)
{
	struct sv_regcache_ent *held = get(AT(1, 0), 1);
	sv_regcache_put(rc, get(AT(2, 0), 1));
	ids_err = -EBADF;
	struct sv_regcache_ent *e = get(AT(2, 0), 1); /* cannot check: not used */
	cr_assert_eq(stats().hits, 0);
	cr_assert_eq(stats().enabled, 0);
	cr_assert_eq(mr_of(e)->start, (uintptr_t)AT(2, 0));
	cr_assert_eq(mr_of(e)->len, 1);
	sv_regcache_put(rc, e);
	sv_regcache_put(rc, held);
	cr_assert_eq(stats().entries, 0, "dropped as they become idle");
	cr_assert_eq(nreg, ndereg);
	sv_regcache_put(rc, get(AT(3, 0), 1));
	cr_assert_eq(nreg, ndereg, "per send from now");
}

Test(regcache, destroy_deregisters_cached_entries)
{
	for (unsigned int p = 0; p < 10; p++)
		sv_regcache_put(rc, get(AT(p * 2, 0), 1));
	cr_assert_eq(stats().entries, 10);
	/* teardown checks nreg == ndereg after sv_regcache_destroy */
}

/* Threads sending from overlapping buffers while another remaps pages: an
 * entry is never deregistered while held, and everything ends balanced.
 * The remapper starts once every sender has, and the senders go on until
 * it has done all its remaps, so that they overlap however the threads are
 * scheduled. */
#define REMAPS 2000
#define SENDERS 4
static atomic_bool remaps_done;
static atomic_uint senders_started;

static void *sender(void *arg)
{
	unsigned int seed = (unsigned int)(uintptr_t)arg;
	atomic_fetch_add(&senders_started, 1);
	for (int i = 0; i < 3000 || !atomic_load(&remaps_done); i++) {
		unsigned int p = (unsigned int)rand_r(&seed) % 60;
		size_t len = 1 + (size_t)rand_r(&seed) % (3 * PS);
		const char *a = AT(p, rand_r(&seed) % PS);
		struct sv_regcache_ent *e;
		if (sv_regcache_get(rc, a, len, &e) < 0) {
			atomic_fetch_add(&bad_held, 1);
			continue;
		}
		struct fake_mr *m = mr_of(e);
		if (!(m->start <= (uintptr_t)a && (uintptr_t)a + len <= m->start + m->len))
			atomic_fetch_add(&bad_held, 1);
		sched_yield();
		if (!m->live)
			atomic_fetch_add(&bad_held, 1);
		sv_regcache_put(rc, e);
	}
	return NULL;
}

static void *remapper(void *arg)
{
	unsigned int seed = 7;
	while (atomic_load(&senders_started) < SENDERS)
		sched_yield();
	for (int i = 0; i < REMAPS; i++) {
		remap((unsigned int)rand_r(&seed) % 64);
		if (rand_r(&seed) % 16 == 0)
			sv_regcache_invalidate(rc, AT(rand_r(&seed) % 64, 0), PS);
		sched_yield();
	}
	atomic_store(&remaps_done, true);
	return NULL;
}

Test(regcache, concurrent_gets_puts_and_remaps)
{
	sv_regcache_destroy(rc);
	make(8, 24 * PS, 8 * PS);
	pthread_t t[SENDERS], m;
	cr_assert_eq(pthread_create(&m, NULL, remapper, NULL), 0);
	for (uintptr_t i = 0; i < SENDERS; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, sender, (void *)(i + 1)), 0);
	for (int i = 0; i < SENDERS; i++)
		pthread_join(t[i], NULL);
	pthread_join(m, NULL);
	cr_assert_eq(atomic_load(&bad_held), 0, "a held registration was not usable");
	struct sv_regcache_stats st = stats();
	cr_assert_leq(st.entries, 8);
	cr_assert_leq(st.bytes, 24 * PS);
	cr_assert_gt(st.hits, 0);
	cr_assert_gt(st.stale + st.invalidated, 0);
}

/* ---- The real page identities: /proc/self/pagemap ---------------------- */

/* A fake registration that holds real references on the pages, as a
 * registration's pin does: vmsplice() them into a pipe. */
struct pin {
	int fd[2];
};

static int pin_reg(void *ctx, void *addr, size_t len, void **mr, uint32_t *lkey)
{
	struct pin *p = malloc(sizeof(*p));
	if (!p || pipe(p->fd) < 0)
		return -errno;
	struct iovec iov = {.iov_base = addr, .iov_len = len};
	ssize_t n = vmsplice(p->fd[1], &iov, 1, 0);
	if (n != (ssize_t)len) {
		int r = n < 0 ? -errno : -EIO;
		close(p->fd[0]);
		close(p->fd[1]);
		free(p);
		return r;
	}
	*mr = p;
	*lkey = 1;
	__atomic_add_fetch(&nreg, 1, __ATOMIC_RELAXED);
	return 0;
}

static void pin_dereg(void *ctx, void *mr)
{
	struct pin *p = mr;
	close(p->fd[0]);
	close(p->fd[1]);
	free(p);
	__atomic_add_fetch(&ndereg, 1, __ATOMIC_RELAXED);
}

static const struct sv_regcache_ops pin_ops = {.reg = pin_reg, .dereg = pin_dereg};

static void make_real(void)
{
	sv_regcache_destroy(rc);
	struct sv_regcache_params prm = {.page_size = PS, .max_entries = 8, .max_bytes = 1u << 20};
	cr_assert_eq(sv_regcache_create(&rc, &pin_ops, NULL, &prm), 0);
}

static struct sv_regcache_ent *real_get(const void *addr, size_t len)
{
	struct sv_regcache_ent *e;
	int r = sv_regcache_get(rc, addr, len, &e);
	cr_assert_eq(r, 0, "get: %s", strerror(-r));
	return e;
}

Test(regcache, pagemap_sees_a_new_mapping_at_the_same_address)
{
	make_real();
	if (!stats().enabled) {
		/* No frame numbers for us (no CAP_SYS_ADMIN): never cached. */
		char buf[100] = {1};
		sv_regcache_put(rc, real_get(buf, sizeof(buf)));
		sv_regcache_put(rc, real_get(buf, sizeof(buf)));
		cr_assert_eq(stats().hits, 0);
		cr_assert_eq(stats().uncached, 2);
		cr_log_warn("no page frame numbers visible: only the uncached path was tested");
		return;
	}
	size_t len = 4 * PS;
	char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(buf, MAP_FAILED);
	memset(buf, 'a', len);
	sv_regcache_put(rc, real_get(buf, len));
	sv_regcache_put(rc, real_get(buf + 100, 200));
	cr_assert_eq(stats().hits, 1);
	cr_assert_eq(stats().misses, 1);

	/* free() of a large block, then malloc() at the same address. */
	cr_assert_eq(munmap(buf, len), 0);
	char *again = mmap(buf, len, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	cr_assert_eq(again, buf);
	struct sv_regcache_ent *e = real_get(buf, len); /* not populated yet */
	cr_assert_eq(stats().stale, 1);
	cr_assert_eq(stats().uncached, 1);
	sv_regcache_put(rc, e);
	memset(buf, 'b', len); /* populated now, by other pages than the pinned ones */
	sv_regcache_put(rc, real_get(buf, len));
	cr_assert_eq(stats().hits, 1);
	cr_assert_eq(stats().misses, 2);

	/* MADV_DONTNEED replaces pages without any unmap. */
	cr_assert_eq(madvise(buf, PS, MADV_DONTNEED), 0);
	buf[0] = 'c';
	sv_regcache_put(rc, real_get(buf, 10));
	cr_assert_eq(stats().stale, 2);
	cr_assert_eq(stats().misses, 3);
	sv_regcache_destroy(rc);
	rc = NULL;
	munmap(buf, len);
}

Test(regcache, pagemap_is_not_trusted_after_fork)
{
	make_real();
	if (!stats().enabled)
		return;
	char *buf = aligned_alloc(PS, PS);
	memset(buf, 1, PS);
	sv_regcache_put(rc, real_get(buf, PS));
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct sv_regcache_ent *e;
		int r = sv_regcache_get(rc, buf, PS, &e);
		struct sv_regcache_stats st;
		sv_regcache_get_stats(rc, &st);
		if (r != 0 || st.hits != 0 || st.enabled)
			_exit(1);
		/* A cache the child makes itself reads the child's pages. */
		struct sv_regcache *mine;
		struct sv_regcache_params prm = {.page_size = PS, .max_entries = 8,
						 .max_bytes = 1u << 20};
		if (sv_regcache_create(&mine, &pin_ops, NULL, &prm) != 0)
			_exit(2);
		for (int i = 0; i < 2; i++) {
			if (sv_regcache_get(mine, buf, PS, &e) != 0)
				_exit(3);
			sv_regcache_put(mine, e);
		}
		sv_regcache_get_stats(mine, &st);
		_exit(st.enabled && st.hits == 1 ? 0 : 4);
	}
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "child: status %d (1: used the parent's page tables; 4: no cache of its own)",
		  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	sv_regcache_put(rc, real_get(buf, PS));
	cr_assert_eq(stats().hits, 1, "the parent keeps its cache");
	sv_regcache_destroy(rc);
	rc = NULL;
	free(buf);
}
