/* SOVIA's conditional registration, measured: for each write size, what it
 * costs to copy the bytes into a pre-registered buffer versus sending them
 * from the application's buffer. The crossover (the smallest size from
 * which not copying is cheaper) is where SOVIA_REG_THRESHOLD belongs.
 * Needs an RDMA device (the test bed has one).
 *
 * Columns, microseconds per write of `bytes` bytes:
 *   copy_us       one memcpy of the bytes
 *   reg+dereg_us  ibv_reg_mr + ibv_dereg_mr of the whole buffer as one region
 *   copymsg_us    the copy path's work: memcpy of each message's piece into
 *                 the next of 32 send buffers
 *   permsg_us     reg + dereg of each message's piece (payload = buffer size
 *                 - header), as the transport did without a cache
 *   cold_us       the registration cache (regcache.c) with a buffer it has
 *                 never seen: drop the idle entries, then get + put each piece
 *   hit_us        the cache warm: get + put of each piece (lookup and the
 *                 pagemap check only)
 * The crossovers compare with copymsg_us. A header line gives what single
 * system calls cost here: the cache's check is two of them (fstat, pread).
 *
 *   sovia-regcost [-d DEVICE] [-r ROUNDS] [-b BUF_SIZE] */
#include "proto.h"
#include "regcache.h"

#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The transport's registration: read access only, LOCAL_WRITE if refused. */
static struct ibv_mr *reg_send(struct ibv_pd *pd, void *addr, size_t len)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, 0);
	return mr ? mr : ibv_reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
}

static int op_reg(void *ctx, void *addr, size_t len, void **mr, uint32_t *lkey)
{
	struct ibv_mr *m = reg_send(ctx, addr, len);
	if (!m)
		return errno ? -errno : -EIO;
	*mr = m;
	*lkey = m->lkey;
	return 0;
}

static void op_dereg(void *ctx, void *mr)
{
	ibv_dereg_mr(mr);
}

static const struct sv_regcache_ops ops = {.reg = op_reg, .dereg = op_dereg};

/* Register and deregister each piece of [buf, buf + sz). */
static int per_msg(struct ibv_pd *pd, char *buf, size_t sz, size_t piece)
{
	for (size_t off = 0; off < sz; off += piece) {
		size_t l = sz - off < piece ? sz - off : piece;
		struct ibv_mr *mr = reg_send(pd, buf + off, l);
		if (!mr)
			return -1;
		ibv_dereg_mr(mr);
	}
	return 0;
}

/* Get and put each piece of [buf, buf + sz) through the cache. */
static int cached(struct sv_regcache *rc, char *buf, size_t sz, size_t piece)
{
	for (size_t off = 0; off < sz; off += piece) {
		size_t l = sz - off < piece ? sz - off : piece;
		struct sv_regcache_ent *e;
		int r = sv_regcache_get(rc, buf + off, l, &e);
		if (r < 0) {
			fprintf(stderr, "sovia-regcost: sv_regcache_get: %s\n", strerror(-r));
			return -1;
		}
		sv_regcache_put(rc, e);
	}
	return 0;
}

/* Copy each piece of [src, src + sz) into the next send buffer. */
static void copy_msg(char *pool, size_t buf_size, const char *src, size_t sz, size_t piece)
{
	unsigned int slot = 0;
	for (size_t off = 0; off < sz; off += piece) {
		size_t l = sz - off < piece ? sz - off : piece;
		memcpy(pool + (size_t)slot * buf_size + SV_HDR_SIZE, src + off, l);
		slot = (slot + 1) % 32;
	}
	__asm__ volatile("" ::: "memory");
}

#define NSIZES 13

/* Where `cost` beats `copy`: the first size, and the size from which it
 * does at every larger size measured. */
static void crossover(const char *what, const double *cost, const double *copy,
		      const size_t *sizes)
{
	int first = -1, from = -1;
	for (int i = 0; i < NSIZES; i++) {
		if (cost[i] <= copy[i]) {
			if (first < 0)
				first = i;
			if (from < 0)
				from = i;
		} else {
			from = -1;
		}
	}
	if (first < 0)
		printf("crossover %-10s: the copy path is cheaper at every size\n", what);
	else if (from < 0)
		printf("crossover %-10s: cheaper from %zu bytes, but not at the largest size\n",
		       what, sizes[first]);
	else
		printf("crossover %-10s: cheaper from %zu bytes, at every size from %zu bytes\n",
		       what, sizes[first], sizes[from]);
}

/* Microseconds per call of a few system calls, to read the tables with. */
static void syscall_costs(int rounds)
{
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	uint64_t ent;
	struct stat sb;
	double t0 = now_us();
	for (int i = 0; i < rounds; i++)
		syscall(SYS_getppid);
	double sys = (now_us() - t0) / rounds;
	t0 = now_us();
	for (int i = 0; i < rounds; i++)
		fstat(fd, &sb);
	double st = (now_us() - t0) / rounds;
	t0 = now_us();
	off_t off = (off_t)((uintptr_t)&ent / 4096 * 8);
	for (int i = 0; i < rounds; i++)
		if (pread(fd, &ent, 8, off) != 8)
			break;
	double pr = (now_us() - t0) / rounds;
	printf("# one system call: getppid %.2f us, fstat %.2f us, pread of one pagemap entry "
	       "%.2f us\n",
	       sys, st, pr);
	if (fd >= 0)
		close(fd);
}

int main(int argc, char **argv)
{
	const char *want = NULL;
	int rounds = 200, o;
	size_t buf_size = 32768;
	while ((o = getopt(argc, argv, "d:r:b:")) != -1) {
		if (o == 'd')
			want = optarg;
		else if (o == 'r')
			rounds = atoi(optarg);
		else if (o == 'b')
			buf_size = strtoul(optarg, NULL, 0);
		else
			return 1;
	}
	if (rounds < 1 || buf_size <= SV_HDR_SIZE) {
		fprintf(stderr, "sovia-regcost: bad -r or -b\n");
		return 1;
	}
	const size_t piece = buf_size - SV_HDR_SIZE;
	int n;
	struct ibv_device **devs = ibv_get_device_list(&n);
	struct ibv_device *dev = NULL;
	for (int i = 0; devs && i < n; i++)
		if (!want || strcmp(ibv_get_device_name(devs[i]), want) == 0)
			dev = devs[i];
	if (!dev) {
		fprintf(stderr, "sovia-regcost: no RDMA device\n");
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd) {
		fprintf(stderr, "sovia-regcost: cannot open %s\n", ibv_get_device_name(dev));
		return 1;
	}
	const size_t max = 4u << 20;
	char *src = aligned_alloc(4096, max), *dst = aligned_alloc(4096, max);
	char *pool = aligned_alloc(4096, 32 * buf_size);
	memset(src, 1, max);
	memset(dst, 2, max);
	memset(pool, 3, 32 * buf_size);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, max, IBV_ACCESS_LOCAL_WRITE);
	if (!dmr) {
		perror("sovia-regcost: ibv_reg_mr");
		return 1;
	}
	struct sv_regcache_params prm;
	sv_regcache_default_params(&prm);
	struct sv_regcache *rc;
	int r = sv_regcache_create(&rc, &ops, pd, &prm);
	if (r < 0) {
		fprintf(stderr, "sovia-regcost: sv_regcache_create: %s\n", strerror(-r));
		return 1;
	}
	struct sv_regcache_stats st;
	sv_regcache_get_stats(rc, &st);
	printf("# device %s, %d rounds per size (a tenth from 1 MiB), message payload %zu bytes "
	       "(buffer size %zu)\n",
	       ibv_get_device_name(dev), rounds, piece, buf_size);
	printf("# regcache: %s, window %zu bytes, at most %u entries / %zu bytes\n",
	       st.enabled ? "caching" : "NOT caching (no page frame numbers)", prm.window,
	       prm.max_entries, prm.max_bytes);
	syscall_costs(rounds * 10);
	printf("%10s %10s %13s %9s %11s %11s %11s %11s\n", "bytes", "copy_us", "reg+dereg_us",
	       "reg/copy", "copymsg_us", "permsg_us", "cold_us", "hit_us");
	fflush(stdout);
	size_t sizes[NSIZES];
	double v_copy[NSIZES], v_reg[NSIZES], v_msg[NSIZES], v_cold[NSIZES], v_hit[NSIZES];
	int si = 0;
	for (size_t sz = 1024; sz <= max && si < NSIZES; sz *= 2, si++) {
		int k = sz >= (1u << 20) ? rounds / 10 + 1 : rounds;
		double t0 = now_us();
		for (int i = 0; i < k; i++) {
			memcpy(dst, src + (i & 1), sz - 1);
			__asm__ volatile("" ::: "memory");
		}
		double copy = (now_us() - t0) / k;
		t0 = now_us();
		for (int i = 0; i < k; i++) {
			struct ibv_mr *mr = ibv_reg_mr(pd, src, sz, IBV_ACCESS_LOCAL_WRITE);
			if (!mr) {
				perror("sovia-regcost: ibv_reg_mr");
				return 1;
			}
			ibv_dereg_mr(mr);
		}
		double reg = (now_us() - t0) / k;
		t0 = now_us();
		for (int i = 0; i < k; i++)
			copy_msg(pool, buf_size, src + (i & 1), sz - 1, piece);
		double cmsg = (now_us() - t0) / k;
		t0 = now_us();
		for (int i = 0; i < k; i++)
			if (per_msg(pd, src, sz, piece) < 0) {
				perror("sovia-regcost: ibv_reg_mr (piece)");
				return 1;
			}
		double msg = (now_us() - t0) / k;
		t0 = now_us();
		for (int i = 0; i < k; i++) {
			sv_regcache_flush(rc);
			if (cached(rc, src, sz, piece) < 0)
				return 1;
		}
		double cold = (now_us() - t0) / k;
		/* Warm up (the last cold round already did), then time hits. */
		if (cached(rc, src, sz, piece) < 0)
			return 1;
		t0 = now_us();
		for (int i = 0; i < k; i++)
			if (cached(rc, src, sz, piece) < 0)
				return 1;
		double hit = (now_us() - t0) / k;
		printf("%10zu %10.2f %13.2f %9.2f %11.2f %11.2f %11.2f %11.2f\n", sz, copy, reg,
		       reg / copy, cmsg, msg, cold, hit);
		fflush(stdout);
		sizes[si] = sz;
		v_copy[si] = cmsg;
		v_reg[si] = reg;
		v_msg[si] = msg;
		v_cold[si] = cold;
		v_hit[si] = hit;
	}
	sv_regcache_get_stats(rc, &st);
	printf("# regcache: %llu hits, %llu misses, %llu stale, %llu uncached, %llu evicted\n",
	       (unsigned long long)st.hits, (unsigned long long)st.misses,
	       (unsigned long long)st.stale, (unsigned long long)st.uncached,
	       (unsigned long long)st.evictions);
	crossover("reg+dereg", v_reg, v_copy, sizes);
	crossover("per-msg", v_msg, v_copy, sizes);
	crossover("cold", v_cold, v_copy, sizes);
	crossover("hit", v_hit, v_copy, sizes);
	sv_regcache_destroy(rc);
	ibv_dereg_mr(dmr);
	free(pool);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(devs);
	return 0;
}
