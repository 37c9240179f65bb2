/* sovia-run: run a program with libsovia preloaded, its flags turned into
 * libsovia's settings (as smc_run does for SMC).
 *
 * The flags come from the settings table itself (src/base/config.c): SOVIA_WINDOW
 * is --window N, a yes/no setting SOVIA_X is --x and --no-x. Every value is
 * checked by the same parser and ranges the module uses, so a value the
 * module would refuse (and replace by its default) stops sovia-run before
 * the program starts.
 *
 * Exit status: the program's; 125 when sovia-run fails (a bad flag or
 * setting, no module), 126 when the program cannot be run, 127 when it is
 * not found (as env(1) and nohup(1) do). */
#include "config.h"

#include <ctype.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef SOVIA_VERSION_STRING
#define SOVIA_VERSION_STRING "?"
#endif
/* The module: at a fixed path (the build tree's), or, installed, at a path
 * relative to sovia-run's own directory, so that an install moved to
 * another prefix (cmake --install --prefix) still finds its own. */
#if !defined(SOVIA_MODULE_PATH) && !defined(SOVIA_MODULE_FROM_BIN)
#define SOVIA_MODULE_PATH "libsovia.so"
#endif

static const char *default_module(void)
{
#ifdef SOVIA_MODULE_FROM_BIN
	static char path[PATH_MAX + sizeof(SOVIA_MODULE_FROM_BIN)];
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return SOVIA_MODULE_FROM_BIN;
	self[n] = '\0';
	*strrchr(self, '/') = '\0';
	snprintf(path, sizeof(path), "%s/%s", self, SOVIA_MODULE_FROM_BIN);
	return path;
#else
	return SOVIA_MODULE_PATH;
#endif
}

enum { EXIT_OWN = 125, EXIT_CANNOT_RUN = 126, EXIT_NOT_FOUND = 127 };

static const char *const prefix = "SOVIA_";

static _Noreturn void usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "sovia-run: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nTry 'sovia-run --help' for more information.\n");
	exit(EXIT_OWN);
}

/* A setting's flag: SOVIA_BUF_IDLE_MS is "buf-idle-ms". */
static void flag_name(const struct sv_setting_desc *s, char *out, size_t len)
{
	const char *p = s->name + strlen(prefix);
	size_t i = 0;
	for (; p[i] && i + 1 < len; i++)
		out[i] = p[i] == '_' ? '-' : (char)tolower((unsigned char)p[i]);
	out[i] = '\0';
}

/* Print text from column `col`, wrapped at 79 columns, each further line
 * starting at column `indent`. */
static void wrapped(const char *text, int col, int indent)
{
	const char *p = text;
	while (*p) {
		size_t word = strcspn(p, " ");
		if (col > indent && col + 1 + (int)word > 79) {
			printf("\n%*s", indent, "");
			col = indent;
		} else if (col > indent) {
			putchar(' ');
			col++;
		}
		printf("%.*s", (int)word, p);
		col += (int)word;
		p += word;
		p += strspn(p, " ");
	}
	putchar('\n');
}

static void help(void)
{
	printf("Usage: sovia-run [OPTION]... [--] PROGRAM [ARGUMENT]...\n"
	       "Run PROGRAM with libsovia preloaded: its TCP connections to peers that run\n"
	       "libsovia too move to RDMA; the others stay on TCP. Each option sets the\n"
	       "libsovia setting named beside it (libsovia(7)); a value libsovia would not\n"
	       "take stops sovia-run before PROGRAM starts.\n\n");
	for (size_t i = 0; sv_config_setting(i); i++) {
		const struct sv_setting_desc *s = sv_config_setting(i);
		char name[64], left[96], what[512];
		flag_name(s, name, sizeof(name));
		switch (s->kind) {
		case SV_SETTING_BOOL:
			snprintf(left, sizeof(left), "  --[no-]%s", name);
			snprintf(what, sizeof(what), "%s=1 or 0, default %d: %s", s->name, (int)s->def,
				 s->what);
			break;
		case SV_SETTING_LEVEL:
			snprintf(left, sizeof(left), "  --%s=LEVEL", name);
			snprintf(what, sizeof(what), "%s: %s; default warn", s->name, s->what);
			break;
		case SV_SETTING_COUNT:
		case SV_SETTING_BYTES:
			snprintf(left, sizeof(left), "  --%s=%s", name,
				 s->kind == SV_SETTING_BYTES ? "BYTES" : "N");
			snprintf(what, sizeof(what), "%s: %s; %u..%u%s, default %u", s->name, s->what,
				 s->min, s->max, s->kind == SV_SETTING_BYTES ? " (k, m suffixes)" : "",
				 s->def);
			break;
		}
		printf("%s\n        ", left);
		wrapped(what, 8, 8);
	}
	printf("\n  --lib=PATH\n"
	       "        the module to preload (default: $SOVIA_MODULE, else\n"
	       "        %s)\n"
	       "  -h, --help     this help\n"
	       "  --version      the version\n\n"
	       "Exit status: PROGRAM's; 125 when sovia-run fails, 126 when PROGRAM cannot\n"
	       "be run, 127 when it is not found.\n"
	       "The connections of running programs: sovia-stat(8).\n",
	       default_module());
}

/* The option in argv[*i] names setting s (with "--no-" for a yes/no
 * setting's 0): its value goes to the environment. Returns false when the
 * option is not s's. */
static bool take_setting(const struct sv_setting_desc *s, char **argv, int argc, int *i)
{
	char name[64];
	flag_name(s, name, sizeof(name));
	const char *opt = argv[*i] + 2;
	size_t n = strlen(name);
	const char *value;
	char given[16];

	if (s->kind == SV_SETTING_BOOL) {
		bool no = strncmp(opt, "no-", 3) == 0 && strncmp(opt + 3, name, n) == 0;
		if (!no && strncmp(opt, name, n) != 0)
			return false;
		const char *rest = opt + n + (no ? 3 : 0);
		if (*rest == '=') {
			char flag[72];
			snprintf(flag, sizeof(flag), "%s%s", no ? "no-" : "", name);
			usage_error("option '--%s' takes no value", flag);
		}
		if (*rest)
			return false;
		snprintf(given, sizeof(given), "%d", !no);
		value = given;
	} else {
		if (strncmp(opt, name, n) != 0 || (opt[n] != '\0' && opt[n] != '='))
			return false;
		if (opt[n] == '=') {
			value = opt + n + 1;
		} else {
			if (*i + 1 >= argc)
				usage_error("option '--%s' needs a value", name);
			value = argv[++*i];
		}
		uint32_t v;
		int rc = sv_config_parse(s, value, &v);
		if (rc < 0) {
			char why[640];
			if (rc == -ERANGE)
				snprintf(why, sizeof(why), "--%s=%s: outside %u..%u (%s)", name, value,
					 s->min, s->max, s->what);
			else if (s->kind == SV_SETTING_LEVEL)
				snprintf(why, sizeof(why),
					 "--%s=%s: not a log level (error, warn, info, debug or 0..3)",
					 name, value);
			else
				snprintf(why, sizeof(why), "--%s=%s: not %s (%s)", name, value,
					 s->kind == SV_SETTING_BYTES ? "a byte count" : "a number",
					 s->what);
			usage_error("%s", why);
		}
	}
	if (setenv(s->name, value, 1) < 0) {
		perror("sovia-run: setenv");
		exit(EXIT_OWN);
	}
	return true;
}

/* The ELF header of the file at path, if it is ELF. */
static bool elf_header(const char *path, ElfW(Ehdr) *eh)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	bool ok = pread(fd, eh, sizeof(*eh), 0) == (ssize_t)sizeof(*eh) &&
		  memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0;
	close(fd);
	return ok;
}

/* The program's ELF header, found as execvp finds it; false for a script
 * or a program not found (execvp then says). */
static bool program_header(const char *prog, ElfW(Ehdr) *eh)
{
	if (strchr(prog, '/'))
		return elf_header(prog, eh);
	const char *path = getenv("PATH");
	for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
		size_t n = strcspn(p, ":");
		char full[PATH_MAX];
		if (snprintf(full, sizeof(full), "%.*s/%s", (int)n, n ? p : ".", prog) <
			    (int)sizeof(full) &&
		    access(full, X_OK) == 0)
			return elf_header(full, eh);
		p += n + (p[n] == ':');
	}
	return false;
}

/* The loader preloads a shared object of the program's class, byte order
 * and machine, and no executable (a PIE is ET_DYN too: DF_1_PIE tells it).
 * Bounded for any file: the program headers must have their usual size,
 * and only the first PT_DYNAMIC's first entries are read. */
static const char *not_preloadable(int fd, const ElfW(Ehdr) *prog)
{
	ElfW(Ehdr) eh;
	if (pread(fd, &eh, sizeof(eh), 0) != (ssize_t)sizeof(eh) ||
	    memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
		return "not a shared object";
	if (prog && (eh.e_ident[EI_CLASS] != prog->e_ident[EI_CLASS] ||
		     eh.e_ident[EI_DATA] != prog->e_ident[EI_DATA] ||
		     eh.e_machine != prog->e_machine))
		return "a shared object for another machine than the program's";
#if __SIZEOF_POINTER__ == 8
	if (eh.e_ident[EI_CLASS] != ELFCLASS64)
#else
	if (eh.e_ident[EI_CLASS] != ELFCLASS32)
#endif
		return NULL; /* another class than ours (a 32-bit program's): not read here */
	if (eh.e_type != ET_DYN || eh.e_phentsize != sizeof(ElfW(Phdr)))
		return "not a shared object";
	for (unsigned i = 0; i < eh.e_phnum; i++) {
		ElfW(Phdr) ph;
		if (pread(fd, &ph, sizeof(ph), (off_t)(eh.e_phoff + (ElfW(Off))i * sizeof(ph))) !=
		    (ssize_t)sizeof(ph))
			return "not a shared object";
		if (ph.p_type != PT_DYNAMIC)
			continue;
		ElfW(Dyn) d[512];
		size_t n = ph.p_filesz < sizeof(d) ? ph.p_filesz : sizeof(d);
		ssize_t got = pread(fd, d, n, (off_t)ph.p_offset);
		for (size_t k = 0; got > 0 && k < (size_t)got / sizeof(d[0]); k++) {
			if (d[k].d_tag == DT_NULL)
				break;
			if (d[k].d_tag == DT_FLAGS_1 && (d[k].d_un.d_val & DF_1_PIE))
				return "a program, not a shared object";
		}
		break;
	}
	return NULL;
}

/* NULL when path is a shared object the loader can preload into the
 * program, else why not. */
static const char *preloadable(const char *path, const char *prog)
{
	ElfW(Ehdr) ph;
	bool have_prog = program_header(prog, &ph);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return strerror(errno);
	const char *why = not_preloadable(fd, have_prog ? &ph : NULL);
	close(fd);
	return why;
}

static _Noreturn void bad_module(const char *module, const char *why)
{
	fprintf(stderr,
		"sovia-run: cannot use the module %s: %s\n"
		"Give its path with --lib or SOVIA_MODULE.\n",
		module, why);
	exit(EXIT_OWN);
}

/* The module's path goes first in LD_PRELOAD, unless it is there already.
 * The loader would skip, and the program run without libsovia, a path
 * that is not a shared object or that LD_PRELOAD's separators split. */
static void preload(const char *module, const char *prog)
{
	char path[PATH_MAX];
	if (!realpath(module, path))
		bad_module(module, strerror(errno));
	if (strpbrk(path, " \t\n:"))
		bad_module(path, "LD_PRELOAD cannot hold a path with a blank or a colon");
	const char *why = preloadable(path, prog);
	if (why)
		bad_module(path, why);
	const char *old = getenv("LD_PRELOAD");
	if (old) {
		/* LD_PRELOAD's entries are separated by blanks or colons. */
		size_t n = strlen(path);
		for (const char *p = old; (p = strstr(p, path)); p += n) {
			bool starts = p == old || p[-1] == ' ' || p[-1] == ':';
			bool ends = p[n] == '\0' || p[n] == ' ' || p[n] == ':';
			if (starts && ends)
				return;
		}
	}
	size_t len = strlen(path) + (old ? strlen(old) + 1 : 0) + 1;
	char *v = malloc(len);
	if (!v) {
		perror("sovia-run");
		exit(EXIT_OWN);
	}
	snprintf(v, len, "%s%s%s", path, old && *old ? ":" : "", old ? old : "");
	if (setenv("LD_PRELOAD", v, 1) < 0) {
		perror("sovia-run: setenv");
		exit(EXIT_OWN);
	}
	free(v);
}

int main(int argc, char **argv)
{
	const char *module = getenv("SOVIA_MODULE");
	if (!module || !*module)
		module = default_module();
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) {
			i++;
			break;
		}
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			help();
			return 0;
		}
		if (strcmp(a, "--version") == 0) {
			printf("sovia-run (libsovia) %s\n", SOVIA_VERSION_STRING);
			return 0;
		}
		if (strncmp(a, "--lib", 5) == 0 && (a[5] == '\0' || a[5] == '=')) {
			if (a[5] == '=')
				module = a + 6;
			else if (i + 1 < argc)
				module = argv[++i];
			else
				usage_error("option '%s' needs a value", a);
			continue;
		}
		bool taken = false;
		if (a[1] == '-')
			for (size_t k = 0; !taken && sv_config_setting(k); k++)
				taken = take_setting(sv_config_setting(k), argv, argc, &i);
		if (!taken)
			usage_error("unknown option '%s'", a);
	}
	if (i >= argc)
		usage_error("%s", "no program to run");

	/* The settings together, as the module will read them: the flags
	 * and what the environment already held. The module reports each
	 * one it would not take. */
	struct sv_config cfg;
	if (sv_config_load(&cfg, getenv) > 0) {
		fprintf(stderr, "sovia-run: libsovia would not take the settings above; "
				"%s was not run\n",
			argv[i]);
		return EXIT_OWN;
	}
	preload(module, argv[i]);
	execvp(argv[i], argv + i);
	int err = errno;
	fprintf(stderr, "sovia-run: %s: %s\n", argv[i], strerror(err));
	return err == ENOENT || err == ENOTDIR ? EXIT_NOT_FOUND : EXIT_CANNOT_RUN;
}
