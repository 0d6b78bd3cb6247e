/* snap_help.h - fixtures of the snapshot tests (test_snapshot.c, test_snap_stage.c): a seeded
 * random model, default publish info, one publish, and checks of every row through libmfsnap.
 * Include after testhelp.h and model_help.h. */
#ifndef MFS_TEST_SNAP_HELP_H
#define MFS_TEST_SNAP_HELP_H

static char errbuf[1024];

/* ---- fixtures ------------------------------------------------------------------------- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static inline uint64_t rng_next(void)
{
	uint64_t x = rng_state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545F4914F6CDD1Dull;
}

/* A finite float with random bits: any sign, exponent (subnormals and -0 included). */
static inline float rand_finite(void)
{
	for (;;) {
		uint32_t b = (uint32_t)rng_next();
		float f;
		memcpy(&f, &b, 4);
		if (isfinite(f))
			return f;
	}
}

static inline mfs_model_t *model_new(int k)
{
	mfs_model_conf_t c = {k, 0.1, 7};
	mfs_model_t *m = NULL;
	TEST_OK(mfs_model_init(&c, &m));
	m->mu = 3.25;
	m->events_applied = 12345;
	return m;
}

static inline void fill_random(mfs_model_t *m)
{
	for (uint32_t r = 0; r < m->n_users; r++) {
		m->bu[r] = rand_finite();
		for (int j = 0; j < m->k; j++)
			m->P[(size_t)r * m->k + j] = rand_finite();
	}
	for (uint32_t r = 0; r < m->n_items; r++) {
		m->bi[r] = rand_finite();
		for (int j = 0; j < m->k; j++)
			m->Q[(size_t)r * m->k + j] = rand_finite();
	}
}

static inline mfs_snap_info_t info_default(void)
{
	mfs_snap_info_t in;
	memset(&in, 0, sizeof in);
	in.learning_rate = 0.01;
	in.last_loss = NAN;
	in.rating_min = 1.0;
	in.rating_max = 5.0;
	return in;
}

/* Open a writer, publish once, close. Returns the publish rc. */
static inline int publish_once(const char *dir, size_t map_size, const mfs_model_t *m, const mfs_snap_info_t *in,
                        uint64_t *seq)
{
	mfs_snap_writer_t *w = NULL;
	int rc = mfs_snap_writer_open(dir, map_size, &w, errbuf, sizeof errbuf);
	if (rc)
		return rc;
	rc = mfs_snap_publish(w, m, in, seq, errbuf, sizeof errbuf);
	mfs_snap_writer_close(w);
	return rc;
}

static inline mfs_snap_id_t snap_id_of(mfs_id_t id)
{
	mfs_snap_id_t s = {id.kind == MFS_ID_U64 ? MFS_SNAP_ID_U64 : MFS_SNAP_ID_STR, id.num, id.str, id.len};
	return s;
}

/* Every row of the model reads back bit-exactly. */
static inline void check_all_rows(mfs_snap_t *s, const mfs_model_t *m)
{
	float *vec = malloc((size_t)m->k * sizeof *vec);
	float bias;
	for (int ent = 0; ent < 2; ent++) {
		uint32_t n = ent ? m->n_items : m->n_users;
		int bad = 0;
		for (uint32_t r = 0; r < n; r++) {
			mfs_snap_id_t id = snap_id_of(mfs_idmap_key(ent ? m->items : m->users, r));
			int rc = ent ? mfs_snap_item(s, &id, &bias, vec) : mfs_snap_user(s, &id, &bias, vec);
			const float *b = ent ? m->bi : m->bu;
			const float *F = (ent ? m->Q : m->P) + (size_t)r * m->k;
			if (rc || memcmp(&bias, &b[r], 4) || memcmp(vec, F, (size_t)m->k * 4))
				bad++;
		}
		TEST_ASSERT_MSG(bad == 0, "%s: %d of %u rows differ", ent ? "items" : "users", bad, n);
	}
	free(vec);
}

/* ---- round trip ------------------------------------------------------------------------- */

#endif
