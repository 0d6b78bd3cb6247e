/* test_serve_kill9_evict.c - the kill -9 proof with bounded tables that evict (model.max_users
 * 1000 and model.max_items 600 against 3000 users and 1500 items; docs/OPERATIONS.md, "The id
 * lifecycle"): rows are freed and given to new ids all the time, removed ids are deleted from
 * the snapshots, and every snapshot still holds exactly the events below its offsets (applied,
 * held out, or dropped where no row could be evicted). The snapshot's tables stay within the
 * bounds. */
#define KILL9_FLAGS                                                                                          \
	"--serve.holdout_fraction", "0.05", "--serve.fullpass_ms", "200", "--model.max_users", "1000",        \
		"--model.max_items", "600"
#define KILL9_CHECK check_bounded
#include <stdint.h>
struct sh_snap;
static void check_bounded(const char *dir, const struct sh_snap *s, uint64_t total);
#include "test_serve_kill9.c"

static int find_evicted(void *ctx, const char *key, size_t kl, const unsigned char *val, size_t vl)
{
	if (kl == 13 && memcmp(key, "users_evicted", 13) == 0 && vl == 8)
		for (int j = 7; j >= 0; j--)
			*(uint64_t *)ctx = *(uint64_t *)ctx << 8 | val[j];
	return 0;
}

/* The final snapshot: its user and item records within the bounds, and users were evicted. */
static void check_bounded(const char *dir, const struct sh_snap *s, uint64_t total)
{
	(void)s;
	(void)total;
	mfs_snap_t *h = NULL;
	char e[256];
	int rc = mfs_snap_open(dir, &h, e, sizeof e);
	TEST_ASSERT_MSG(rc == 0, "%s", e);
	if (rc)
		return;
	mfs_snap_meta_t m;
	TEST_OK(mfs_snap_get_meta(h, &m));
	fprintf(stderr, "  final snapshot: %llu users, %llu items\n", (unsigned long long)m.n_users,
	        (unsigned long long)m.n_items);
	TEST_ASSERT(m.n_users <= 1000 && m.n_items <= 600 && m.n_users > 0);
	uint64_t evicted = 0;
	TEST_OK(mfs_snap_meta_each(h, find_evicted, &evicted));
	fprintf(stderr, "  users evicted over the whole run: %llu\n", (unsigned long long)evicted);
	TEST_ASSERT(evicted >= 2000); /* 3000 distinct users through 1000 rows */
	mfs_snap_close(h);
}
