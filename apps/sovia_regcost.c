/* SOVIA's conditional registration, measured: for each write size, what it
 * costs to copy the bytes into a pre-registered buffer versus registering
 * and deregistering the application's buffer for a zero-copy send. The
 * crossover (the smallest size from which registering is cheaper) is where
 * SOVIA_REG_THRESHOLD belongs. Needs an RDMA device (the test bed has one).
 *
 *   sovia-regcost [-d DEVICE] [-r ROUNDS] */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
	const char *want = NULL;
	int rounds = 200, o;
	while ((o = getopt(argc, argv, "d:r:")) != -1) {
		if (o == 'd')
			want = optarg;
		else if (o == 'r')
			rounds = atoi(optarg);
		else
			return 1;
	}
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
	memset(src, 1, max);
	memset(dst, 2, max);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, max, IBV_ACCESS_LOCAL_WRITE);
	if (!dmr) {
		perror("sovia-regcost: ibv_reg_mr");
		return 1;
	}
	printf("# device %s, %d rounds per size\n", ibv_get_device_name(dev), rounds);
	printf("%10s %14s %14s %10s\n", "bytes", "copy_us", "reg+dereg_us", "reg/copy");
	size_t crossover = 0;
	for (size_t sz = 1024; sz <= max; sz *= 2) {
		int r = sz >= (1u << 20) ? rounds / 10 + 1 : rounds;
		double t0 = now_us();
		for (int i = 0; i < r; i++) {
			memcpy(dst, src + (i & 1), sz - 1);
			__asm__ volatile("" ::: "memory");
		}
		double copy = (now_us() - t0) / r;
		t0 = now_us();
		for (int i = 0; i < r; i++) {
			struct ibv_mr *mr = ibv_reg_mr(pd, src, sz, IBV_ACCESS_LOCAL_WRITE);
			if (!mr) {
				perror("sovia-regcost: ibv_reg_mr");
				return 1;
			}
			ibv_dereg_mr(mr);
		}
		double reg = (now_us() - t0) / r;
		printf("%10zu %14.2f %14.2f %10.2f\n", sz, copy, reg, reg / copy);
		if (!crossover && reg <= copy)
			crossover = sz;
	}
	if (crossover)
		printf("crossover: registering is cheaper from %zu bytes\n", crossover);
	else
		printf("crossover: copying is cheaper at every size up to %zu bytes\n", max);
	ibv_dereg_mr(dmr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(devs);
	return 0;
}
