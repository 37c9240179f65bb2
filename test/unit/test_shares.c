/* The table of connections kept across a fork (src/shares.h), with real
 * processes: who still holds a copy of the socket, and a claim that
 * sleeps until the owner settles it (or dies). */
#include "shares.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int efd = -1, sv[2] = {-1, -1};
static struct sv_shares *t;
static struct sv_share_ref ref;

static void setup(void)
{
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	cr_assert_geq(efd, 0);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	t = sv_shares_own(efd);
	cr_assert_not_null(t);
	struct stat st;
	cr_assert_eq(fstat(sv[0], &st), 0);
	cr_assert_eq(sv_shares_keep(t, (uint64_t)st.st_ino, &ref), 0);
}

TestSuite(shares, .init = setup, .timeout = 30);

/* A child that keeps the socket (or closes it) and then waits on a pipe. */
static pid_t child(bool keep, int *go)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	sv_shares_fork_begin(&ref);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p[1]);
		if (!keep)
			close(sv[0]);
		char c;
		(void)!read(p[0], &c, 1);
		_exit(0);
	}
	sv_shares_fork_end(&ref, pid);
	close(p[0]);
	*go = p[1];
	return pid;
}

static void end_child(pid_t pid, int go)
{
	close(go);
	cr_assert_eq(waitpid(pid, NULL, 0), pid);
}

Test(shares, a_child_that_keeps_the_socket_holds_it)
{
	int go;
	pid_t pid = child(true, &go);
	cr_assert(sv_shares_others_hold(&ref));
	end_child(pid, go);
	cr_assert_not(sv_shares_others_hold(&ref), "a child that is gone holds nothing");
}

Test(shares, a_child_that_closed_its_copy_holds_nothing)
{
	int go;
	pid_t pid = child(false, &go);
	/* Its close is seen once it happened: it waits on the pipe after. */
	for (int i = 0; i < 1000 && sv_shares_others_hold(&ref); i++)
		usleep(1000);
	cr_assert_not(sv_shares_others_hold(&ref));
	end_child(pid, go);
}

Test(shares, a_fork_under_way_counts_as_a_holder)
{
	sv_shares_fork_begin(&ref);
	cr_assert(sv_shares_others_hold(&ref));
	sv_shares_fork_end(&ref, -1); /* it failed */
	cr_assert_not(sv_shares_others_hold(&ref));
}

/* The claimer: its exit status says what the claim returned. */
enum { RELEASED = 0, RESET = 1, OTHER = 2, SHARED = 3 };
static pid_t claimer(void)
{
	sv_shares_fork_begin(&ref);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int r = sv_shares_claim(&ref);
		_exit(r == 0 ? RELEASED : r == 1 ? SHARED : r == -ECONNRESET ? RESET : OTHER);
	}
	sv_shares_fork_end(&ref, pid);
	return pid;
}

static int status_of(pid_t pid)
{
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

Test(shares, a_claim_wakes_the_owner_and_sleeps_until_it_is_released)
{
	pid_t pid = claimer();
	uint64_t v = 0;
	for (int i = 0; i < 5000 && read(efd, &v, sizeof(v)) != sizeof(v); i++)
		usleep(1000);
	cr_assert_eq(v, 1, "the owner was not woken");
	int slots[4];
	cr_assert_eq(sv_shares_take_claims(t, slots, 4), 1);
	cr_assert_eq(slots[0], ref.slot);
	cr_assert(sv_shares_claimed(&ref));
	cr_assert_eq(sv_shares_take_claims(t, slots, 4), 0, "each claim is taken once");
	cr_assert_eq(waitpid(pid, NULL, WNOHANG), 0, "the claimer went on before the release");
	sv_shares_settle(&ref, false);
	cr_assert_eq(status_of(pid), RELEASED);
}

Test(shares, a_claim_of_a_lost_connection_is_reset)
{
	pid_t pid = claimer();
	sv_shares_settle(&ref, true);
	cr_assert_eq(status_of(pid), RESET);
}

Test(shares, a_settled_entry_is_reused_and_old_claims_read_it_released)
{
	struct sv_share_ref old = ref;
	sv_shares_settle(&ref, false);
	struct sv_share_ref again;
	cr_assert_eq(sv_shares_keep(t, 1, &again), 0);
	cr_assert_eq(again.slot, old.slot);
	cr_assert_neq(again.gen, old.gen);
	cr_assert_eq(sv_shares_claim(&old), 0);
	cr_assert_not(sv_shares_claimed(&again));
}

/* A lost entry is not reused while a copy is held: a late claim must
 * still read it lost, never released. */
Test(shares, a_lost_entry_reads_lost_while_a_copy_is_held)
{
	int go;
	pid_t pid = child(true, &go);
	struct sv_share_ref old = ref;
	sv_shares_settle(&ref, true);
	struct sv_share_ref again;
	cr_assert_eq(sv_shares_keep(t, 1, &again), 0);
	cr_assert_neq(again.slot, old.slot, "a lost entry with a holder was reused");
	cr_assert_eq(sv_shares_claim(&old), -ECONNRESET);
	end_child(pid, go);
}

/* The owner's helper takes claims by a counter; a fork's child makes a
 * table of its own whose count starts again: its first claim is seen. */
Test(shares, a_forked_owner_sees_its_own_first_claim)
{
	pid_t c = claimer();
	uint64_t v;
	for (int i = 0; i < 5000 && read(efd, &v, sizeof(v)) != sizeof(v); i++)
		usleep(1000);
	int slots[4];
	cr_assert_eq(sv_shares_take_claims(t, slots, 4), 1);
	sv_shares_settle(&ref, false);
	cr_assert_eq(status_of(c), RELEASED);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		sv_shares_atfork_child();
		int e2 = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		struct sv_shares *t2 = sv_shares_own(e2);
		struct sv_share_ref r2;
		if (!t2 || sv_shares_keep(t2, 1, &r2) < 0)
			_exit(4);
		pid_t g = fork();
		if (g == 0)
			_exit(sv_shares_claim(&r2) == 0 ? 0 : 1);
		uint64_t w;
		for (int i = 0; i < 5000 && read(e2, &w, sizeof(w)) != sizeof(w); i++)
			usleep(1000);
		int n = sv_shares_take_claims(t2, slots, 4);
		sv_shares_settle(&r2, false);
		waitpid(g, NULL, 0);
		_exit(n == 1 ? 0 : 3);
	}
	cr_assert_eq(status_of(pid), 0, "the child's table missed its first claim");
}

/* Released to the copies while the owner holds its own (sv_shares_share):
 * the claim says so, the entry is not reused, the copies' forks are still
 * followed, and a copy passed where it cannot be followed means never
 * alone again. Settling it then frees it. */
Test(shares, a_shared_entry_follows_its_copies_until_settled)
{
	pid_t pid = claimer();
	sv_shares_share(&ref);
	cr_assert_eq(status_of(pid), SHARED);
	cr_assert_not(sv_shares_others_hold(&ref), "the claimer is gone");
	struct sv_share_ref other;
	cr_assert_eq(sv_shares_keep(t, 1, &other), 0);
	cr_assert_neq(other.slot, ref.slot, "a shared entry was reused");
	int go;
	pid_t pid2 = child(true, &go); /* a copy's fork */
	cr_assert(sv_shares_others_hold(&ref), "a copy's fork is not followed");
	end_child(pid2, go);
	cr_assert_not(sv_shares_others_hold(&ref));
	sv_shares_unlist(&ref);
	cr_assert(sv_shares_others_hold(&ref), "an unlisted copy does not count");
	sv_shares_settle(&ref, false);
	cr_assert_eq(sv_shares_claim(&ref), 0);
	cr_assert_not(sv_shares_fork_begin(&ref), "a settled entry is still followed");
}

/* A handed entry (the owner let go): its copies claim at once and stay
 * followed; the one holder left, on one fd, adopts it with the counts the
 * owner gave, once. Not while the owner or another fd holds the socket. */
Test(shares, a_handed_entry_is_adopted_by_its_only_holder)
{
	int go[2], said[2];
	cr_assert_eq(pipe(go), 0);
	cr_assert_eq(pipe(said), 0);
	cr_assert(sv_shares_fork_begin(&ref));
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct sv_share_redo got = {0};
		char c;
		if (read(go[0], &c, 1) != 1 || sv_shares_claim(&ref) != 1)
			_exit(10);
		if (sv_shares_adopt(&ref, &got) != 0)
			_exit(11); /* the owner holds it */
		if (write(said[1], "a", 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(12);
		int d = dup(sv[0]);
		if (d < 0 || sv_shares_adopt(&ref, &got) != 0)
			_exit(13); /* two fds of ours */
		close(d);
		if (sv_shares_adopt(&ref, &got) != 1)
			_exit(14);
		if (got.tx != 1 || got.rx != 2 || got.ktx != 3 || got.krx != 4)
			_exit(15);
		if (sv_shares_adopt(&ref, &got) != -1)
			_exit(16); /* once */
		_exit(0);
	}
	sv_shares_fork_end(&ref, pid);
	struct sv_share_redo r = {.tx = 1, .rx = 2, .ktx = 3, .krx = 4};
	sv_shares_hand(&ref, &r);
	cr_assert(sv_shares_handed(&ref));
	struct sv_share_ref other;
	cr_assert_eq(sv_shares_keep(t, 1, &other), 0);
	cr_assert_neq(other.slot, ref.slot, "a handed entry was reused while a copy is held");
	char c;
	cr_assert_eq(write(go[1], "g", 1), 1);
	cr_assert_eq(read(said[0], &c, 1), 1);
	close(sv[0]);
	sv[0] = -1;
	cr_assert_eq(write(go[1], "g", 1), 1);
	cr_assert_eq(status_of(pid), 0);
	cr_assert_not(sv_shares_handed(&ref), "adopted, but still handed");
	for (int i = 0; i < 2; i++) {
		close(go[i]);
		close(said[i]);
	}
}

/* Issue 53, finding 7: a claim wakes the owner through the fd the owner
 * made, whose number each process keeps in its own memory. Numbers
 * written into the shared table (here the header's word after the
 * owner's pid, where a fd number once was) are nobody's word: the
 * claimer's own pipe there gets nothing. */
Test(shares, a_claim_writes_to_no_fd_named_in_the_table)
{
	int p[2];
	cr_assert_eq(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
	((volatile int32_t *)t)[1] = p[1];
	pid_t pid = claimer();
	uint64_t v = 0;
	for (int i = 0; i < 5000 && read(efd, &v, sizeof(v)) != sizeof(v); i++)
		usleep(1000);
	cr_assert_eq(v, 1, "the owner was not woken");
	sv_shares_settle(&ref, false);
	cr_assert_eq(status_of(pid), RELEASED);
	char b[16];
	cr_assert_eq(read(p[0], b, sizeof(b)), -1, "the claimer wrote to the fd the table named");
	cr_assert_eq(errno, EAGAIN);
}

/* Issue 53, finding 7: a child that dropped its ids leaves its parent's
 * table. Its claims then read lost (not released: the parent may still
 * carry the connection), and whatever it writes where the table was, the
 * parent's entry is as it was. */
Test(shares, a_child_that_dropped_its_ids_writes_nothing_its_parent_reads)
{
	if (geteuid() != 0)
		cr_skip_test("dropping ids needs root");
	cr_assert(sv_shares_fork_begin(&ref));
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		sv_shares_atfork_child(); /* as the interposed fork does */
		if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
			_exit(20);
		if (sv_shares_leave_family() != 0)
			_exit(21);
		memset(t, 0xff, 4096);
		if (sv_shares_claim(&ref) != -ECONNRESET)
			_exit(22);
		_exit(0);
	}
	sv_shares_fork_end(&ref, pid);
	int step = status_of(pid);
	cr_assert_eq(step, 0, "the child failed at step %d", step);
	cr_assert_not(sv_shares_claimed(&ref), "the child's bytes reached the parent");
	int slots[4];
	cr_assert_eq(sv_shares_take_claims(t, slots, 4), 0, "the child's bytes made claims");
	cr_assert_not(sv_shares_others_hold(&ref), "the child is gone");
	pid = claimer();
	uint64_t v = 0;
	for (int i = 0; i < 5000 && read(efd, &v, sizeof(v)) != sizeof(v); i++)
		usleep(1000);
	cr_assert_eq(sv_shares_take_claims(t, slots, 4), 1, "the table no longer works");
	sv_shares_settle(&ref, false);
	cr_assert_eq(status_of(pid), RELEASED);
}
