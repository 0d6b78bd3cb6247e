/* test_replay.c - replay's budget and sampling (serve/replay.h) over a retained window
 * (serve/window.h).
 *
 * Checked: new training events earn share x n updates, capped at share x the window's
 * capacity, and nothing with share 0 or an empty window; a chunk is at most serve.replay_chunk
 * and pays its size from the debt; every replayed rating is one the window holds now (never an
 * overwritten one, never a slot past the end), and each is counted once in its slot; the
 * learning-rate scale follows 1 / (1 + beta c^1.5) with c = 1 + the mean replays before.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/replay.h"
#include "serve/window.h"
#include "testhelp.h"

/* Append n ratings (u = from + j, i = u + 1000, r = u % 5) to w. */
static void window_fill(mfs_window_t *w, uint32_t from, size_t n)
{
	uint32_t *u = malloc(n * sizeof *u), *i = malloc(n * sizeof *i);
	float *r = malloc(n * sizeof *r);
	for (size_t j = 0; j < n; j++) {
		u[j] = from + (uint32_t)j;
		i[j] = u[j] + 1000;
		r[j] = (float)(u[j] % 5);
	}
	mfs_batch_t b = {u, i, r, n};
	TEST_OK(mfs_window_add(w, &b));
	free(u);
	free(i);
	free(r);
}

static void test_budget(void)
{
	mfs_window_t w = {.cap = 100};
	mfs_replay_t rp;
	mfs_replay_init(&rp, 3, w.cap, 64, 0.05, 1);
	TEST_ASSERT(!mfs_replay_due(&rp, &w)); /* nothing owed, nothing held */
	mfs_replay_credit(&rp, 10);
	TEST_NEAR(rp.debt, 30, 0);
	TEST_ASSERT(!mfs_replay_due(&rp, &w)); /* owed, but the window is empty */
	window_fill(&w, 0, 10);
	TEST_ASSERT(mfs_replay_due(&rp, &w));
	mfs_replay_credit(&rp, 1000); /* capped at share x capacity */
	TEST_NEAR(rp.debt, 300, 0);
	mfs_batch_t b;
	TEST_OK(mfs_replay_next(&rp, &w, &b));
	TEST_EQ_INT(b.n, 64); /* at most a chunk */
	TEST_NEAR(rp.debt, 236, 0);
	uint64_t total = 64;
	while (mfs_replay_due(&rp, &w)) {
		TEST_OK(mfs_replay_next(&rp, &w, &b));
		TEST_ASSERT(b.n > 0 && b.n <= 64);
		total += b.n;
	}
	TEST_EQ_INT(total, 300);
	TEST_EQ_INT(rp.replayed, 300);
	TEST_ASSERT(rp.debt < 1);
	mfs_replay_free(&rp);

	mfs_replay_init(&rp, 0, w.cap, 64, 0.05, 1); /* off */
	mfs_replay_credit(&rp, 1000);
	TEST_ASSERT(!mfs_replay_due(&rp, &w));
	mfs_replay_free(&rp);
	mfs_window_free(&w);
}

/* A full window that has wrapped: 250 ratings through 100 slots leave u = 150..249. */
static void test_samples_are_held_ratings(void)
{
	mfs_window_t w = {.cap = 100};
	window_fill(&w, 0, 250);
	TEST_EQ_INT(w.n, 100);
	mfs_replay_t rp;
	mfs_replay_init(&rp, 50, w.cap, 1000, 0.05, 7);
	mfs_replay_credit(&rp, 100); /* 5000 updates: 50 per rating on average */
	uint64_t n = 0, hits[100] = {0};
	while (mfs_replay_due(&rp, &w)) {
		mfs_batch_t b;
		TEST_OK(mfs_replay_next(&rp, &w, &b));
		for (size_t j = 0; j < b.n; j++) {
			TEST_ASSERT_MSG(b.u[j] >= 150 && b.u[j] < 250, "u %u is not in the window", b.u[j]);
			TEST_ASSERT(b.i[j] == b.u[j] + 1000 && b.r[j] == (float)(b.u[j] % 5));
			if (b.u[j] >= 150 && b.u[j] < 250)
				hits[b.u[j] - 150]++;
		}
		n += b.n;
	}
	TEST_EQ_INT(n, 5000);
	/* each draw counted in its slot; every rating drawn (runs of 32 at random places) */
	uint64_t seen = 0;
	int never = 0;
	for (size_t s = 0; s < 100; s++) {
		seen += w.seen[s];
		const uint32_t u = w.u[s];
		TEST_EQ_INT(w.seen[s], hits[u - 150]);
		never += hits[u - 150] == 0;
	}
	TEST_EQ_INT(seen, 5000);
	TEST_EQ_INT(never, 0);
	/* new ratings start uncounted */
	window_fill(&w, 250, 10);
	int fresh = 0;
	for (size_t s = 0; s < 100; s++)
		fresh += w.u[s] >= 250 && w.seen[s] == 0;
	TEST_EQ_INT(fresh, 10);
	mfs_replay_free(&rp);
	mfs_window_free(&w);
}

/* The first replay of a rating is its second pass: scale 1 / (1 + beta); after every rating
 * was replayed 3 times, 1 / (1 + beta 4^1.5). */
static void test_lr_scale(void)
{
	mfs_window_t w = {.cap = MFS_REPLAY_RUN}; /* one run covers every slot: a chunk is exactly one pass */
	window_fill(&w, 0, MFS_REPLAY_RUN);
	mfs_replay_t rp;
	const double beta = 0.05;
	mfs_replay_init(&rp, 1, w.cap, MFS_REPLAY_RUN, beta, 3);
	TEST_NEAR(rp.lr_scale, 1.0, 0);
	for (int pass = 0; pass < 4; pass++) {
		mfs_replay_credit(&rp, MFS_REPLAY_RUN);
		mfs_batch_t b;
		TEST_OK(mfs_replay_next(&rp, &w, &b));
		TEST_EQ_INT(b.n, MFS_REPLAY_RUN);
		const double want = 1.0 / (1.0 + beta * pow(1.0 + pass, 1.5));
		TEST_NEAR(rp.lr_scale, want, 1e-6);
		for (size_t s = 0; s < w.n; s++)
			TEST_EQ_INT(w.seen[s], pass + 1);
	}
	mfs_replay_free(&rp);
	mfs_window_free(&w);
}

/* Recency (tau > 0): runs are drawn by age, e^(-age / tau), in a ring that has wrapped: the
 * replayed users (= arrival numbers) sit near the newest, with the spread tau gives. */
static void test_recency(void)
{
	mfs_window_t w = {.cap = 10000};
	window_fill(&w, 0, 25000); /* wrapped: holds 15000 .. 24999, newest 24999 */
	mfs_replay_t rp;
	mfs_replay_init(&rp, 1, w.cap, 4096, 0, 3);
	rp.tau = 500;
	double sum_age = 0;
	size_t n = 0, old = 0;
	for (int c = 0; c < 20; c++) {
		mfs_replay_credit(&rp, 4096);
		mfs_batch_t b;
		TEST_OK(mfs_replay_next(&rp, &w, &b));
		for (size_t j = 0; j < b.n; j++) {
			TEST_ASSERT(b.u[j] >= 15000 && b.u[j] <= 24999);
			sum_age += 24999.0 - b.u[j];
			old += b.u[j] < 24999 - 5000;
			n++;
		}
	}
	const double mean_age = sum_age / (double)n;
	fprintf(stderr, "  tau 500: mean age %.0f ratings, %zu of %zu older than 5000\n", mean_age, old, n);
	TEST_ASSERT_MSG(mean_age > 400 && mean_age < 700, "mean age %.0f", mean_age); /* tau + half a run */
	TEST_ASSERT(old < n / 1000);
	mfs_replay_free(&rp);
	mfs_window_free(&w);
}

int main(void)
{
	TEST_RUN(test_budget);
	TEST_RUN(test_samples_are_held_ratings);
	TEST_RUN(test_lr_scale);
	TEST_RUN(test_recency);
	return TEST_REPORT();
}
