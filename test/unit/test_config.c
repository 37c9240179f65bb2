/* Settings: defaults, valid values, and bad values (clear message, default kept). */
#include "config.h"
#include "log.h"
#include "proto.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <string.h>

/* A fake environment for sv_config_load. */
static const char *env_names[16];
static const char *env_values[16];
static int env_n;

static void env_set(const char *name, const char *value)
{
	env_names[env_n] = name;
	env_values[env_n] = value;
	env_n++;
}

static char *fake_getenv(const char *name)
{
	for (int i = 0; i < env_n; i++)
		if (strcmp(env_names[i], name) == 0)
			return (char *)env_values[i];
	return NULL;
}

static void setup(void)
{
	env_n = 0;
	sv_log_threshold = SV_LOG_WARN;
}

TestSuite(config, .init = setup, .timeout = 10);

Test(config, empty_environment_gives_defaults)
{
	struct sv_config c, d;
	cr_assert_eq(sv_config_load(&c, fake_getenv), 0);
	sv_config_defaults(&d);
	cr_assert_eq(memcmp(&c, &d, sizeof(c)), 0);
	cr_assert_eq(c.window, 8);
	cr_assert_eq(c.buf_size, 131072);
	cr_assert_eq(c.ack_delay, 2);
	cr_assert_eq(c.coalesce_size, 131072);
	cr_assert_eq(c.coalesce_timeout_us, 2000);
	cr_assert(c.coalesce);
	cr_assert_not(c.disable);
	cr_assert_eq(c.log_level, SV_LOG_WARN);
}

Test(config, valid_values_are_taken)
{
	struct sv_config c;
	env_set("SOVIA_WINDOW", "64");
	env_set("SOVIA_BUF_SIZE", "64k");
	env_set("SOVIA_COALESCE", "off");
	env_set("SOVIA_DISABLE", "yes");
	env_set("SOVIA_LOG", "debug");
	env_set("SOVIA_REG_THRESHOLD", "1M");
	cr_assert_eq(sv_config_load(&c, fake_getenv), 0);
	cr_assert_eq(c.window, 64);
	cr_assert_eq(c.buf_size, 65536);
	cr_assert_not(c.coalesce);
	cr_assert(c.disable);
	cr_assert_eq(c.log_level, SV_LOG_DEBUG);
	cr_assert_eq(c.reg_threshold, 1u << 20);
}

/* Inline strings: Criterion copies parameters into a re-executed child,
 * where pointers into the parent's (PIE) image would dangle. */
struct bad_case {
	char name[32];
	char value[32];
};

ParameterizedTestParameters(config, bad_value_keeps_default)
{
	static struct bad_case cases[] = {
		{"SOVIA_WINDOW", "abc"},     {"SOVIA_WINDOW", "-5"},   {"SOVIA_WINDOW", "1"},
		{"SOVIA_WINDOW", "99999"},   {"SOVIA_WINDOW", " 8"},   {"SOVIA_WINDOW", "8x"},
		{"SOVIA_BUF_SIZE", "3G"},    {"SOVIA_BUF_SIZE", ""},   {"SOVIA_LOG", "loud"},
		{"SOVIA_COALESCE", "maybe"}, {"SOVIA_ACK_DELAY", "0"},
		{"SOVIA_ACK_TIMEOUT_US", "99999999999999999999"},
	};
	return cr_make_param_array(struct bad_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct bad_case *bc, config, bad_value_keeps_default, .init = setup)
{
	struct sv_config c, d;
	cr_redirect_stderr();
	env_set(bc->name, bc->value);
	cr_assert_eq(sv_config_load(&c, fake_getenv), 1, "%s='%s' should be rejected", bc->name,
		     bc->value);
	sv_config_defaults(&d);
	cr_assert_eq(memcmp(&c, &d, sizeof(c)), 0, "defaults must be kept");
	fflush(stderr);
	char expect[128];
	snprintf(expect, sizeof(expect), "%s='%s' is not a valid", bc->name, bc->value);
	FILE *err = cr_get_redirected_stderr();
	char line[512] = "";
	cr_assert_not_null(fgets(line, sizeof(line), err));
	cr_assert_not_null(strstr(line, expect), "message was: %s", line);
	cr_assert_not_null(strstr(line, "using the default"), "message was: %s", line);
}

Test(config, ack_delay_must_stay_below_window)
{
	struct sv_config c;
	cr_redirect_stderr();
	env_set("SOVIA_WINDOW", "8");
	env_set("SOVIA_ACK_DELAY", "8");
	cr_assert_eq(sv_config_load(&c, fake_getenv), 1);
	cr_assert_eq(c.window, 8);
	cr_assert_lt(c.ack_delay, c.window);
}

/* The smallest window with the default ACK delay loads without a
 * complaint (the ACK delay was never set). */
Test(config, smallest_window_alone_loads_quietly)
{
	struct sv_config c;
	cr_redirect_stderr();
	env_set("SOVIA_WINDOW", "4");
	cr_assert_eq(sv_config_load(&c, fake_getenv), 0);
	cr_assert_eq(c.ack_delay, 2);
	fflush(stderr);
	cr_assert_stderr_eq_str("");
}

Test(config, coalesce_size_capped_by_buffer)
{
	struct sv_config c;
	cr_redirect_stderr();
	env_set("SOVIA_BUF_SIZE", "4k");
	env_set("SOVIA_COALESCE_SIZE", "8k");
	cr_assert_eq(sv_config_load(&c, fake_getenv), 1);
	cr_assert_eq(c.coalesce_size, 4096);
}

/* The default (128 KiB) follows a smaller buffer without a complaint. */
Test(config, coalesce_default_follows_small_buffer)
{
	struct sv_config c;
	cr_redirect_stderr();
	env_set("SOVIA_BUF_SIZE", "4k");
	cr_assert_eq(sv_config_load(&c, fake_getenv), 0);
	cr_assert_eq(c.coalesce_size, 4096);
	fflush(stderr);
	cr_assert_stderr_eq_str("");
}

/* SOVIA_BUF_SIZE is a message's payload: the descriptor the protocol
 * registers holds it and the header, so a write of a power of two fills
 * whole messages (a 256 KiB write is two 128 KiB messages, not three). */
Test(config, buf_size_counts_payload)
{
	struct sv_config c;
	struct sv_proto_params prm;
	cr_assert_eq(sv_config_load(&c, fake_getenv), 0);
	sv_config_proto_params(&c, &prm);
	cr_assert_eq(prm.buf_size, 131072 + SV_HDR_SIZE);
	cr_assert_eq(prm.coalesce_size, 131072);

	env_set("SOVIA_BUF_SIZE", "4k");
	env_set("SOVIA_COALESCE_SIZE", "4k"); /* a whole payload fits: no complaint */
	cr_redirect_stderr();
	cr_assert_eq(sv_config_load(&c, fake_getenv), 0);
	sv_config_proto_params(&c, &prm);
	cr_assert_eq(prm.buf_size, 4096 + SV_HDR_SIZE);
	cr_assert_eq(prm.coalesce_size, 4096);
	fflush(stderr);
	cr_assert_stderr_eq_str("");
}

/* The table sovia-run reads: every setting once, each default inside its
 * range, and sv_config_parse telling a value of the wrong form from one
 * outside the range. */
Test(config, table_lists_each_setting_with_its_range)
{
	size_t n = 0;
	for (; sv_config_setting(n); n++) {
		const struct sv_setting_desc *s = sv_config_setting(n);
		cr_assert(strncmp(s->name, "SOVIA_", 6) == 0, "%s", s->name);
		cr_assert(s->min <= s->def && s->def <= s->max, "%s", s->name);
		for (size_t k = 0; k < n; k++)
			cr_assert_str_neq(sv_config_setting(k)->name, s->name);
	}
	cr_assert_eq(n, 22);
	cr_assert_null(sv_config_setting(n));
}

static const struct sv_setting_desc *setting(const char *name)
{
	for (size_t i = 0; sv_config_setting(i); i++)
		if (strcmp(sv_config_setting(i)->name, name) == 0)
			return sv_config_setting(i);
	cr_assert_fail("no setting %s", name);
	return NULL;
}

/* Arrays, not pointers: each case runs in a fresh process of its own. */
struct parse_case {
	char name[32], text[32];
	int rc;
	uint32_t value;
};

ParameterizedTestParameters(config, parse_checks_form_and_range)
{
	static struct parse_case cases[] = {
		{"SOVIA_WINDOW", "16", 0, 16},
		{"SOVIA_WINDOW", "3", -ERANGE, 0},
		{"SOVIA_WINDOW", "1025", -ERANGE, 0},
		{"SOVIA_WINDOW", "4k", -EINVAL, 0}, /* counts take no suffix */
		{"SOVIA_WINDOW", "-4", -EINVAL, 0},
		{"SOVIA_BUF_SIZE", "64k", 0, 65536},
		{"SOVIA_BUF_SIZE", "1m", 0, 1048576},
		{"SOVIA_BUF_SIZE", "2m", -ERANGE, 0},
		{"SOVIA_BUF_SIZE", "99999999999999999999", -ERANGE, 0},
		{"SOVIA_STATS", "on", 0, 1},
		{"SOVIA_STATS", "No", 0, 0},
		{"SOVIA_STATS", "2", -EINVAL, 0},
		{"SOVIA_LOG", "debug", 0, SV_LOG_DEBUG},
		{"SOVIA_LOG", "0", 0, SV_LOG_ERROR},
		{"SOVIA_LOG", "loud", -EINVAL, 0},
		{"SOVIA_SPIN_US", "0", 0, 0},
		{"SOVIA_SPIN_US", "", -EINVAL, 0},
	};
	return cr_make_param_array(struct parse_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct parse_case *pc, config, parse_checks_form_and_range, .init = setup)
{
	uint32_t v = 12345;
	cr_assert_eq(sv_config_parse(setting(pc->name), pc->text, &v), pc->rc, "%s='%s'", pc->name,
		     pc->text);
	cr_assert_eq(v, pc->rc == 0 ? pc->value : 12345, "%s='%s'", pc->name, pc->text);
}
