/* test_serve_delete.c - the right to be forgotten through the whole service (docs/EVENT_FORMAT.md,
 * "Delete events"; docs/OPERATIONS.md, "The id lifecycle"): ratings of users 1..U are applied;
 * delete events for users 1..D and items 1..DI go through Kafka (produced like ratings, keyed by
 * the id); once a snapshot counts them, serve is killed with SIGKILL and started again on the
 * same directory. From the snapshot that covers the deletions on, and after the restart, the
 * deleted ids are absent for every reader (libmfsnap lookups; the meta's row counts) while the
 * others are there; more ratings by other users do not bring them back; a deleted user that
 * rates again is there once more, afresh.
 * The users' rated lists (user_rated, snapshot.seen_items; issue 20) go the same way: every user
 * who rated has one; a deleted user's goes in the snapshot that deletes the row; a rating streamed
 * after the restart lands at the end of its user's list in the next snapshot, merged with the
 * list stored before; the deleted user who rates again starts a fresh list. */
#include "serve_help.h"
#include "rated_help.h"

#define N_PARTS 4
#define DEL_USERS 40
#define DEL_ITEMS 5

struct meta_want {
	const char *key;
	uint64_t v;
};

static int meta_cb(void *ctx, const char *k, size_t kl, const unsigned char *val, size_t vl)
{
	struct meta_want *w = ctx;
	if (kl == strlen(w->key) && memcmp(k, w->key, kl) == 0 && vl == 8) {
		w->v = 0;
		for (int j = 7; j >= 0; j--)
			w->v = w->v << 8 | val[j];
	}
	return 0;
}

/* The u64 meta record `key` of dir's snapshot (UINT64_MAX: none). */
static uint64_t meta_u64(const char *dir, const char *key)
{
	struct meta_want w = {key, UINT64_MAX};
	mfs_snap_t *h = NULL;
	char e[256];
	if (mfs_snap_open(dir, &h, e, sizeof e) != 0)
		return UINT64_MAX;
	mfs_snap_meta_each(h, meta_cb, &w);
	mfs_snap_close(h);
	return w.v;
}

/* Send events ev[0..n) into topic (keyed as the producer keys them), flushed. */
static void send_events(const char *bs, const char *topic, const mfs_event_t *ev, size_t n)
{
	mfs_conf_t c;
	char e[512];
	TEST_OK(mfs_conf_init(&c));
	mfs_producer_opts_t po = {.brokers = bs, .topic = topic, .batch = 100};
	mfs_producer_t *p = NULL;
	int rc = mfs_producer_open(&c, &po, &p, e, sizeof e);
	TEST_ASSERT_MSG(rc == 0, "%s", e);
	for (size_t j = 0; rc == 0 && j < n; j++)
		TEST_OK(mfs_producer_send(p, &ev[j]));
	if (rc == 0)
		TEST_OK(mfs_producer_flush(p, e, sizeof e));
	mfs_producer_close(p);
	mfs_conf_free(&c);
}

/* Send one delete event per id 1..n of entity ent (0 users, 1 items). */
static void produce_deletes(const char *bs, const char *topic, int ent, int n)
{
	mfs_event_t ev[64] = {{0}};
	for (int j = 0; j < n && j < 64; j++) {
		ev[j].op = ent ? MFS_OP_DEL_ITEM : MFS_OP_DEL_USER;
		*(ent ? &ev[j].item : &ev[j].user) = mfs_id_u64((uint64_t)j + 1);
	}
	send_events(bs, topic, ev, (size_t)n);
}

/* How many of ids 1..n of entity ent the snapshot in dir holds. */
static int present(const char *dir, int ent, int from, int to)
{
	mfs_snap_t *h = NULL;
	char e[256];
	if (mfs_snap_open(dir, &h, e, sizeof e) != 0)
		return -1;
	float b, v[64];
	int n = 0;
	for (int j = from; j <= to; j++) {
		mfs_snap_id_t id = {MFS_SNAP_ID_U64, (uint64_t)j, NULL, 0};
		n += (ent ? mfs_snap_item(h, &id, &b, v) : mfs_snap_user(h, &id, &b, v)) == 0;
	}
	mfs_snap_close(h);
	return n;
}

/* How many of users from..to have a user_rated list in dir. */
static int lists(const char *dir, int from, int to)
{
	char buf[8192];
	int n = 0;
	for (int j = from; j <= to; j++)
		n += strcmp(list_u64(dir, (uint64_t)j, buf, sizeof buf), "-") != 0;
	return n;
}

static void test_deleted_ids_stay_deleted(void)
{
	sh_env_t v;
	if (sh_env_open(&v, 1, "ratings-del", N_PARTS))
		return;
	const char *bs = v.bs, *topic = v.topic, *snap = v.snap, *log = v.log;
	const char *const extra[] = {"--serve.fullpass_ms", "200", NULL};
	uint64_t total = sh_produce_valid(bs, topic, 20000, 11); /* users 1..3000, items 1..1500 */
	pid_t pid = sh_spawn(bs, topic, snap, "mfs-test-del-0", log, NULL, extra);
	int died;
	sh_snap_t s = sh_wait_events(snap, pid, total, 60, &died);
	TEST_ASSERT_MSG(!died && s.events == total, "applied %" PRIu64 " of %" PRIu64 " (log %s)", s.events, total, log);
	const int u_before = present(snap, 0, 1, DEL_USERS), i_before = present(snap, 1, 1, DEL_ITEMS);
	fprintf(stderr, "  before: %d of users 1..%d, %d of items 1..%d\n", u_before, DEL_USERS, i_before, DEL_ITEMS);
	TEST_ASSERT(u_before > DEL_USERS / 2 && i_before == DEL_ITEMS);
	TEST_EQ_INT(lists(snap, 1, DEL_USERS), u_before); /* every user who rated has a list */
	char keep[8192], now[8192];
	list_u64(snap, DEL_USERS + 1, keep, sizeof keep); /* merged with later ratings below */
	TEST_ASSERT_MSG(strcmp(keep, "-") != 0 && strcmp(keep, "?") != 0, "user %d has a list: %s", DEL_USERS + 1, keep);

	produce_deletes(bs, topic, 0, DEL_USERS);
	produce_deletes(bs, topic, 1, DEL_ITEMS);
	/* the snapshot that covers them: kill -9 right then */
	const double end = mfs_now_s() + test_seconds(60);
	while ((meta_u64(snap, "users_deleted") != (uint64_t)u_before ||
	        meta_u64(snap, "items_deleted") != (uint64_t)i_before) && mfs_now_s() < end)
		nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
	TEST_EQ_INT(meta_u64(snap, "users_deleted"), u_before);
	TEST_EQ_INT(meta_u64(snap, "items_deleted"), i_before);
	TEST_EQ_INT(present(snap, 0, 1, DEL_USERS), 0);
	TEST_EQ_INT(present(snap, 1, 1, DEL_ITEMS), 0);
	TEST_EQ_INT(lists(snap, 1, DEL_USERS), 0); /* no list left behind */
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	TEST_EQ_INT(present(snap, 0, 1, DEL_USERS), 0);

	/* restart; other users rate on: the deleted ones stay out */
	pid = sh_spawn(bs, topic, snap, "mfs-test-del-1", log, NULL, extra);
	const uint64_t more = 5000;
	{ /* ratings by users DEL_USERS+1 .. only */
		mfs_event_t *ev = calloc(more, sizeof *ev);
		for (uint64_t j = 0; j < more; j++)
			ev[j] = (mfs_event_t){.user = mfs_id_u64(DEL_USERS + 1 + j % 500),
			                      .item = mfs_id_u64(DEL_ITEMS + 1 + j % 300), .rating = 3.0f};
		send_events(bs, topic, ev, more);
		free(ev);
	}
	s = sh_wait_events(snap, pid, total + more, 60, &died);
	TEST_ASSERT_MSG(!died && s.events == total + more, "applied %" PRIu64 " of %" PRIu64, s.events, total + more);
	TEST_EQ_INT(present(snap, 0, 1, DEL_USERS), 0);
	TEST_EQ_INT(present(snap, 1, 1, DEL_ITEMS), 0);
	TEST_EQ_INT(lists(snap, 1, DEL_USERS), 0);
	/* user DEL_USERS+1 rated items 6, 206, 106, 6, ... (j = 0, 500, ...; the last 6 at j = 4500):
	 * the stored list, less those, then 206,106,6 (the newest place of each) */
	{
		char want[8192] = "", *save = NULL, *ids[128];
		size_t o = 0, n = 0;
		for (char *t = strtok_r(keep, ",", &save); t && n < 125; t = strtok_r(NULL, ",", &save))
			if (strcmp(t, "6") && strcmp(t, "106") && strcmp(t, "206"))
				ids[n++] = t;
		ids[n++] = "206", ids[n++] = "106", ids[n++] = "6";
		for (size_t j = n > 100 ? n - 100 : 0; j < n; j++) /* snapshot.seen_items = 100 */
			o += (size_t)snprintf(want + o, sizeof want - o, "%s%s", o ? "," : "", ids[j]);
		TEST_STR_EQ(list_u64(snap, DEL_USERS + 1, now, sizeof now), want);
	}
	/* user 1 rates again: there once more */
	const mfs_event_t back = {.user = mfs_id_u64(1), .item = mfs_id_u64(DEL_ITEMS + 1), .rating = 4.0f};
	send_events(bs, topic, &back, 1);
	s = sh_wait_events(snap, pid, total + more + 1, 60, &died);
	TEST_EQ_INT(present(snap, 0, 1, 1), 1);
	TEST_EQ_INT(present(snap, 0, 2, DEL_USERS), 0);
	TEST_STR_EQ(list_u64(snap, 1, now, sizeof now), "6"); /* afresh: only the new rating */
	TEST_EQ_INT(lists(snap, 2, DEL_USERS), 0);
	TEST_EQ_INT(sh_stop(pid, 30), 0);
	fprintf(stderr, "  %d users and %d items deleted, absent after kill -9 and restart and %" PRIu64
	        " more events; user 1 back after one rating\n", u_before, i_before, more);
	sh_env_close(&v);
}

int main(void)
{
	if (access(test_bin(), X_OK) != 0)
		TEST_SKIP("no mfstream binary at %s", test_bin());
	TEST_RUN(test_deleted_ids_stay_deleted);
	return TEST_REPORT();
}
