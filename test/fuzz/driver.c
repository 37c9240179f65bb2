/* A stand-in for libFuzzer's main, for compilers without -fsanitize=fuzzer
 * (gcc): the same target runs on the inputs named on the command line
 * (files, or directories of them), then on inputs made from a fixed seed,
 * for a bounded number of runs or seconds. Without coverage feedback it
 * finds less than libFuzzer, so it mutates the corpus (the seeds the target
 * made under libFuzzer) as well as making inputs from nothing.
 *
 * The flags are libFuzzer's, so that one command line serves both builds:
 * -runs=N (default 100000), -max_total_time=S (0: no limit), -seed=N,
 * -max_len=N (default 4096). Other flags of libFuzzer's are ignored. Each
 * input is in memory of its own exact size, so that AddressSanitizer
 * catches a read one byte past it. */
#include "fuzz.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

struct blob {
	uint8_t *b;
	size_t n;
};

static struct blob *corpus;
static size_t ncorpus, capcorpus;

static void *xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);
	if (!q) {
		fprintf(stderr, "driver: out of memory\n");
		exit(2);
	}
	return q;
}

static uint64_t rng_state;

/* xorshift64*: fixed sequences for a fixed seed. */
static uint64_t rnd(void)
{
	uint64_t x = rng_state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static size_t rnd_below(size_t n)
{
	return n ? (size_t)(rnd() % n) : 0;
}

/* Run one input from its own allocation of exactly its size. */
static void run_one(const uint8_t *data, size_t n)
{
	uint8_t *copy = malloc(n ? n : 1);
	if (!copy)
		exit(2);
	if (n)
		memcpy(copy, data, n);
	LLVMFuzzerTestOneInput(n ? copy : NULL, n);
	free(copy);
}

static void add_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "driver: cannot open %s\n", path);
		exit(2);
	}
	struct blob b = {NULL, 0};
	size_t cap = 0;
	for (;;) {
		if (b.n == cap) {
			cap = cap ? 2 * cap : 4096;
			b.b = xrealloc(b.b, cap);
		}
		size_t got = fread(b.b + b.n, 1, cap - b.n, f);
		if (got == 0)
			break;
		b.n += got;
	}
	fclose(f);
	if (ncorpus == capcorpus) {
		capcorpus = capcorpus ? 2 * capcorpus : 64;
		corpus = xrealloc(corpus, capcorpus * sizeof(*corpus));
	}
	corpus[ncorpus++] = b;
}

static void add_path(const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0) {
		fprintf(stderr, "driver: no such file or directory: %s\n", path);
		exit(2);
	}
	if (!S_ISDIR(st.st_mode)) {
		add_file(path);
		return;
	}
	DIR *d = opendir(path);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char sub[4096];
		snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
		if (stat(sub, &st) == 0 && S_ISREG(st.st_mode))
			add_file(sub);
	}
	closedir(d);
}

/* One mutation of buf (n bytes, room for max): libFuzzer's simplest ones. */
static size_t mutate(uint8_t *buf, size_t n, size_t max)
{
	static const uint8_t magic[] = {0, 1, 2, 3, 7, 8, 0x10, 0x18, 0x7f, 0x80, 0xfe, 0xff};
	size_t i = rnd_below(n);
	switch (rnd() % 7) {
	case 0: /* flip a bit */
		if (n)
			buf[i] ^= (uint8_t)(1u << (rnd() % 8));
		break;
	case 1: /* any byte */
		if (n)
			buf[i] = (uint8_t)rnd();
		break;
	case 2: /* a value that sits on a boundary */
		if (n)
			buf[i] = magic[rnd_below(sizeof(magic))];
		break;
	case 3: { /* insert a few bytes */
		size_t k = 1 + rnd_below(8);
		if (n + k > max)
			break;
		memmove(buf + i + k, buf + i, n - i);
		for (size_t j = 0; j < k; j++)
			buf[i + j] = (uint8_t)rnd();
		n += k;
		break;
	}
	case 4: { /* erase a few */
		size_t k = 1 + rnd_below(8);
		if (i + k > n)
			k = n - i;
		memmove(buf + i, buf + i + k, n - i - k);
		n -= k;
		break;
	}
	case 5: { /* copy a stretch over another place */
		if (!n)
			break;
		size_t from = rnd_below(n), k = 1 + rnd_below(16);
		if (from + k > n)
			k = n - from;
		if (i + k > n)
			k = n - i;
		memmove(buf + i, buf + from, k);
		break;
	}
	default: /* add to a byte */
		if (n)
			buf[i] = (uint8_t)(buf[i] + 1 + rnd_below(16) - 8);
		break;
	}
	return n;
}

int main(int argc, char **argv)
{
	unsigned long long runs = 100000, max_time = 0, seed = 1, max_len = 4096;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strncmp(a, "-runs=", 6) == 0)
			runs = strtoull(a + 6, NULL, 10);
		else if (strncmp(a, "-max_total_time=", 16) == 0)
			max_time = strtoull(a + 16, NULL, 10);
		else if (strncmp(a, "-seed=", 6) == 0)
			seed = strtoull(a + 6, NULL, 10);
		else if (strncmp(a, "-max_len=", 9) == 0)
			max_len = strtoull(a + 9, NULL, 10);
		else if (a[0] == '-')
			continue; /* libFuzzer's, meaningless here */
		else
			add_path(a);
	}
	if (max_len == 0)
		max_len = 1;
	rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
	time_t start = time(NULL);

	for (size_t i = 0; i < ncorpus; i++)
		run_one(corpus[i].b, corpus[i].n);

	uint8_t *buf = xrealloc(NULL, max_len);
	unsigned long long done = 0;
	for (; done < runs; done++) {
		unsigned long long spent = (unsigned long long)(time(NULL) - start);
		if (max_time && (done & 255) == 0 && spent >= max_time)
			break;
		size_t n;
		if (ncorpus && rnd() % 4 != 0) {
			/* A corpus input with a few mutations. */
			const struct blob *b = &corpus[rnd_below(ncorpus)];
			n = b->n < max_len ? b->n : max_len;
			if (n)
				memcpy(buf, b->b, n);
			for (size_t k = 1 + rnd_below(8); k > 0; k--)
				n = mutate(buf, n, max_len);
		} else {
			/* From nothing: mostly short inputs, which end early less often
			 * by a byte that breaks the connection. */
			n = rnd_below(rnd() % 2 ? 64 : max_len + 1);
			if (n > max_len)
				n = max_len;
			for (size_t k = 0; k < n; k++)
				buf[k] = (uint8_t)rnd();
		}
		run_one(buf, n);
	}
	printf("driver: %zu corpus inputs and %llu generated inputs in %llu s (seed %llu)\n",
	       ncorpus, done, (unsigned long long)(time(NULL) - start), seed);
	free(buf);
	for (size_t i = 0; i < ncorpus; i++)
		free(corpus[i].b);
	free(corpus);
	return 0;
}
