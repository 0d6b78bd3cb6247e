/* test_serve_kill9.c - exactly once across kill -9 (docs/STREAMING.md, "the proof").
 *
 * Rounds: produce a batch of events (plus one invalid message per rejection reason) into a
 * 4-partition mock topic, start `mfstream serve`, and SIGKILL it at a random moment after it
 * has started applying (0..400 ms after its first new snapshot); restart it on the same
 * snapshot directory. Every snapshot we see (sampled while it runs and after every kill) must
 * satisfy the invariant the proof rests on:
 *     events_applied + events_held_out == sum over partitions p of (valid events in messages at
 *                                         offsets < off[p])
 * and the same for events_digest (the sum of a 64-bit fingerprint of every event) and mu_sum
 * (their ratings): the offsets stored with the model say exactly which events it contains,
 * as a multiset, not only how many. At the end a
 * clean run drains the topic: events_applied == every valid event produced, mu_count too,
 * rejected/<reason> == rounds, stored offsets == high watermarks (low watermarks 0).
 * Each run uses its own group id: a dead member must not hold partitions for a session
 * timeout, and the start offsets come from the snapshot anyway, not from the group.
 */
#include "serve_help.h"

#define N_PARTS 4
#ifndef ROUNDS
#define ROUNDS 4 /* test_serve_kill9_slow.c: 20 */
#endif
#define PER_ROUND 30000
#define MAX_SAMPLES 4096
/* serve's flags (test_serve_kill9_evict.c adds bounded tables) */
#ifndef KILL9_FLAGS
#define KILL9_FLAGS "--serve.holdout_fraction", "0.05", "--serve.fullpass_ms", "200"
#endif

static sh_snap_t samples[MAX_SAMPLES];
static int n_samples;

static void sample(const sh_snap_t *s)
{
	if (s->found && n_samples < MAX_SAMPLES)
		samples[n_samples++] = *s;
}

static void test_kill9_exactly_once(void)
{
	sh_env_t v;
	const char *topic = "ratings-k9";
	if (sh_env_open(&v, 1, topic, N_PARTS))
		return;
	topic = v.topic; /* its name on this broker */
	const char *bs = v.bs, *snap = v.snap, *log = v.log;
	unsigned seed = (unsigned)time(NULL);
	srand(seed);
	fprintf(stderr, "  random seed %u\n", seed);

	/* 5% of (user, item) pairs held out: the proof counts them too */
	const char *const extra[] = {KILL9_FLAGS, NULL};
	char group[64];
	uint64_t total = 0;
	int kills = 0;
	for (int r = 0; r < ROUNDS; r++) {
		total += sh_produce_valid(bs, topic, PER_ROUND, 1000 + r);
		sh_produce_bad(bs, topic, N_PARTS);
		/* (applied events, not applied + held out: after ~19 rounds the held out outnumber one
		 * round's applied events, and a count of both would never be reached by applied alone) */
		const uint64_t before = sh_read(snap).events;
		snprintf(group, sizeof group, "mfs-test-kill9-%d", r);
		pid_t pid = sh_spawn(bs, topic, snap, group, log, NULL, extra);
		int died;
		sh_snap_t s = sh_wait_events(snap, pid, before + 1, 60, &died);
		TEST_ASSERT_MSG(!died, "round %d: serve exited early (log %s)", r, log);
		TEST_ASSERT_MSG(s.events > before, "round %d: no snapshot with new events in 60 s: serve stalled (log %s)", r,
		                log);
		sample(&s);
		int delay_ms = rand() % 400;
		double t_end = mfs_now_s() + delay_ms / 1000.0;
		while (mfs_now_s() < t_end) { /* sample snapshots while it runs */
			s = sh_read(snap);
			sample(&s);
			nanosleep(&(struct timespec){0, 5 * 1000000}, NULL);
		}
		kill(pid, SIGKILL);
		int st;
		waitpid(pid, &st, 0);
		TEST_ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
		kills++;
		s = sh_read(snap);
		sample(&s);
		fprintf(stderr, "  round %d: killed after %d ms; snapshot events_applied=%" PRIu64 " of %" PRIu64 "\n", r,
		        delay_ms, s.events, total);
	}
	/* a clean run drains the topic */
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-kill9-final", log, NULL, extra);
	int died;
	sh_snap_t s;
	double t_end = mfs_now_s() + test_seconds(90);
	do { /* applied + held out reach every valid event */
		s = sh_wait_events(snap, pid, 1, 5, &died);
		if (s.events + s.held_out + s.dropped >= total)
			break;
		nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
	} while (!died && mfs_now_s() < t_end);
	TEST_ASSERT_MSG(!died && s.events + s.held_out + s.dropped == total,
	                "final: events_applied %" PRIu64 " + held out %" PRIu64 " + dropped %" PRIu64 " of %" PRIu64
	                " (log %s)", s.events, s.held_out, s.dropped, total, log);
	/* and the offsets reach the high watermarks: the last round's rejected messages follow
	 * its valid events, so they may still be on their way when the events are all in */
	int64_t lo[N_PARTS], hi[N_PARTS];
	sh_watermarks(bs, topic, N_PARTS, lo, hi);
	s = sh_wait_offsets(snap, pid, N_PARTS, hi, 60, &died);
	TEST_ASSERT_MSG(!died, "final: serve exited while draining the rejected messages (log %s)", log);
	TEST_EQ_INT(sh_stop(pid, 30), 0);

	s = sh_read(snap);
	sample(&s);
	TEST_EQ_INT(s.events + s.held_out + s.dropped, total);
	const uint64_t kept = total - s.dropped;
	TEST_ASSERT_MSG(s.held_out > kept / 40 && s.held_out < kept / 10, "held out %" PRIu64 " of %" PRIu64, s.held_out,
	                kept);
	TEST_EQ_INT(s.mu_count, kept);
	TEST_ASSERT_MSG(isfinite(s.holdout_rmse) && s.holdout_rmse < 2.0, "holdout_rmse %g", s.holdout_rmse);
	sh_check_drained(&s, N_PARTS, lo, hi, ROUNDS);

	/* the invariant, for every snapshot we saw: count, digest and rating sum of the events it
	 * holds equal those of the valid events below its offsets */
	int bad = sh_count_inconsistent(bs, topic, N_PARTS, hi, samples, n_samples);
	TEST_ASSERT_MSG(bad == 0, "%d of %d snapshots break the invariant", bad, n_samples);
	fprintf(stderr, "  %d kills, %d snapshots checked, %" PRIu64 " events applied, held out or dropped exactly once (%"
	        PRIu64 " dropped)\n", kills, n_samples, total, s.dropped);
#ifdef KILL9_CHECK
	KILL9_CHECK(snap, &s, total);
#endif
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_kill9_exactly_once);
	return TEST_REPORT();
}
