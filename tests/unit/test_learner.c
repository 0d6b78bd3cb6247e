/* test_learner.c - the streaming learner (serve/learner.h) driven without a broker: the test
 * pushes batches into its queue as the consumer would, with its own commit callback.
 *
 * Checked: a barrier's snapshot holds exactly the batches pushed before it (events, offsets,
 * digest) and its offsets are committed after it, only those that changed; what a batch kept
 * alive is released once, after the batch is applied; held-out events and rejections are
 * counted and survive a restart; closing the queue without a barrier still publishes what was
 * applied; a batch the engine refuses stops the learner, fails the queue's waiters and
 * publishes nothing. Prequential scores: the first batch of a backlog is scored no worse than
 * the mean predictor (the mean it uses is that of the events before, never 0), and the
 * cumulative score continues across a restart. Replay: the updates it spends after the events
 * reach the next snapshot's rows, while its offsets, events, digest and mean stay those of
 * the events.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "config/config.h"
#include "serve/batcher.h"
#include "serve/learner.h"
#include "serve/meta.h"
#include "snapshots/snap_format.h"
#include "snapshots/snap_load.h"
#include "model_store/life.h"
#include "testhelp.h"

static int g_kept, g_freed; /* buffers handed to batches, and released by the queue */

static void keep_free(void *p)
{
	g_freed++;
	free(p);
}

/* What the learner committed: the last offset per (topic, partition) and how. */
typedef struct commits {
	char topic[8][16];
	int32_t part[8];
	int64_t next[8];
	int n, calls, sync_calls, entries;
} commits_t;

static int rec_commit(void *ctx, const mfs_offset_t *offs, size_t n, int sync)
{
	commits_t *c = ctx;
	c->calls++;
	c->sync_calls += sync != 0;
	for (size_t j = 0; j < n; j++) {
		int k = 0;
		while (k < c->n && !(c->part[k] == offs[j].partition && strcmp(c->topic[k], offs[j].topic) == 0))
			k++;
		if (k == c->n && c->n < 8) {
			snprintf(c->topic[k], sizeof c->topic[k], "%s", offs[j].topic);
			c->part[k] = offs[j].partition;
			c->n++;
		}
		if (k < 8)
			c->next[k] = offs[j].next;
		c->entries++;
	}
	return 0;
}

static int64_t committed(const commits_t *c, const char *topic, int32_t part)
{
	for (int k = 0; k < c->n; k++)
		if (c->part[k] == part && strcmp(c->topic[k], topic) == 0)
			return c->next[k];
	return -1;
}

static void conf_for(mfs_conf_t *c, const char *dir, const char *prequential)
{
	char err[256];
	TEST_OK(mfs_conf_init(c));
	const char *kv[][2] = {{"snapshot.dir", dir},          {"engine.kind", "cpu"},
	                       {"engine.deterministic", "true"}, {"model.k", "8"},
	                       {"serve.snapshot_ms", "86400000"}, {"serve.fullpass_ms", "86400000"},
	                       {"serve.prequential", prequential}, {"snapshot.sync", "none"},
	                       {"serve.replay", "0"}}; /* tests of replay turn it on */
	for (size_t j = 0; j < sizeof kv / sizeof kv[0]; j++)
		TEST_ASSERT_MSG(mfs_conf_set(c, kv[j][0], kv[j][1], err, sizeof err) == 0, "%s", err);
}

/* A batch of n events (string users "u<k>" that point into a buffer the batch keeps, u64
 * items) advancing (topic, part) to next; its digest is added to *digest. rating NaN: every
 * event has that rating. holdout: the batch marks held-out events as the consumer does. */
static void push(mfs_batchq_t *q, const char *topic, int32_t part, int64_t next, int first, int n, float rating,
                 double holdout, uint64_t *digest, uint64_t *held)
{
	mfs_ebatch_t *b = mfs_batchq_get(q);
	TEST_ASSERT(b != NULL);
	char *names = malloc((size_t)n * 16);
	mfs_event_t *ev = calloc((size_t)n, sizeof *ev);
	for (int j = 0; j < n; j++) {
		int len = snprintf(names + 16 * j, 16, "u%d", (first + j) % 37);
		ev[j].user = (mfs_id_t){MFS_ID_STR, (uint16_t)len, 0, names + 16 * j};
		ev[j].item = mfs_id_u64((uint64_t)((first + j) % 23));
		ev[j].rating = isnan(rating) ? rating : 1.0f + (float)((first + j) % 5);
		*digest += mfs_event_digest(&ev[j]);
		if (held)
			*held += holdout > 0 && mfs_event_holdout_u(&ev[j]) < holdout;
	}
	TEST_OK(mfs_ebatch_add_events(b, ev, (size_t)n, names, mfs_wall_ms(), holdout));
	g_kept++;
	free(ev);
	TEST_OK(mfs_ebatch_advance(b, topic, part, next));
	b->messages = 1;
	TEST_OK(mfs_batchq_push(q, b, 60000));
}

/* Push a barrier of kind and wait for its snapshot. @return mfs_batchq_wait_barrier's result. */
static int barrier(mfs_batchq_t *q, int kind)
{
	mfs_ebatch_t *b = mfs_batchq_get(q);
	b->barrier = kind;
	const uint64_t gen = b->barrier_gen = mfs_batchq_next_barrier(q); /* b is the learner's once pushed */
	int rc = mfs_batchq_push(q, b, 60000);
	if (rc) {
		mfs_ebatch_free(b);
		return rc;
	}
	return mfs_batchq_wait_barrier(q, gen);
}

/* The snapshot of dir, loaded into a fresh model: events applied, the offset of (topic, part). */
static uint64_t loaded_events(const char *dir, mfs_snap_loaded_t *ld)
{
	mfs_model_conf_t mc = {8, 0.1, 42};
	mfs_model_t *m = NULL;
	char err[256];
	TEST_OK(mfs_model_init(&mc, &m));
	int rc = mfs_snap_load(dir, m, ld, err, sizeof err);
	TEST_ASSERT_MSG(rc == 0, "%s", err);
	uint64_t ev = m->events_applied;
	mfs_model_free(m);
	return ev;
}

static int64_t offset_of(const mfs_snap_loaded_t *ld, const char *topic, int32_t part)
{
	for (size_t j = 0; j < ld->n_offsets; j++)
		if (ld->offsets[j].partition == part && strcmp(ld->offsets[j].topic, topic) == 0)
			return ld->offsets[j].next;
	return -1;
}

static void test_barriers_hold_exactly_what_came_before(void)
{
	const char *dir = test_tmpdir();
	mfs_conf_t c;
	conf_for(&c, dir, "true");
	mfs_batchq_t q;
	TEST_OK(mfs_batchq_init(&q, 4, keep_free));
	mfs_learner_t *l = NULL;
	char err[512];
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	TEST_EQ_INT(mfs_learner_loaded(l)->n_offsets, 0);
	commits_t cm = {0};
	TEST_ASSERT_MSG(mfs_learner_start(l, rec_commit, &cm, err, sizeof err) == 0, "%s", err);
	g_kept = g_freed = 0;
	uint64_t digest = 0;
	push(&q, "t", 0, 10, 0, 100, 0, 0, &digest, NULL);
	push(&q, "t", 1, 5, 100, 100, 0, 0, &digest, NULL);
	push(&q, "t", 0, 20, 200, 100, 0, 0, &digest, NULL);
	TEST_OK(barrier(&q, MFS_EBATCH_SNAPSHOT));
	mfs_learner_stats_t st;
	mfs_learner_get_stats(l, &st);
	TEST_EQ_INT(st.events_applied, 300);
	TEST_EQ_INT(st.snapshots, 1);
	TEST_EQ_INT(st.snap_seq, 1);
	/* committed after the barrier's snapshot, synchronously: exactly its offsets */
	TEST_EQ_INT(committed(&cm, "t", 0), 20);
	TEST_EQ_INT(committed(&cm, "t", 1), 5);
	TEST_EQ_INT(cm.sync_calls, 1);
	TEST_EQ_INT(cm.entries, 2);
	uint64_t digest_at_barrier = digest;
	push(&q, "t", 1, 9, 300, 200, 0, 0, &digest, NULL);
	push(&q, "u", 2, 3, 500, 50, 0, 0, &digest, NULL);
	TEST_OK(barrier(&q, MFS_EBATCH_FINAL));
	TEST_ASSERT_MSG(mfs_learner_join(l, err, sizeof err) == 0, "%s", err);
	/* only what changed is committed again */
	TEST_EQ_INT(committed(&cm, "t", 1), 9);
	TEST_EQ_INT(committed(&cm, "u", 2), 3);
	TEST_EQ_INT(cm.entries, 4);
	mfs_learner_get_stats(l, &st);
	TEST_EQ_INT(st.events_applied, 550);
	TEST_EQ_INT(st.snapshots, 2);
	TEST_ASSERT(digest != digest_at_barrier);
	mfs_learner_close(l);
	/* every batch's buffer released once (the barrier batches kept none) */
	TEST_EQ_INT(g_kept, 5);
	TEST_EQ_INT(g_freed, 5);

	mfs_snap_loaded_t ld;
	TEST_EQ_INT(loaded_events(dir, &ld), 550);
	TEST_EQ_INT(ld.seq, 2);
	TEST_EQ_INT(ld.n_offsets, 3);
	TEST_EQ_INT(offset_of(&ld, "t", 0), 20);
	TEST_EQ_INT(offset_of(&ld, "t", 1), 9);
	TEST_EQ_INT(offset_of(&ld, "u", 2), 3);
	const mfs_snap_extra_t *x = mfs_snap_loaded_extra(&ld, MFS_META_DIGEST);
	TEST_ASSERT(x != NULL && x->u64 == digest);
	TEST_ASSERT(mfs_snap_loaded_extra(&ld, MFS_META_PQ_RMSE) != NULL); /* prequential on */
	TEST_EQ_INT(ld.n_users, 37);
	TEST_EQ_INT(ld.n_items, 23);
	mfs_snap_loaded_free(&ld);

	/* a restart resumes at the snapshot's offsets */
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	const mfs_snap_loaded_t *rl = mfs_learner_loaded(l);
	TEST_EQ_INT(rl->n_offsets, 3);
	TEST_EQ_INT(offset_of(rl, "t", 0), 20);
	TEST_EQ_INT(offset_of(rl, "u", 2), 3);
	mfs_learner_get_stats(l, &st);
	TEST_EQ_INT(st.events_applied, 550);
	mfs_learner_close(l);
	mfs_batchq_destroy(&q);
	mfs_conf_free(&c);
}

static void test_holdout_and_rejections_survive_a_restart(void)
{
	const char *dir = test_tmpdir();
	mfs_conf_t c;
	conf_for(&c, dir, "false");
	char err[512];
	TEST_OK(mfs_conf_set(&c, "serve.holdout_fraction", "0.3", err, sizeof err));
	mfs_batchq_t q;
	TEST_OK(mfs_batchq_init(&q, 2, keep_free));
	mfs_learner_t *l = NULL;
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	TEST_ASSERT_MSG(mfs_learner_start(l, NULL, NULL, err, sizeof err) == 0, "%s", err);
	uint64_t digest = 0, held = 0;
	push(&q, "t", 0, 1, 0, 400, 0, 0.3, &digest, &held);
	mfs_ebatch_t *b = mfs_batchq_get(&q); /* two rejected messages, no events */
	b->rejected[MFS_REJ_NAN] = 2;
	b->messages = 2;
	TEST_OK(mfs_ebatch_advance(b, "t", 0, 3));
	TEST_OK(mfs_batchq_push(&q, b, 60000));
	TEST_OK(barrier(&q, MFS_EBATCH_FINAL));
	TEST_ASSERT_MSG(mfs_learner_join(l, err, sizeof err) == 0, "%s", err);
	mfs_learner_stats_t st;
	mfs_learner_get_stats(l, &st);
	TEST_ASSERT(held > 0 && held < 400);
	TEST_EQ_INT(st.events_held_out, held);
	TEST_EQ_INT(st.events_applied, 400 - held);
	TEST_EQ_INT(st.rejected[MFS_REJ_NAN], 2);
	TEST_EQ_INT(st.messages, 3);
	mfs_learner_close(l);

	mfs_snap_loaded_t ld;
	TEST_EQ_INT(loaded_events(dir, &ld), 400 - held);
	TEST_EQ_INT(offset_of(&ld, "t", 0), 3);
	TEST_ASSERT(mfs_snap_loaded_extra(&ld, MFS_META_PQ_RMSE) == NULL); /* prequential off */
	mfs_serve_meta_t meta;
	mfs_serve_meta_restore(&ld, &meta);
	TEST_EQ_INT(meta.held_out, held);
	TEST_EQ_INT(meta.rejected[MFS_REJ_NAN], 2);
	TEST_EQ_INT(meta.rejected[MFS_REJ_EMPTY], 0);
	TEST_EQ_INT(meta.digest, digest);
	TEST_EQ_INT(meta.mu_count, 400);
	mfs_snap_loaded_free(&ld);

	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	mfs_learner_get_stats(l, &st);
	TEST_EQ_INT(st.events_held_out, held);
	TEST_EQ_INT(st.rejected[MFS_REJ_NAN], 2);
	mfs_learner_close(l);
	mfs_batchq_destroy(&q);
	mfs_conf_free(&c);
}

/* The consumer side may stop without a barrier (closing the queue): what was applied is
 * still published. */
static void test_close_without_barrier_publishes(void)
{
	const char *dir = test_tmpdir();
	mfs_conf_t c;
	conf_for(&c, dir, "true");
	mfs_batchq_t q;
	TEST_OK(mfs_batchq_init(&q, 2, keep_free));
	mfs_learner_t *l = NULL;
	char err[512];
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	TEST_ASSERT_MSG(mfs_learner_start(l, NULL, NULL, err, sizeof err) == 0, "%s", err);
	uint64_t digest = 0;
	push(&q, "t", 4, 77, 0, 120, 0, 0, &digest, NULL);
	mfs_batchq_close(&q);
	TEST_ASSERT_MSG(mfs_learner_join(l, err, sizeof err) == 0, "%s", err);
	mfs_learner_close(l);
	mfs_snap_loaded_t ld;
	TEST_EQ_INT(loaded_events(dir, &ld), 120);
	TEST_EQ_INT(offset_of(&ld, "t", 4), 77);
	mfs_snap_loaded_free(&ld);
	mfs_batchq_destroy(&q);
	mfs_conf_free(&c);
}

/* A batch the engine refuses (NaN ratings: the consumer never sends them, so this is a bug
 * upstream) stops the learner with the engine's error; the queue's waiters see EPIPE and
 * nothing of it is published. */
static void test_refused_batch_stops_the_learner(void)
{
	const char *dir = test_tmpdir();
	mfs_conf_t c;
	conf_for(&c, dir, "false");
	mfs_batchq_t q;
	TEST_OK(mfs_batchq_init(&q, 2, keep_free));
	mfs_learner_t *l = NULL;
	char err[512] = "";
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	TEST_ASSERT_MSG(mfs_learner_start(l, NULL, NULL, err, sizeof err) == 0, "%s", err);
	uint64_t digest = 0;
	push(&q, "t", 0, 10, 0, 50, NAN, 0, &digest, NULL);
	TEST_EQ_INT(barrier(&q, MFS_EBATCH_FINAL), EPIPE);
	err[0] = '\0';
	int rc = mfs_learner_join(l, err, sizeof err);
	TEST_EQ_INT(rc, MFS_ENAN);
	TEST_ASSERT_MSG(strstr(err, "engine sgd") != NULL, "err \"%s\"", err);
	mfs_learner_close(l);
	mfs_model_conf_t mc = {8, 0.1, 42};
	mfs_model_t *m = NULL;
	mfs_snap_loaded_t ld;
	TEST_OK(mfs_model_init(&mc, &m));
	TEST_EQ_INT(mfs_snap_load(dir, m, &ld, err, sizeof err), MFS_ENOTFOUND);
	mfs_model_free(m);
	mfs_batchq_destroy(&q);
	mfs_conf_free(&c);
}

/* The first batch of a backlog, 30,000 events at once: scored with running means of the events
 * before each piece, so no worse (within 1 %) than predicting the batch's own mean; with a mean
 * of 0 it would be about 3. The cumulative score is in the snapshot and continues after a
 * restart. */
static void test_prequential_first_batch(void)
{
	const char *dir = test_tmpdir();
	mfs_conf_t c;
	conf_for(&c, dir, "true");
	mfs_batchq_t q;
	TEST_OK(mfs_batchq_init(&q, 2, keep_free));
	mfs_learner_t *l = NULL;
	char err[512];
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	TEST_ASSERT_MSG(mfs_learner_start(l, NULL, NULL, err, sizeof err) == 0, "%s", err);
	uint64_t digest = 0;
	const int n = 30000;
	push(&q, "t", 0, 1, 0, n, 0, 0, &digest, NULL); /* ratings 1 + (k % 5): mean 3 */
	TEST_OK(barrier(&q, MFS_EBATCH_FINAL));
	TEST_ASSERT_MSG(mfs_learner_join(l, err, sizeof err) == 0, "%s", err);
	mfs_learner_stats_t st;
	mfs_learner_get_stats(l, &st);
	double sse = 0, mean = 0;
	for (int k = 0; k < n; k++)
		mean += 1.0 + (double)(k % 5);
	mean /= n;
	for (int k = 0; k < n; k++)
		sse += (1.0 + (double)(k % 5) - mean) * (1.0 + (double)(k % 5) - mean);
	const double mean_rmse = sqrt(sse / n);
	fprintf(stderr, "  first batch: prequential RMSE %.4f, the batch mean's %.4f\n", st.prequential_rmse, mean_rmse);
	TEST_ASSERT_MSG(st.prequential_rmse <= 1.01 * mean_rmse, "prequential %.4f, mean predictor %.4f",
	                st.prequential_rmse, mean_rmse);
	TEST_ASSERT(st.prequential_cumulative_rmse == st.prequential_rmse);
	TEST_ASSERT(st.prequential_window_rmse == st.prequential_rmse);
	const double cum = st.prequential_cumulative_rmse;
	mfs_learner_close(l);
	mfs_snap_loaded_t ld;
	TEST_EQ_INT(loaded_events(dir, &ld), n);
	const mfs_snap_extra_t *x = mfs_snap_loaded_extra(&ld, MFS_META_PQ_CUM_N);
	TEST_ASSERT(x != NULL && x->u64 == (uint64_t)n);
	x = mfs_snap_loaded_extra(&ld, MFS_META_PQ_CUM_RMSE);
	TEST_ASSERT(x != NULL && x->f64 == cum);
	mfs_snap_loaded_free(&ld);
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	TEST_ASSERT_MSG(mfs_learner_start(l, NULL, NULL, err, sizeof err) == 0, "%s", err);
	mfs_learner_get_stats(l, &st);
	TEST_NEAR(st.prequential_cumulative_rmse, cum, 1e-12); /* resumed from the snapshot */
	mfs_batchq_close(&q);
	TEST_ASSERT_MSG(mfs_learner_join(l, err, sizeof err) == 0, "%s", err);
	mfs_learner_close(l);
	mfs_batchq_destroy(&q);
	mfs_conf_free(&c);
}

/* The snapshot of dir: user u<j>'s bias and factors (k = 8) into out[j][0..8], j < 37; its mean
 * and events applied. */
static void user_values(const char *dir, float out[37][9], mfs_snap_loaded_t *ld, double *mu, uint64_t *events)
{
	mfs_model_conf_t mc = {8, 0.1, 42};
	mfs_model_t *m = NULL;
	char err[256];
	TEST_OK(mfs_model_init(&mc, &m));
	int rc = mfs_snap_load(dir, m, ld, err, sizeof err);
	TEST_ASSERT_MSG(rc == 0, "%s", err);
	for (int j = 0; j < 37; j++) {
		char name[16];
		int len = snprintf(name, sizeof name, "u%d", j);
		mfs_id_t id = {MFS_ID_STR, (uint16_t)len, 0, name};
		uint32_t row = mfs_idmap_find(m->users, &id);
		TEST_ASSERT_MSG(row != MFS_ROW_NONE, "u%d", j);
		out[j][0] = m->bu[row];
		memcpy(out[j] + 1, m->P + (size_t)row * 8, 8 * sizeof(float));
	}
	*mu = m->mu;
	*events = m->events_applied;
	mfs_model_free(m);
}

/* Replay (serve.replay 4): the events' barrier snapshot comes first (the barrier was queued
 * behind them before the learner started, and new batches go before replay); then the learner
 * spends 4 x 300 updates on the window, and the next snapshot holds the rows they changed,
 * with the same offsets, events applied, digest and mean as before: replay repeats events,
 * it adds none. */
/* model.max_users: once the table holds its bound, an event with a new user is dropped and
 * counted (events_dropped), neither applied nor held out nor in the mean, but in the digest
 * and below the offsets; known users keep learning; the count survives a restart. */
static void test_bounded_users_drop_and_count(void)
{
	const char *dir = test_tmpdir();
	mfs_conf_t c;
	conf_for(&c, dir, "true");
	char err[512];
	TEST_OK(mfs_conf_set(&c, "model.max_users", "20", err, sizeof err));
	TEST_OK(mfs_conf_set(&c, "model.on_full", "drop", err, sizeof err));
	mfs_batchq_t q;
	TEST_OK(mfs_batchq_init(&q, 4, keep_free));
	for (int round = 0; round < 2; round++) {
		mfs_learner_t *l = NULL;
		TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
		TEST_ASSERT_MSG(mfs_learner_start(l, NULL, NULL, err, sizeof err) == 0, "%s", err);
		uint64_t digest = 0;
		/* users u0..u36 in turn: u0..u19 take the 20 rows, u20..u36 (17 of every 37) are dropped */
		push(&q, "t", 0, 10 + round, 370 * round, round ? 37 : 370, 0, 0, &digest, NULL);
		TEST_OK(barrier(&q, MFS_EBATCH_FINAL));
		TEST_ASSERT_MSG(mfs_learner_join(l, err, sizeof err) == 0, "%s", err);
		mfs_learner_stats_t st;
		mfs_learner_get_stats(l, &st);
		TEST_EQ_INT(st.n_users, 20);
		TEST_EQ_INT(st.events_dropped, round ? 170 + 17 : 170);
		TEST_EQ_INT(st.events_applied, round ? 200 + 20 : 200);
		mfs_learner_close(l);
		mfs_snap_loaded_t ld;
		TEST_EQ_INT(loaded_events(dir, &ld), round ? 220 : 200);
		const mfs_snap_extra_t *x = mfs_snap_loaded_extra(&ld, MFS_META_DROPPED);
		TEST_ASSERT(x != NULL && x->u64 == (round ? 187u : 170u));
		x = mfs_snap_loaded_extra(&ld, MFS_META_MU_COUNT);
		TEST_ASSERT(x != NULL && x->u64 == (round ? 220u : 200u));
		TEST_EQ_INT(offset_of(&ld, "t", 0), 10 + round);
		mfs_snap_loaded_free(&ld);
	}
	mfs_batchq_destroy(&q);
	mfs_conf_free(&c);
}

/* model.admit_after: a new id takes a row at its third sighting; events of ids not admitted yet
 * are dropped and counted, and the counts per table match an exact reference. */
static void test_admission(void)
{
	const char *dir = test_tmpdir();
	mfs_conf_t c;
	conf_for(&c, dir, "true");
	char err[512];
	TEST_OK(mfs_conf_set(&c, "model.admit_after", "3", err, sizeof err));
	mfs_batchq_t q;
	TEST_OK(mfs_batchq_init(&q, 4, keep_free));
	mfs_learner_t *l = NULL;
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	TEST_ASSERT_MSG(mfs_learner_start(l, NULL, NULL, err, sizeof err) == 0, "%s", err);
	uint64_t digest = 0;
	push(&q, "t", 0, 10, 0, 370, 0, 0, &digest, NULL); /* users j % 37, items j % 23 */
	TEST_OK(barrier(&q, MFS_EBATCH_FINAL));
	TEST_ASSERT_MSG(mfs_learner_join(l, err, sizeof err) == 0, "%s", err);
	/* the reference: each table on its own, in event order */
	int seen_u[37] = {0}, seen_i[23] = {0};
	uint64_t dropped = 0;
	for (int j = 0; j < 370; j++) {
		const int u = ++seen_u[j % 37] >= 3, i = ++seen_i[j % 23] >= 3;
		dropped += !(u && i);
	}
	mfs_learner_stats_t st;
	mfs_learner_get_stats(l, &st);
	fprintf(stderr, "  admission after 3 sightings: %llu of 370 events dropped\n", (unsigned long long)st.events_dropped);
	TEST_EQ_INT(st.n_users, 37);
	TEST_EQ_INT(st.n_items, 23);
	TEST_EQ_INT(st.not_admitted[0], 37 * 2);
	TEST_EQ_INT(st.not_admitted[1], 23 * 2);
	TEST_EQ_INT(st.events_dropped, dropped);
	TEST_EQ_INT(st.events_applied, 370 - dropped);
	mfs_learner_close(l);
	mfs_batchq_destroy(&q);
	mfs_conf_free(&c);
}

static void test_replay_reaches_the_snapshot_not_the_counters(void)
{
	const char *dir = test_tmpdir();
	mfs_conf_t c;
	conf_for(&c, dir, "true");
	char err[512];
	TEST_OK(mfs_conf_set(&c, "serve.replay", "4", err, sizeof err));
	TEST_OK(mfs_conf_set(&c, "serve.replay_chunk", "64", err, sizeof err));
	mfs_batchq_t q;
	TEST_OK(mfs_batchq_init(&q, 4, keep_free));
	mfs_learner_t *l = NULL;
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	uint64_t digest = 0;
	push(&q, "t", 0, 10, 0, 300, 0, 0, &digest, NULL);
	mfs_ebatch_t *b = mfs_batchq_get(&q);
	b->barrier = MFS_EBATCH_SNAPSHOT;
	const uint64_t gen = b->barrier_gen = mfs_batchq_next_barrier(&q);
	TEST_OK(mfs_batchq_push(&q, b, 60000));
	TEST_ASSERT_MSG(mfs_learner_start(l, NULL, NULL, err, sizeof err) == 0, "%s", err);
	TEST_OK(mfs_batchq_wait_barrier(&q, gen));
	float v1[37][9], v2[37][9];
	mfs_snap_loaded_t ld1, ld2;
	double mu1, mu2;
	uint64_t ev1, ev2;
	user_values(dir, v1, &ld1, &mu1, &ev1);
	TEST_EQ_INT(ev1, 300);
	const mfs_snap_extra_t *x = mfs_snap_loaded_extra(&ld1, MFS_META_REPLAYED);
	TEST_ASSERT(x != NULL && x->u64 == 0);
	/* wait for the replay owed to be spent (a condition, not a clock) */
	mfs_learner_stats_t st;
	for (;;) {
		mfs_learner_get_stats(l, &st);
		if (st.events_replayed == 4 * 300 && st.replay_owed < 1)
			break;
		mfs_sleep_ms(5);
	}
	TEST_EQ_INT(st.events_applied, 300);
	TEST_OK(barrier(&q, MFS_EBATCH_FINAL));
	TEST_ASSERT_MSG(mfs_learner_join(l, err, sizeof err) == 0, "%s", err);
	mfs_learner_close(l);
	user_values(dir, v2, &ld2, &mu2, &ev2);
	TEST_EQ_INT(ld2.seq, 2);
	TEST_EQ_INT(ev2, 300);
	TEST_EQ_INT(offset_of(&ld2, "t", 0), 10);
	x = mfs_snap_loaded_extra(&ld2, MFS_META_REPLAYED);
	TEST_ASSERT(x != NULL && x->u64 == 4 * 300);
	x = mfs_snap_loaded_extra(&ld2, MFS_META_DIGEST);
	TEST_ASSERT(x != NULL && x->u64 == digest);
	x = mfs_snap_loaded_extra(&ld2, MFS_META_MU_COUNT);
	TEST_ASSERT(x != NULL && x->u64 == 300);
	TEST_ASSERT(mu2 == mu1);
	int changed = 0;
	for (int j = 0; j < 37; j++)
		changed += memcmp(v1[j], v2[j], sizeof v1[j]) != 0;
	fprintf(stderr, "  replay: %d of 37 users changed between the snapshots\n", changed);
	TEST_ASSERT_MSG(changed == 37, "%d of 37 users changed", changed); /* 1200 draws over 37 users */
	mfs_snap_loaded_free(&ld1);
	mfs_snap_loaded_free(&ld2);
	/* events_replayed continues after a restart */
	TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
	mfs_learner_get_stats(l, &st);
	TEST_EQ_INT(st.events_replayed, 4 * 300);
	mfs_learner_close(l);
	mfs_batchq_destroy(&q);
	mfs_conf_free(&c);
}

/* A batch deleting user "u<k>" (and advancing (topic, part) to next). */
static void push_delete_user(mfs_batchq_t *q, const char *topic, int32_t part, int64_t next, int k)
{
	mfs_ebatch_t *b = mfs_batchq_get(q);
	TEST_ASSERT(b != NULL);
	char *name = malloc(16);
	int len = snprintf(name, 16, "u%d", k);
	mfs_event_t ev = {.op = MFS_OP_DEL_USER, .user = {MFS_ID_STR, (uint16_t)len, 0, name}};
	TEST_OK(mfs_ebatch_add_events(b, &ev, 1, name, mfs_wall_ms(), 0));
	g_kept++;
	TEST_OK(mfs_ebatch_advance(b, topic, part, next));
	b->messages = 1;
	TEST_OK(mfs_batchq_push(q, b, 60000));
}

/* The users of dir's snapshot, as a bitmap of k for ids "u<k>" (k < 37); *records: their number. */
static uint64_t snapshot_users(const char *dir, size_t *records)
{
	mfs_model_conf_t mc = {8, 0.1, 42};
	mfs_model_t *m = NULL;
	mfs_snap_loaded_t ld;
	char err[256];
	TEST_OK(mfs_model_init(&mc, &m));
	int rc = mfs_snap_load(dir, m, &ld, err, sizeof err);
	TEST_ASSERT_MSG(rc == 0, "%s", err);
	uint64_t set = 0;
	for (int j = 0; j < 37; j++) {
		char name[16];
		int len = snprintf(name, sizeof name, "u%d", j);
		mfs_id_t id = {MFS_ID_STR, (uint16_t)len, 0, name};
		if (mfs_idmap_find(m->users, &id) != MFS_ROW_NONE)
			set |= 1ull << j;
	}
	*records = mfs_model_live(m, 0);
	TEST_EQ_INT(ld.n_users, *records);
	mfs_snap_loaded_free(&ld);
	mfs_model_free(m);
	return set;
}

/* The id lifecycle through the learner and its snapshots: a bounded user table (model.max_users
 * 10, eviction) keeps at most 10 users in every snapshot, the ones seen last; a deleted user is
 * absent from the next snapshot and from every later one, across a restart, until it comes
 * back, and then it is there again. */
static void test_evict_and_delete_reach_the_snapshots(void)
{
	const char *dir = test_tmpdir();
	mfs_conf_t c;
	conf_for(&c, dir, "false");
	char err[512];
	TEST_OK(mfs_conf_set(&c, "model.max_users", "10", err, sizeof err));
	mfs_batchq_t q;
	TEST_OK(mfs_batchq_init(&q, 4, keep_free));
	int64_t next = 1;
	uint64_t digest = 0;
	size_t records;
	for (int round = 0; round < 3; round++) {
		mfs_learner_t *l = NULL;
		TEST_ASSERT_MSG(mfs_learner_open(&c, &q, &l, err, sizeof err) == 0, "%s", err);
		TEST_ASSERT_MSG(mfs_learner_start(l, NULL, NULL, err, sizeof err) == 0, "%s", err);
		if (round == 0) {
			/* 37 batches of 10 users each, (10 b + j) % 37: the table fills, then evicts */
			for (int b = 0; b < 37; b++)
				push(&q, "t", 0, next++, 10 * b, 10, 0, 0, &digest, NULL);
			TEST_OK(barrier(&q, MFS_EBATCH_SNAPSHOT));
			const uint64_t set = snapshot_users(dir, &records);
			TEST_EQ_INT(records, 10);
			/* the last batch's users: (360 .. 369) % 37 = 27 .. 36 */
			for (int k = 27; k < 37; k++)
				TEST_ASSERT_MSG(set >> k & 1, "u%d (seen last) is not in the snapshot", k);
			push_delete_user(&q, "t", 0, next++, 30);
			TEST_OK(barrier(&q, MFS_EBATCH_SNAPSHOT));
			TEST_ASSERT(!(snapshot_users(dir, &records) >> 30 & 1));
			TEST_EQ_INT(records, 9);
			/* ratings by other users: u30 stays out of every later snapshot */
			push(&q, "t", 0, next++, 31, 5, 0, 0, &digest, NULL); /* u31 .. u35 */
		} else if (round == 1) { /* after a restart from the snapshot: still out */
			push(&q, "t", 0, next++, 27, 3, 0, 0, &digest, NULL); /* u27 .. u29 */
		} else { /* u30 comes back: a fresh row */
			push(&q, "t", 0, next++, 30, 1, 0, 0, &digest, NULL);
		}
		TEST_OK(barrier(&q, MFS_EBATCH_FINAL));
		TEST_ASSERT_MSG(mfs_learner_join(l, err, sizeof err) == 0, "%s", err);
		mfs_learner_stats_t st;
		mfs_learner_get_stats(l, &st);
		mfs_learner_close(l);
		const uint64_t set = snapshot_users(dir, &records);
		TEST_ASSERT_MSG((set >> 30 & 1) == (round == 2), "round %d: u30 %s", round, set >> 30 & 1 ? "present" : "absent");
		TEST_ASSERT(records <= 10);
		TEST_EQ_INT(st.events_dropped, 0);
		mfs_snap_loaded_t ld;
		loaded_events(dir, &ld);
		TEST_EQ_INT(offset_of(&ld, "t", 0), next - 1);
		mfs_snap_loaded_free(&ld);
	}
	mfs_batchq_destroy(&q);
	mfs_conf_free(&c);
}

int main(void)
{
	mfs_log_set_level(MFS_LOG_WARN);
	TEST_RUN(test_barriers_hold_exactly_what_came_before);
	TEST_RUN(test_holdout_and_rejections_survive_a_restart);
	TEST_RUN(test_close_without_barrier_publishes);
	TEST_RUN(test_refused_batch_stops_the_learner);
	TEST_RUN(test_prequential_first_batch);
	TEST_RUN(test_replay_reaches_the_snapshot_not_the_counters);
	TEST_RUN(test_bounded_users_drop_and_count);
	TEST_RUN(test_admission);
	TEST_RUN(test_evict_and_delete_reach_the_snapshots);
	return TEST_REPORT();
}
