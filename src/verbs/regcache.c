/* The registration cache: see regcache.h for the interface.
 *
 * The hazard. A registration pins the physical pages that backed its
 * virtual range when it was made. The application may free() and unmap
 * that memory, and a later malloc() may put other pages at the same
 * addresses: a cached registration found by address would then send the
 * bytes of the old pages. Intercepting the unmaps is not enough: glibc's
 * free() returns memory with munmap, madvise(MADV_DONTNEED) and brk through
 * internal system calls that no LD_PRELOAD wrapper sees, and other
 * allocators do the same; writes after fork() (copy-on-write) and
 * MADV_DONTNEED/FREE replace pages without any unmap at all.
 * IBV_ACCESS_ON_DEMAND would make the kernel follow such changes, but rxe
 * (and many devices) do not offer it.
 *
 * The resolution: check the fact itself on every use. Before a cached
 * registration is used for a send, the identities (page frame numbers, from
 * /proc/self/pagemap) of the pages now mapped at the send's addresses are
 * compared with the ones recorded when the registration was made; any
 * difference, or a page not present, and the registration is dropped and a
 * new one made. An equal frame number means the very same physical page:
 * the registration holds a pin on each of its pages, so none of them can be
 * freed and handed out again while the entry exists, and an address that
 * maps one of them now is one whose loads and stores the send will see.
 * The identities are recorded only when they read the same before and
 * after the registration (so they are the pages it pinned), and only for
 * pages that were present (registering never populates memory the
 * application did not touch). The check is an fstat() and a pread() of 8
 * bytes per page of the send; from the check to the completion the
 * application is inside its write() (a zero-copy write returns only once
 * its sends completed), so the pages are the application's to keep, exactly
 * as with a registration made for the send.
 *
 * Frame numbers are shown only to CAP_SYS_ADMIN (since Linux 4.2 the field
 * reads 0 otherwise): without them the cache does not cache at all, every
 * send registers and every completion deregisters, as before. It also
 * stops for good when the pagemap file is no longer ours (a child after
 * fork(): the inherited descriptor reads the parent's page tables, told by
 * a MADV_WIPEONFORK page; an application that closed our descriptor, told
 * by fstat()). sv_regcache_invalidate (for an unmap hook) only gives pinned
 * memory back earlier; nothing relies on it.
 *
 * Bookkeeping: cached entries sit on one LRU list, most recently used
 * first; a lookup scans it for an entry containing the whole request (the
 * list is short: at most max_entries). Entries are refcounted by the sends
 * using them; eviction takes idle entries from the cold end only, and an
 * entry dropped while held (stale, invalidated) is deregistered at its last
 * put. The lock is never held across a callback. */
#include "ownfd.h"
#include "real.h"
#include "regcache.h"

#include "lock.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PM_PRESENT (1ULL << 63)
#define PM_PFN_MASK ((1ULL << 55) - 1)
#define IDS_ON_STACK 256

struct sv_regcache_ent {
	struct sv_regcache_ent *prev, *next; /* the LRU list, while cached */
	uintptr_t start, end;                /* page-aligned while cached */
	void *mr;
	uint32_t lkey;
	unsigned int refs;
	bool cached; /* on the list, found by lookups */
	uint64_t ids[]; /* the page identities at registration (cached entries) */
};

struct sv_regcache {
	struct sv_lock lock;
	struct sv_regcache_ops ops;
	void *ctx;
	struct sv_regcache_params prm;
	struct sv_regcache_ent *head, *tail;
	uint32_t nent;
	size_t bytes;
	atomic_bool enabled;
	struct sv_regcache_stats st; /* counters; entries/bytes/enabled filled on read */
	int pm_fd;                   /* /proc/self/pagemap, or -1 */
	volatile uint32_t *pm_token; /* 1, read as 0 in a child (MADV_WIPEONFORK) */
	size_t pm_token_len;
	pid_t pm_pid; /* without the token: compare getpid() */
	dev_t pm_dev;
	ino_t pm_ino;
};

/* ---- Page identities --------------------------------------------------- */

/* After fork() the pagemap descriptor still reads the parent's page tables.
 * A child is told without a system call on every check: a page marked
 * MADV_WIPEONFORK reads as zeros in any child, however it was created
 * (fork, _Fork, clone without CLONE_VM). Kernels without it (before 4.14):
 * compare getpid(). */
static void fork_token_init(struct sv_regcache *rc)
{
	rc->pm_pid = getpid();
	size_t len = rc->prm.page_size;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return;
	if (madvise(p, len, MADV_WIPEONFORK) < 0) {
		munmap(p, len);
		return;
	}
	rc->pm_token = p;
	rc->pm_token_len = len;
	*rc->pm_token = 1;
}

static bool forked(const struct sv_regcache *rc)
{
	return rc->pm_token ? *rc->pm_token != 1 : getpid() != rc->pm_pid;
}

static int pagemap_ids(struct sv_regcache *rc, uintptr_t start, size_t npages, uint64_t *ids)
{
	if (rc->pm_fd < 0)
		return -ENOENT;
	if (forked(rc))
		return -ECHILD;
	/* The application may have closed our descriptor (and reused its
	 * number): read only the file we opened. */
	struct stat sb;
	if (fstat(rc->pm_fd, &sb) < 0 || sb.st_dev != rc->pm_dev || sb.st_ino != rc->pm_ino)
		return -EBADF;
	size_t want = npages * sizeof(uint64_t), got = 0;
	off_t off = (off_t)(start / rc->prm.page_size * sizeof(uint64_t));
	while (got < want) {
		ssize_t n = pread(rc->pm_fd, (char *)ids + got, want - got, off + (off_t)got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		got += (size_t)n;
	}
	for (size_t i = 0; i < npages; i++)
		ids[i] = (ids[i] & PM_PRESENT) ? ids[i] & PM_PFN_MASK : 0;
	return 0;
}

static int page_ids(struct sv_regcache *rc, uintptr_t start, size_t npages, uint64_t *ids)
{
	int r = rc->ops.page_ids ? rc->ops.page_ids(rc->ctx, start, npages, ids)
				 : pagemap_ids(rc, start, npages, ids);
	if (r < 0 && atomic_exchange(&rc->enabled, false))
		sv_info("regcache: page identities unavailable (%s): registering per send from now",
			strerror(-r));
	return r;
}

/* Open the pagemap and see whether it shows frame numbers to us. */
static void pagemap_open(struct sv_regcache *rc)
{
	/* One of libsovia's own fds: above the application's range, kept from
	 * its close-all loops (ownfd.h), which would stop the cache for good. */
	rc->pm_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (rc->pm_fd >= 0)
		rc->pm_fd = sv_ownfd_move(rc->pm_fd);
	struct stat sb;
	if (rc->pm_fd < 0 || fstat(rc->pm_fd, &sb) < 0) {
		sv_info("regcache: /proc/self/pagemap: %s: registering per send", strerror(errno));
		atomic_store(&rc->enabled, false);
		return;
	}
	fork_token_init(rc);
	rc->pm_dev = sb.st_dev;
	rc->pm_ino = sb.st_ino;
	/* rc itself was just written: its page is present. */
	uintptr_t probe = (uintptr_t)rc & ~(uintptr_t)(rc->prm.page_size - 1);
	uint64_t id = 0;
	if (pagemap_ids(rc, probe, 1, &id) < 0 || id == 0) {
		sv_info("regcache: no page frame numbers in /proc/self/pagemap (needs "
			"CAP_SYS_ADMIN): registering per send");
		atomic_store(&rc->enabled, false);
	}
}

/* ---- The list (under the lock) ------------------------------------------ */

static void unlink_ent(struct sv_regcache *rc, struct sv_regcache_ent *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		rc->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		rc->tail = e->prev;
	e->prev = e->next = NULL;
	e->cached = false;
	rc->nent--;
	rc->bytes -= e->end - e->start;
}

static void push_front(struct sv_regcache *rc, struct sv_regcache_ent *e)
{
	e->prev = NULL;
	e->next = rc->head;
	if (rc->head)
		rc->head->prev = e;
	else
		rc->tail = e;
	rc->head = e;
}

static void link_ent(struct sv_regcache *rc, struct sv_regcache_ent *e)
{
	push_front(rc, e);
	e->cached = true;
	rc->nent++;
	rc->bytes += e->end - e->start;
}

static void touch(struct sv_regcache *rc, struct sv_regcache_ent *e)
{
	if (rc->head == e)
		return;
	e->prev->next = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		rc->tail = e->prev;
	push_front(rc, e);
}

/* Make room for one more entry of `add` bytes by taking idle entries from
 * the cold end onto *victims (chained by next). False, and nothing taken,
 * when that cannot be done. */
static bool make_room(struct sv_regcache *rc, size_t add, struct sv_regcache_ent **victims)
{
	if (rc->prm.max_entries == 0 || add > rc->prm.max_bytes)
		return false;
	uint32_t n = rc->nent;
	size_t bytes = rc->bytes;
	struct sv_regcache_ent *e;
	for (e = rc->tail; e && (n + 1 > rc->prm.max_entries || bytes + add > rc->prm.max_bytes);
	     e = e->prev) {
		if (e->refs)
			continue;
		n--;
		bytes -= e->end - e->start;
	}
	if (n + 1 > rc->prm.max_entries || bytes + add > rc->prm.max_bytes)
		return false;
	for (e = rc->tail; e && (rc->nent + 1 > rc->prm.max_entries ||
				 rc->bytes + add > rc->prm.max_bytes);) {
		struct sv_regcache_ent *prev = e->prev;
		if (!e->refs) {
			unlink_ent(rc, e);
			e->next = *victims;
			*victims = e;
			rc->st.evictions++;
		}
		e = prev;
	}
	return true;
}

static void free_ent(struct sv_regcache *rc, struct sv_regcache_ent *e)
{
	rc->ops.dereg(rc->ctx, e->mr);
	free(e);
}

static void free_chain(struct sv_regcache *rc, struct sv_regcache_ent *e)
{
	while (e) {
		struct sv_regcache_ent *next = e->next;
		free_ent(rc, e);
		e = next;
	}
}

/* ---- Registering -------------------------------------------------------- */

static int reg_retry(struct sv_regcache *rc, uintptr_t start, size_t len, void **mr,
		     uint32_t *lkey)
{
	int r = rc->ops.reg(rc->ctx, (void *)start, len, mr, lkey);
	/* Out of lockable memory: give back what idle entries pin, once. */
	if ((r == -ENOMEM || r == -EAGAIN) && sv_regcache_flush(rc) > 0)
		r = rc->ops.reg(rc->ctx, (void *)start, len, mr, lkey);
	return r;
}

/* A registration of exactly the request, for one use. */
static int get_once(struct sv_regcache *rc, uintptr_t a, size_t len, struct sv_regcache_ent **out)
{
	struct sv_regcache_ent *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	int r = reg_retry(rc, a, len, &e->mr, &e->lkey);
	if (r < 0) {
		free(e);
		return r;
	}
	e->start = a;
	e->end = a + len;
	e->refs = 1;
	sv_lock(&rc->lock);
	rc->st.uncached++;
	sv_unlock(&rc->lock);
	*out = e;
	return 0;
}

/* No valid entry: register the request's pages and the present pages that
 * follow them, up to `window` bytes from the first (sends from a large
 * buffer go forward, one message-sized piece at a time: the next pieces
 * hit), and cache the registration if its pages read the same before and
 * after. */
static int get_miss(struct sv_regcache *rc, uintptr_t a, uintptr_t end,
		    struct sv_regcache_ent **out)
{
	const size_t ps = rc->prm.page_size;
	const size_t w = rc->prm.window > ps ? rc->prm.window : ps;
	uintptr_t pstart = a & ~(uintptr_t)(ps - 1), pend = (end + ps - 1) & ~(uintptr_t)(ps - 1);
	uintptr_t wend = pstart + w;
	if (wend < pend || wend < pstart) /* a longer request, or the top of the address space */
		wend = pend;
	/* n pages read from pstart, the request's are the first nreq */
	size_t nw = (wend - pstart) / ps, nreq = (pend - pstart) / ps;
	uint64_t *pre = malloc(2 * nw * sizeof(uint64_t));
	if (!pre)
		return -ENOMEM;
	uint64_t *post = pre + nw;
	struct sv_regcache_ent *e = NULL, *victims = NULL;
	int r = page_ids(rc, pstart, nw, pre);
	for (size_t i = 0; r == 0 && i < nreq; i++)
		if (!pre[i])
			r = -ENOENT; /* a page not populated yet: nothing to cache */
	if (r < 0) {
		free(pre);
		return get_once(rc, a, end - a, out);
	}
	size_t n = nreq;
	while (n < nw && pre[n] && (n + 1) * ps <= rc->prm.max_bytes)
		n++;
	void *mr;
	uint32_t lkey;
	r = reg_retry(rc, pstart, n * ps, &mr, &lkey);
	if (r < 0 && n != nreq) {
		/* Some page after ours (device memory, say) refused: just ours. */
		n = nreq;
		r = reg_retry(rc, pstart, n * ps, &mr, &lkey);
	}
	if (r < 0)
		goto out;
	e = calloc(1, sizeof(*e) + n * sizeof(uint64_t));
	if (!e) {
		rc->ops.dereg(rc->ctx, mr);
		r = -ENOMEM;
		goto out;
	}
	e->mr = mr;
	e->lkey = lkey;
	e->start = pstart;
	e->end = pstart + n * ps;
	e->refs = 1;
	memcpy(e->ids, pre, n * sizeof(uint64_t));
	bool same = page_ids(rc, pstart, n, post) == 0 &&
		    memcmp(pre, post, n * sizeof(uint64_t)) == 0;
	sv_lock(&rc->lock);
	if (same && atomic_load(&rc->enabled) && make_room(rc, e->end - e->start, &victims)) {
		link_ent(rc, e);
		rc->st.misses++;
	} else {
		rc->st.uncached++;
	}
	sv_unlock(&rc->lock);
	free_chain(rc, victims);
	*out = e;
out:
	free(pre);
	return r;
}

/* The most recently used cached entry containing [a, end), held. */
static struct sv_regcache_ent *lookup(struct sv_regcache *rc, uintptr_t a, uintptr_t end)
{
	sv_lock(&rc->lock);
	struct sv_regcache_ent *e;
	for (e = rc->head; e; e = e->next)
		if (e->start <= a && end <= e->end)
			break;
	if (e) {
		e->refs++;
		touch(rc, e);
		rc->st.hits++; /* taken back below if it is stale */
	}
	sv_unlock(&rc->lock);
	return e;
}

/* Do the pages at [pstart, pstart + n pages) still match the entry's? */
static bool still_same(struct sv_regcache *rc, const struct sv_regcache_ent *e, uintptr_t pstart,
		       size_t n)
{
	uint64_t stack_ids[IDS_ON_STACK];
	uint64_t *ids = n <= IDS_ON_STACK ? stack_ids : malloc(n * sizeof(uint64_t));
	if (!ids)
		return false;
	bool same = page_ids(rc, pstart, n, ids) == 0 &&
		    memcmp(ids, e->ids + (pstart - e->start) / rc->prm.page_size,
			   n * sizeof(uint64_t)) == 0;
	if (ids != stack_ids)
		free(ids);
	return same;
}

int sv_regcache_get(struct sv_regcache *rc, const void *addr, size_t len,
		    struct sv_regcache_ent **out)
{
	*out = NULL;
	uintptr_t a = (uintptr_t)addr, end = a + len;
	if (len == 0 || end < a || end > UINTPTR_MAX - rc->prm.page_size)
		return -EINVAL;
	if (!atomic_load(&rc->enabled))
		return get_once(rc, a, len, out);
	const size_t ps = rc->prm.page_size;
	uintptr_t pstart = a & ~(uintptr_t)(ps - 1), pend = (end + ps - 1) & ~(uintptr_t)(ps - 1);
	struct sv_regcache_ent *e;
	/* Each stale entry found leaves the list: this ends. */
	while ((e = lookup(rc, a, end))) {
		if (still_same(rc, e, pstart, (pend - pstart) / ps)) {
			*out = e;
			return 0;
		}
		sv_lock(&rc->lock);
		rc->st.hits--;
		rc->st.stale++;
		if (e->cached)
			unlink_ent(rc, e);
		bool last = --e->refs == 0;
		sv_unlock(&rc->lock);
		if (last)
			free_ent(rc, e);
		if (!atomic_load(&rc->enabled))
			return get_once(rc, a, len, out);
	}
	return get_miss(rc, a, end, out);
}

uint32_t sv_regcache_lkey(const struct sv_regcache_ent *e)
{
	return e->lkey;
}

void sv_regcache_put(struct sv_regcache *rc, struct sv_regcache_ent *e)
{
	if (!e)
		return;
	sv_lock(&rc->lock);
	bool last = --e->refs == 0;
	if (last && e->cached && !atomic_load(&rc->enabled))
		unlink_ent(rc, e);
	bool drop = last && !e->cached;
	sv_unlock(&rc->lock);
	if (drop)
		free_ent(rc, e);
}

/* ---- Dropping ----------------------------------------------------------- */

void sv_regcache_invalidate(struct sv_regcache *rc, const void *addr, size_t len)
{
	uintptr_t a = (uintptr_t)addr, end = a + len < a ? UINTPTR_MAX : a + len;
	struct sv_regcache_ent *victims = NULL;
	sv_lock(&rc->lock);
	for (struct sv_regcache_ent *e = rc->head, *next; e; e = next) {
		next = e->next;
		if (e->end <= a || end <= e->start)
			continue;
		unlink_ent(rc, e);
		rc->st.invalidated++;
		if (!e->refs) {
			e->next = victims;
			victims = e;
		}
	}
	sv_unlock(&rc->lock);
	free_chain(rc, victims);
}

unsigned int sv_regcache_flush(struct sv_regcache *rc)
{
	struct sv_regcache_ent *victims = NULL;
	unsigned int n = 0;
	sv_lock(&rc->lock);
	for (struct sv_regcache_ent *e = rc->head, *next; e; e = next) {
		next = e->next;
		if (e->refs)
			continue;
		unlink_ent(rc, e);
		e->next = victims;
		victims = e;
		n++;
	}
	sv_unlock(&rc->lock);
	free_chain(rc, victims);
	return n;
}

void sv_regcache_disable(struct sv_regcache *rc)
{
	atomic_store(&rc->enabled, false);
	sv_regcache_flush(rc);
}

void sv_regcache_get_stats(struct sv_regcache *rc, struct sv_regcache_stats *st)
{
	sv_lock(&rc->lock);
	*st = rc->st;
	st->entries = rc->nent;
	st->bytes = rc->bytes;
	st->enabled = atomic_load(&rc->enabled);
	sv_unlock(&rc->lock);
}

/* ---- Create, destroy ---------------------------------------------------- */

void sv_regcache_default_params(struct sv_regcache_params *prm)
{
	long page = sysconf(_SC_PAGESIZE);
	*prm = (struct sv_regcache_params){
		.page_size = page > 0 ? (size_t)page : 4096,
		.max_entries = 64,
		.max_bytes = 32u << 20,
		.window = 256u << 10,
	};
	/* Pinned memory counts against RLIMIT_MEMLOCK unless the process has
	 * CAP_IPC_LOCK: leave most of it to the connections' buffer pools. */
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	if (sv_real_syscall()(SYS_capget, &h, d) == 0 && (d[0].effective & (1u << CAP_IPC_LOCK)))
		return;
	struct rlimit rl;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur / 4 < prm->max_bytes)
		prm->max_bytes = (size_t)(rl.rlim_cur / 4);
}

int sv_regcache_create(struct sv_regcache **out, const struct sv_regcache_ops *ops, void *ctx,
		       const struct sv_regcache_params *prm)
{
	*out = NULL;
	size_t ps = prm->page_size;
	if (!ops || !ops->reg || !ops->dereg)
		return -EINVAL;
	if (ps == 0) {
		long page = sysconf(_SC_PAGESIZE);
		ps = page > 0 ? (size_t)page : 4096;
	}
	if (ps & (ps - 1))
		return -EINVAL;
	struct sv_regcache *rc = calloc(1, sizeof(*rc));
	if (!rc)
		return -ENOMEM;
	sv_lock_init(&rc->lock, SV_RANK_REGCACHE);
	rc->ops = *ops;
	rc->ctx = ctx;
	rc->prm = *prm;
	rc->prm.page_size = ps;
	if (rc->prm.window % ps)
		rc->prm.window += ps - rc->prm.window % ps;
	rc->pm_fd = -1;
	atomic_init(&rc->enabled, true);
	if (!ops->page_ids)
		pagemap_open(rc);
	*out = rc;
	return 0;
}

void sv_regcache_destroy(struct sv_regcache *rc)
{
	if (!rc)
		return;
	struct sv_regcache_ent *e = rc->head;
	sv_dbg("regcache: %llu hits, %llu misses, %llu stale, %llu uncached, %llu evicted, "
	       "%llu invalidated",
	       (unsigned long long)rc->st.hits, (unsigned long long)rc->st.misses,
	       (unsigned long long)rc->st.stale, (unsigned long long)rc->st.uncached,
	       (unsigned long long)rc->st.evictions, (unsigned long long)rc->st.invalidated);
	while (e) {
		struct sv_regcache_ent *next = e->next;
		if (e->refs)
			sv_warn("regcache: registration of %#lx..%#lx still held at destroy",
				(unsigned long)e->start, (unsigned long)e->end);
		free_ent(rc, e);
		e = next;
	}
	if (rc->pm_fd >= 0)
		sv_ownfd_close(rc->pm_fd);
	if (rc->pm_token)
		munmap((void *)rc->pm_token, rc->pm_token_len);
	sv_lock_destroy(&rc->lock);
	free(rc);
}
