/* sharded.c - the sharded engine (engine.devices; docs/SCALE_OUT.md): one model over S engines
 * of one kind, S CUDA devices, or S CPU engines where no GPU is (the same scheme, tested in CI).
 * It implements the engine interface, so serve and train do not know it is there.
 *
 * DESIGN
 *
 * Shards. Shard s holds the user rows r with r % S == s at local row r / S (gpu/shard.h) and a
 * replica of the whole item table. Each shard is an ordinary engine on a model of its own (a
 * plain mfs_model_t without id maps: rows, arrays, mu); this engine routes every call:
 *   batches  split by user shard, input order kept, user rows made local; each part goes to
 *            its engine (a CUDA ring takes it and returns: the devices work at once);
 *   sets     split the same way, and each shard's part cut into conf.merge_pieces pieces by
 *            rating (a seeded hash of its index; pieces only under heavy skew, where the CUDA
 *            engine runs iid anyway); an epoch runs piece x on every shard at once (a
 *            thread per shard for device engines), merges, then piece x + 1;
 *   loss     each shard scores its users' ratings against its own replica; the sums are added
 *            in shard order (a rating of an unknown user, MFS_ROW_NONE, on shard 0);
 *   grow, reset_rows, sync, capture   rows copied between the caller's model and the shards'.
 * The shards' host models are this engine's; the caller's model holds the ids, the global
 * rows and (after sync) the values.
 *
 * Merges. Items drift apart on the replicas between merges. Per item row this engine counts the
 * ratings each shard was given since the row's last merge (the routing sees them). A merge
 * combines the replicas of a set of rows by BLEND (gpu/shard.h: the estimate of what serial SGD
 * would have done; a row one shard alone changed takes that shard's value) and writes the
 * result to every replica and to the base (the value at the last merge, BLEND's q0). When:
 *   - every conf.merge_batches batches, every row changed since its last merge;
 *   - after every piece of a set (and, with conf.merge_hot_stream, every batch), the rows one
 *     shard gave conf.merge_hot ratings or more in it: hot rows drift fastest, and under skew
 *     they are few (docs/BENCHMARKS.md, "Sharding, CPU reference"). Off for batches by default:
 *     each merge stops the devices' persistent kernels, and at a stream's batch sizes the hot
 *     rows drift little between the full merges (docs/SCALE_OUT.md);
 *   - before sync and capture (snapshots see one item table) and at the end of every epoch.
 * The rule is the CPU reference's (gpu/cpu/shard_ref.c, allreduce with hot_ratings), and with
 * CPU shards in deterministic mode this engine reproduces it bit for bit (test_sharded). The
 * merge itself is the kind's: CUDA engines merge on their devices (gpu/cuda/merge.cu: rows
 * gathered, copied device to device, merged by the same rule on every device); engines on host
 * arrays (CPU) are merged here by mfs_merge_row_ref, from and into a base of this engine's own.
 *
 * Progress. A batch is applied when every shard has applied its part and its merges are done:
 * a FIFO of the shards' tickets per batch, popped as they are reached. Its ticket is taken, and
 * its events counted, when the caller gives it (as the CUDA ring counts them: updates a CPU
 * shard's non-finite guard skips count too; that engine logs them).
 *
 * Threads. One thread calls this engine (engine.h). Streaming batches, new rows (grow) and rows
 * given to new ids (reset_rows) are copied into a queue of DRV_SLOTS and applied, in order, on a
 * driver thread of this engine's own (mfs-shards: routing, the shards' submissions and the
 * merges leave the caller's thread); every other call but progress and memory first waits until
 * the queue is empty and the driver idle (quiesce), and then has the shards to itself, since
 * only the caller queues. The driver reads nothing of the caller's model: what it applies
 * carries its values, mean and rates. conf.batches_inline applies batches on the caller's thread
 * (tests compare the two). capture_wait may run on another thread, touching only cap_*.
 *
 * Ownership: this engine owns its shards (engines and models), the routing scratch, the counts
 * and the sets' pieces; the caller's model is kept, not owned, and read afresh at every call.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fault.h"
#include "common/grow.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/thread.h"
#include "common/timeutil.h"
#include "gpu/cpu/cpu_ref.h"
#include "gpu/engine_int.h"
#ifdef MFS_HAVE_CUDA
#include "gpu/cuda/cuda_probe.h"
#endif

/* BLEND's |p|^2 of a piece: at most this many of its ratings' users (every n / this-th). */
#define P2_SAMPLE 8192
/* A set runs in pieces only where at least this share of its ratings falls on rows that are hot
 * in a piece: measured on the 1M x 1M x 100M sets, 2 H200s (docs/BENCHMARKS.md, "Sharded over a
 * host's GPUs"), Zipf 0.8 (51 % on such rows at 16 pieces) lost 0.6 % RMSE in one piece and ran
 * 1.8x faster than in 16; Zipf 1.2 (91 %) lost 5.2 % in one piece. */
#define HOT_SHARE_MIN 0.8

/* The caller's new rows for the shards: its model grew from nu0 users and ni0 items to nu and
 * ni; P, bu hold the values of users nu0 .. nu - 1, Q, bi of items ni0 .. ni - 1 (the caller's
 * arrays, or a queued copy of them). */
struct rows_in {
	uint32_t nu0, nu, ni0, ni;
	const float *P, *bu, *Q, *bi;
	double mu;
};

/* What the caller queues for the driver: a streaming batch (a copy of the caller's, with what
 * the caller's model and rate were when it was given), new rows (grow: a copy of them), or rows
 * given to new ids (reset: the rows in u, n of them, their values in P and bu). */
#define DRV_SLOTS 4
struct slot {
	int grow, reset, ent, in_flight;
	uint32_t *u, *i;
	float *r;
	size_t n, cap_u, cap_i, cap_r;
	float lr_scale;
	int repeat;
	double mu;
	mfs_hparams_t hp;
	struct rows_in g;
	float *P, *bu, *Q, *bi;
	size_t cap_P, cap_bu, cap_Q, cap_bi;
};

/* A shard's part of a routed batch: user rows local, input order. */
struct part {
	uint32_t *u, *i;
	float *r;
	size_t n, cap_u, cap_i, cap_r;
};

struct shard {
	mfs_engine_t *e;
	mfs_model_t m;       /* this shard's users at local rows, its replica of the items */
	struct part b, l;    /* its part of the last batch (BLEND's |p|^2 reads its users), of a loss */
	uint64_t applied;    /* m.events_applied already added to the caller's model */
	/* capture: local user rows, and where each goes in the caller's dst */
	uint32_t *cap_rows;
	size_t *cap_pos;
	float *cap_vals;
	size_t cap_n, cap_rows_n, cap_pos_n, cap_vals_n; /* used, and each array's capacity */
};

/* One piece of a set: the shards' sets, and the merge after it. */
struct piece {
	mfs_resident_t *set[MFS_SHARD_MAX];
	uint32_t *p2[MFS_SHARD_MAX]; /* local user rows sampled for |p|^2 */
	size_t p2_n[MFS_SHARD_MAX];
	uint32_t *rows, *cnt;        /* the rows merged after it, and their counts (n x S) */
	size_t n;
	mfs_merge_job_t job;
};

struct sharded_set {
	uint32_t pieces;
	struct piece *pc;
	uint64_t ratings;
};

struct sharded {
	uint32_t S;
	struct shard sh[MFS_SHARD_MAX];
	int host;               /* the shards work on host arrays: merges here */
	int threads;            /* run the shards of a set's piece on threads (device engines) */
	int k;
	/* since the last merge, per item row: each shard's ratings (cap_items x S), and the rows
	 * with any, in first-touch order */
	uint32_t *cnt;
	uint32_t *bcnt;         /* the same, in the batch being applied (the hot rows' test) */
	uint8_t *in_uni;
	uint32_t *uni;
	size_t nuni, cap_i;
	uint32_t since;         /* batches since the last merge of every row */
	/* merge scratch */
	uint32_t *m_rows, *m_cnt;
	size_t m_rows_cap, m_cnt_cap;
	float *acc;
	double *tq;
	/* progress: per batch not known applied, every shard's ticket */
	uint64_t *fifo;         /* fcap x S */
	size_t fhead, fn, fcap;
	uint64_t ticket, done;
	/* capture */
	int cap_pending;
	float *cap_du;
	uint64_t merges, rows_merged;
	double run_s, merge_s;  /* epochs: wall time in the shards' pieces and in merges (logged at close) */
	mfs_model_t base;       /* host shards: the item rows as of their last merge (BLEND's q0) */
	mfs_hparams_t hp;       /* what the merges use: the batch's (queued with it), else e->hp */
	double mu;              /* the global mean of the batch being applied */
	/* the driver: streaming batches queued by the caller and applied on a thread of this
	 * engine's own, so that routing, the shards' submissions and the merges leave the caller's
	 * thread. Everything above is the driver's while it holds a batch or any is queued, and
	 * the caller's once the queue is empty and the driver idle (quiesce): only the caller
	 * queues, so the driver cannot start again until the caller's next sgd. */
	int drv_on, drv_stop, drv_busy, drv_rc, lk_init;
	pthread_t drv;
	pthread_mutex_t lk;
	pthread_cond_t work, room;
	struct slot q[DRV_SLOTS];
	size_t q_head, q_n;
	uint64_t done_pub;      /* x->done as the driver last published it, under lk */
	uint32_t given_nu, given_ni; /* the caller's: its model's sizes at its last grow */
};

static struct sharded *impl(const mfs_engine_t *e) { return (struct sharded *)e->impl; }
static int quiesce(mfs_engine_t *e);
static int apply_reset(mfs_engine_t *e, int ent, const uint32_t *rows, size_t n, const float *F, const float *B,
                       int in_flight);

/* ---- the shards' models ------------------------------------------------------------------ */

static int grow_array(void **a, size_t have, size_t want, size_t elem)
{
	void *n = aligned_alloc(64, ((want * elem + 63) / 64) * 64);
	if (!n)
		return ENOMEM;
	if (have)
		memcpy(n, *a, have * elem);
	free(*a);
	*a = n;
	return 0;
}

/* Room for want rows of one side (factors F, biases b; have in use, cap allocated; doubling). */
static int side_reserve(float **F, float **b, uint32_t *cap, uint32_t have, uint32_t want, size_t k)
{
	if (want <= *cap)
		return 0;
	uint32_t c = *cap ? *cap : 1024;
	while (c < want)
		c = c > UINT32_MAX / 2 ? UINT32_MAX : 2 * c;
	if (grow_array((void **)F, (size_t)have * k, (size_t)c * k, sizeof(float)) ||
	    grow_array((void **)b, have, c, sizeof(float)))
		return ENOMEM;
	*cap = c;
	return 0;
}

/* Room for nu users and ni items in shard model m. */
static int model_reserve(mfs_model_t *m, uint32_t nu, uint32_t ni)
{
	const size_t k = (size_t)m->k;
	return side_reserve(&m->P, &m->bu, &m->cap_users, m->n_users, nu, k) ||
	               side_reserve(&m->Q, &m->bi, &m->cap_items, m->n_items, ni, k)
	           ? ENOMEM
	           : 0;
}

/* New rows to the shards: users to their shard at local rows, items to every replica (and the
 * host shards' base); then each engine grows. The counts follow the item table. */
static int apply_rows(mfs_engine_t *e, const struct rows_in *g)
{
	struct sharded *x = impl(e);
	const uint32_t S = x->S;
	const size_t k = (size_t)x->k;
	if (g->ni > x->cap_i) {
		size_t c = x->cap_i ? x->cap_i : 1024;
		while (c < g->ni)
			c *= 2;
		uint32_t *cnt = calloc(c * S, sizeof *cnt), *bcnt = calloc(c * S, sizeof *bcnt), *uni = malloc(c * sizeof *uni);
		uint8_t *in = calloc(c, 1);
		if (!cnt || !bcnt || !uni || !in) {
			free(cnt);
			free(bcnt);
			free(uni);
			free(in);
			return ENOMEM;
		}
		if (x->cap_i) { /* bcnt is all zero between batches */
			memcpy(cnt, x->cnt, x->cap_i * S * sizeof *cnt);
			memcpy(uni, x->uni, x->nuni * sizeof *uni);
			memcpy(in, x->in_uni, x->cap_i);
		}
		free(x->cnt);
		free(x->bcnt);
		free(x->uni);
		free(x->in_uni);
		x->cnt = cnt, x->bcnt = bcnt, x->uni = uni, x->in_uni = in, x->cap_i = c;
	}
	for (uint32_t s = 0; s < S; s++) {
		struct shard *sh = &x->sh[s];
		const uint32_t nu = mfs_shard_rows_in(g->nu, s, S);
		if (sh->m.n_items < g->ni0 || (sh->m.n_users < nu && (size_t)sh->m.n_users * S + s < g->nu0))
			return MFS_EINVAL; /* rows the shards never got: the caller's sizes went back */
		if (model_reserve(&sh->m, nu, g->ni))
			return ENOMEM;
		for (uint32_t l = sh->m.n_users; l < nu; l++) {
			const size_t r = (size_t)l * S + s - g->nu0;
			memcpy(sh->m.P + (size_t)l * k, g->P + r * k, k * sizeof(float));
			sh->m.bu[l] = g->bu[r];
		}
		if (g->ni > sh->m.n_items) {
			const size_t a = sh->m.n_items, n = g->ni - a;
			memcpy(sh->m.Q + a * k, g->Q + (a - g->ni0) * k, n * k * sizeof(float));
			memcpy(sh->m.bi + a, g->bi + (a - g->ni0), n * sizeof(float));
		}
		sh->m.n_users = nu;
		sh->m.n_items = g->ni;
		sh->m.mu = g->mu;
		int rc = mfs_engine_grow(sh->e);
		if (rc)
			return rc;
	}
	if (x->host && g->ni > x->base.n_items) { /* host shards' base: the new rows as given */
		const size_t a = x->base.n_items, n = g->ni - a;
		x->base.k = x->k;
		if (model_reserve(&x->base, 0, g->ni))
			return ENOMEM;
		memcpy(x->base.Q + a * k, g->Q + (a - g->ni0) * k, n * k * sizeof(float));
		memcpy(x->base.bi + a, g->bi + (a - g->ni0), n * sizeof(float));
		x->base.n_items = g->ni;
	}
	return 0;
}

/* The caller's queue: wait for a free slot (the first after the queued ones, its index taken
 * under the lock: head + n is the same after any pop by the driver), the caller's until given. */
static int slot_take(struct sharded *x, struct slot **out)
{
	pthread_mutex_lock(&x->lk);
	while (x->q_n == DRV_SLOTS && !x->drv_rc)
		pthread_cond_wait(&x->room, &x->lk);
	const int rc = x->drv_rc;
	*out = &x->q[(x->q_head + x->q_n) % DRV_SLOTS];
	pthread_mutex_unlock(&x->lk);
	return rc;
}

static void slot_give(struct sharded *x, int batch)
{
	pthread_mutex_lock(&x->lk);
	x->q_n++;
	x->ticket += batch ? 1 : 0;
	pthread_cond_signal(&x->work);
	pthread_mutex_unlock(&x->lk);
}

/* The caller's rows that are new since its last call go to the shards: at once, or (the
 * driver running) as a copy queued behind the batches given before, so that the caller need
 * not wait for them (a stream of new users grows the model at nearly every batch). */
static int take_rows(mfs_engine_t *e)
{
	struct sharded *x = impl(e);
	const mfs_model_t *m = e->model;
	const size_t k = (size_t)x->k;
	const uint32_t nu0 = x->given_nu, ni0 = x->given_ni;
	if (m->n_users < nu0 || m->n_items < ni0)
		return MFS_EINVAL; /* tables do not shrink */
	int rc;
	if (!x->drv_on) {
		const struct rows_in g = {nu0, m->n_users, ni0, m->n_items, m->P + (size_t)nu0 * k, m->bu + nu0,
		                          m->Q + (size_t)ni0 * k, m->bi + ni0, m->mu};
		if (!(rc = quiesce(e)) && !(rc = apply_rows(e, &g)))
			x->given_nu = m->n_users, x->given_ni = m->n_items;
		return rc;
	}
	if (m->n_users == nu0 && m->n_items == ni0)
		return 0;
	struct slot *q;
	if ((rc = slot_take(x, &q)))
		return rc;
	const size_t du = m->n_users - nu0, di = m->n_items - ni0;
	if (mfs_grow_from((void **)&q->P, &q->cap_P, du * k, sizeof *q->P, 1024) ||
	    mfs_grow_from((void **)&q->bu, &q->cap_bu, du, sizeof *q->bu, 1024) ||
	    mfs_grow_from((void **)&q->Q, &q->cap_Q, di * k, sizeof *q->Q, 1024) ||
	    mfs_grow_from((void **)&q->bi, &q->cap_bi, di, sizeof *q->bi, 1024))
		return ENOMEM;
	if (du) { /* (a side with no new rows may have no copy arrays yet) */
		memcpy(q->P, m->P + (size_t)nu0 * k, du * k * sizeof(float));
		memcpy(q->bu, m->bu + nu0, du * sizeof(float));
	}
	if (di) {
		memcpy(q->Q, m->Q + (size_t)ni0 * k, di * k * sizeof(float));
		memcpy(q->bi, m->bi + ni0, di * sizeof(float));
	}
	q->grow = 1, q->reset = 0;
	q->g = (struct rows_in){nu0, m->n_users, ni0, m->n_items, q->P, q->bu, q->Q, q->bi, m->mu};
	slot_give(x, 0);
	x->given_nu = m->n_users, x->given_ni = m->n_items;
	return 0;
}

/* Events the shards applied since the last look (epochs), onto the caller's model; absorb:
 * only note them, a streaming batch's events being counted when it is given (sharded_sgd). */
static void collect_applied(mfs_engine_t *e, int absorb)
{
	struct sharded *x = impl(e);
	for (uint32_t s = 0; s < x->S; s++) {
		struct shard *sh = &x->sh[s];
		if (!absorb)
			e->model->events_applied += sh->m.events_applied - sh->applied;
		sh->applied = sh->m.events_applied;
	}
}

static void share_mu(struct sharded *x)
{
	for (uint32_t s = 0; s < x->S; s++)
		x->sh[s].m.mu = x->mu;
}

/* The caller's thread, before anything but sgd and progress: wait until the driver has applied
 * every queued batch and is idle; from then on until the next sgd the shards are the caller's.
 * Takes the caller's rate and mean for what follows. The driver's error, if it had one. */
static int quiesce(mfs_engine_t *e)
{
	struct sharded *x = impl(e);
	int rc = 0;
	if (x->drv_on) {
		pthread_mutex_lock(&x->lk);
		while (x->q_n || x->drv_busy)
			pthread_cond_wait(&x->room, &x->lk);
		rc = x->drv_rc;
		x->done_pub = x->done;
		pthread_mutex_unlock(&x->lk);
	}
	x->hp = e->hp;
	x->mu = e->model->mu;
	return rc;
}

/* ---- merges ------------------------------------------------------------------------------- */

static int merge_reserve(struct sharded *x, size_t n)
{
	return mfs_grow_from((void **)&x->m_rows, &x->m_rows_cap, n, sizeof *x->m_rows, 1024) ||
	               mfs_grow_from((void **)&x->m_cnt, &x->m_cnt_cap, n * x->S, sizeof *x->m_cnt, 1024)
	           ? ENOMEM
	           : 0;
}

/* Merge job's rows on host arrays, from and into the base (x->base). */
static int merge_host(mfs_engine_t *e, mfs_merge_job_t *job)
{
	struct sharded *x = impl(e);
	mfs_model_t *m = &x->base;
	const uint32_t S = x->S;
	const size_t k = (size_t)x->k;
	double sum = 0, pairs = 0;
	for (uint32_t s = 0; s < S; s++) {
		double part, pp;
		mfs_norm2_pairs_ref(x->sh[s].m.P, x->k, job->p2_rows[s], job->p2_n[s], &part, &pp);
		sum = s ? sum + part : part;
		pairs = s ? pairs + pp : pp;
	}
	double lb, lq;
	mfs_merge_logs(&job->hp, sum, pairs, job->epoch_g, &lb, &lq);
	const float *rep_q[MFS_SHARD_MAX];
	float rep_b[MFS_SHARD_MAX];
	size_t bad = 0;
	for (size_t j = 0; j < job->n; j++) {
		const uint32_t i = job->rows[j];
		for (uint32_t s = 0; s < S; s++) {
			rep_q[s] = x->sh[s].m.Q + i * k;
			rep_b[s] = x->sh[s].m.bi[i];
		}
		bad += (size_t)mfs_merge_row_ref(x->k, S, job->combine, job->cnt + j * S, m->bi[i], m->Q + i * k, rep_b,
		                                 rep_q, lb, lq, x->acc, x->tq);
		m->bi[i] = x->acc[0];
		memcpy(m->Q + i * k, x->acc + 1, k * sizeof(float));
		for (uint32_t s = 0; s < S; s++) {
			x->sh[s].m.bi[i] = x->acc[0];
			memcpy(x->sh[s].m.Q + i * k, x->acc + 1, k * sizeof(float));
		}
	}
	if (bad) { /* as the devices' merge (gpu/cuda/merge.cu): stored all the same, the engine fails */
		mfs_error("engine", "msg=\"merge made item rows non-finite: the replicas diverged (a smaller learning "
		          "rate, more merges, or after an epoch in one piece engine.merge_epoch_g 1)\" rows=%zu of=%zu "
		          "shards=%u epoch_g=%g", bad, job->n, S, job->epoch_g);
		return MFS_ENAN;
	}
	return 0;
}

static int run_merge(mfs_engine_t *e, mfs_merge_job_t *job)
{
	struct sharded *x = impl(e);
	if (!job->n)
		return 0;
	job->combine = MFS_SHARD_BLEND;
	job->hp = x->hp;
	int rc;
	if ((rc = mfs_fault("engine.shard_merge"))) /* test.fault: a merge of the replicas failing */
		return rc;
	if (x->host) {
		rc = merge_host(e, job);
	} else {
		mfs_engine_t *subs[MFS_SHARD_MAX];
		for (uint32_t s = 0; s < x->S; s++)
			subs[s] = x->sh[s].e;
		rc = x->sh[0].e->iface->merge(subs, x->S, job);
	}
	if (!rc) {
		x->merges++;
		x->rows_merged += job->n;
	}
	return rc;
}

/* Merge the rows changed since their last merge: all of them, or (hot) those one shard gave
 * conf.merge_hot ratings or more in the last batch. BLEND's |p|^2 from the last batch's users. */
static int merge_pending(mfs_engine_t *e, int hot)
{
	struct sharded *x = impl(e);
	const uint32_t S = x->S, T = e->conf.merge_hot;
	if (!hot)
		x->since = 0;
	if (!x->nuni || (hot && !T))
		return 0;
	int rc = merge_reserve(x, x->nuni);
	if (rc)
		return rc;
	size_t n = 0, kept = 0;
	for (size_t j = 0; j < x->nuni; j++) {
		const uint32_t i = x->uni[j];
		const uint32_t *c = x->cnt + (size_t)i * S, *bc = x->bcnt + (size_t)i * S;
		uint32_t most = 0;
		for (uint32_t s = 0; s < S; s++)
			most = bc[s] > most ? bc[s] : most;
		if (hot && most < T) {
			x->uni[kept++] = i;
			continue;
		}
		x->m_rows[n] = i;
		memcpy(x->m_cnt + n * S, c, S * sizeof *c);
		n++;
	}
	mfs_merge_job_t job = {.rows = x->m_rows, .n = n, .cnt = x->m_cnt};
	for (uint32_t s = 0; s < S; s++) {
		job.p2_rows[s] = x->sh[s].b.u;
		job.p2_n[s] = x->sh[s].b.n;
	}
	if ((rc = run_merge(e, &job)))
		return rc; /* the counts stay: the rows are still pending */
	for (size_t j = 0; j < n; j++) {
		const uint32_t i = x->m_rows[j];
		memset(x->cnt + (size_t)i * S, 0, S * sizeof *x->cnt);
		x->in_uni[i] = 0;
	}
	x->nuni = kept;
	return 0;
}

/* ---- batches ------------------------------------------------------------------------------ */

static int part_reserve(struct part *pt, size_t n)
{
	return mfs_grow_from((void **)&pt->u, &pt->cap_u, n, sizeof *pt->u, 1024) ||
	               mfs_grow_from((void **)&pt->i, &pt->cap_i, n, sizeof *pt->i, 1024) ||
	               mfs_grow_from((void **)&pt->r, &pt->cap_r, n, sizeof *pt->r, 1024)
	           ? ENOMEM
	           : 0;
}

static void part_free(struct part *pt)
{
	free(pt->u);
	free(pt->i);
	free(pt->r);
}

/* The shard of a rating's user (a rating of an unknown user, MFS_ROW_NONE, on shard 0). */
static uint32_t shard_of(uint32_t u, uint32_t S) { return u == MFS_ROW_NONE ? 0 : mfs_shard_of_user(u, S); }

/* Split b by user shard, order kept, user rows local; loss: into the shards' loss parts, else
 * into their batch parts, counting the item rows' ratings and the union of changed rows. */
static int route(struct sharded *x, const mfs_batch_t *b, int loss)
{
	const uint32_t S = x->S;
	size_t want[MFS_SHARD_MAX] = {0};
	for (size_t j = 0; j < b->n; j++)
		want[shard_of(b->u[j], S)]++;
	for (uint32_t s = 0; s < S; s++) {
		struct part *pt = loss ? &x->sh[s].l : &x->sh[s].b;
		if (part_reserve(pt, want[s]))
			return ENOMEM;
		pt->n = 0;
	}
	for (size_t j = 0; j < b->n; j++) {
		const uint32_t u = b->u[j], i = b->i[j];
		const uint32_t s = shard_of(u, S);
		struct part *pt = loss ? &x->sh[s].l : &x->sh[s].b;
		pt->u[pt->n] = u == MFS_ROW_NONE ? u : mfs_shard_local_row(u, S);
		pt->i[pt->n] = i;
		pt->r[pt->n++] = b->r[j];
		if (!loss) {
			x->cnt[(size_t)i * S + s]++;
			x->bcnt[(size_t)i * S + s]++;
			if (!x->in_uni[i]) {
				x->in_uni[i] = 1;
				x->uni[x->nuni++] = i;
			}
		}
	}
	return 0;
}

/* Pop the batches every shard has applied. */
static void progress_pop(struct sharded *x)
{
	uint64_t applied[MFS_SHARD_MAX], t;
	for (uint32_t s = 0; s < x->S; s++)
		mfs_engine_progress(x->sh[s].e, &t, &applied[s]);
	while (x->fn) {
		const uint64_t *need = x->fifo + x->fhead * x->S;
		uint32_t s = 0;
		while (s < x->S && applied[s] >= need[s])
			s++;
		if (s < x->S)
			break;
		x->fhead = (x->fhead + 1) % x->fcap;
		x->fn--;
		x->done++;
	}
}

static int progress_push(struct sharded *x)
{
	if (x->fn == x->fcap) {
		const size_t c = x->fcap ? 2 * x->fcap : 64;
		uint64_t *f = malloc(c * x->S * sizeof *f);
		if (!f)
			return ENOMEM;
		for (size_t j = 0; j < x->fn; j++)
			memcpy(f + j * x->S, x->fifo + ((x->fhead + j) % x->fcap) * x->S, x->S * sizeof *f);
		free(x->fifo);
		x->fifo = f, x->fhead = 0, x->fcap = c;
	}
	uint64_t *slot = x->fifo + ((x->fhead + x->fn) % x->fcap) * x->S, applied;
	for (uint32_t s = 0; s < x->S; s++)
		mfs_engine_progress(x->sh[s].e, &slot[s], &applied);
	x->fn++;
	return 0;
}

/* One streaming batch: routed, each part to its shard, then the merges due (x->mu and x->hp
 * are the batch's). On the driver's thread, or the caller's with conf.batches_inline. */
static int apply_batch(mfs_engine_t *e, const mfs_batch_t *b, float lr_scale, int repeat)
{
	struct sharded *x = impl(e);
	int rc = route(x, b, 0);
	if (rc)
		return rc;
	share_mu(x);
	for (uint32_t s = 0; s < x->S && !rc; s++) {
		struct shard *sh = &x->sh[s];
		if (!sh->b.n)
			continue;
		const mfs_batch_t part = {sh->b.u, sh->b.i, sh->b.r, sh->b.n};
		if ((rc = mfs_fault("engine.shard"))) /* test.fault: a shard failing on the driver's thread */
			break;
		if ((rc = sh->e->iface->sgd(sh->e, &part, lr_scale, repeat)) == 0)
			sh->e->sgd_calls++;
	}
	collect_applied(e, 1);
	const int full = ++x->since >= e->conf.merge_batches;
	if (!rc && (full || e->conf.merge_hot_stream))
		rc = merge_pending(e, !full);
	if (!rc) /* into progress only once its merges are done: a failed one is never applied */
		rc = progress_push(x);
	progress_pop(x);
	for (uint32_t s = 0; s < x->S; s++) /* this batch's counts, back to zero */
		for (size_t j = 0; j < x->sh[s].b.n; j++)
			x->bcnt[(size_t)x->sh[s].b.i[j] * x->S + s] = 0;
	return rc;
}

/* The driver: the queued batches in order. After an error it applies nothing more (the caller
 * gets the error from its next call and stops; what was not applied is not reported applied). */
static void *drv_main(void *arg)
{
	mfs_engine_t *e = arg;
	struct sharded *x = impl(e);
	mfs_thread_name("mfs-shards");
	pthread_mutex_lock(&x->lk);
	for (;;) {
		while (!x->q_n && !x->drv_stop)
			pthread_cond_wait(&x->work, &x->lk);
		if (!x->q_n)
			break;
		struct slot *q = &x->q[x->q_head];
		const int skip = x->drv_rc != 0;
		x->drv_busy = 1;
		pthread_mutex_unlock(&x->lk);
		int rc = 0;
		if (skip) {
		} else if (q->grow) {
			rc = apply_rows(e, &q->g);
		} else if (q->reset) {
			rc = apply_reset(e, q->ent, q->u, q->n, q->P, q->bu, q->in_flight);
		} else {
			x->mu = q->mu;
			x->hp = q->hp;
			rc = apply_batch(e, &(mfs_batch_t){q->u, q->i, q->r, q->n}, q->lr_scale, q->repeat);
		}
		if (rc)
			mfs_error("engine", "msg=\"sharded engine: %s failed on the shards; nothing queued after is applied\" "
			                    "err=\"%s\"",
			          q->grow ? "new rows" : q->reset ? "rows given to new ids" : "a batch", mfs_strerror(rc));
		pthread_mutex_lock(&x->lk);
		if (rc && !x->drv_rc)
			x->drv_rc = rc;
		x->done_pub = x->done;
		x->q_head = (x->q_head + 1) % DRV_SLOTS;
		x->q_n--;
		x->drv_busy = 0;
		pthread_cond_broadcast(&x->room);
	}
	pthread_mutex_unlock(&x->lk);
	return NULL;
}

/* The caller's batch: a copy queued for the driver (waiting while DRV_SLOTS are queued), or
 * applied at once (conf.batches_inline). Its ticket is taken now, and its events counted as
 * applied, as the CUDA engine's ring counts them: every capture and sync applies them first. */
static int sharded_sgd(mfs_engine_t *e, const mfs_batch_t *b, float lr_scale, int repeat)
{
	struct sharded *x = impl(e);
	if (!x->drv_on) {
		x->hp = e->hp;
		x->mu = e->model->mu;
		int rc = apply_batch(e, b, lr_scale, repeat);
		if (!rc) {
			x->ticket++;
			e->model->events_applied += repeat ? 0 : b->n;
		}
		return rc;
	}
	struct slot *q;
	int rc = slot_take(x, &q);
	if (rc)
		return rc;
	if (mfs_grow_from((void **)&q->u, &q->cap_u, b->n, sizeof *q->u, 1024) ||
	    mfs_grow_from((void **)&q->i, &q->cap_i, b->n, sizeof *q->i, 1024) ||
	    mfs_grow_from((void **)&q->r, &q->cap_r, b->n, sizeof *q->r, 1024))
		return ENOMEM;
	memcpy(q->u, b->u, b->n * sizeof *q->u);
	memcpy(q->i, b->i, b->n * sizeof *q->i);
	memcpy(q->r, b->r, b->n * sizeof *q->r);
	q->grow = q->reset = 0;
	q->n = b->n, q->lr_scale = lr_scale, q->repeat = repeat, q->mu = e->model->mu, q->hp = e->hp;
	slot_give(x, 1);
	e->model->events_applied += repeat ? 0 : b->n;
	return 0;
}

static int sharded_loss(mfs_engine_t *e, const mfs_batch_t *b, mfs_loss_t *out)
{
	struct sharded *x = impl(e);
	int rc = quiesce(e);
	if (!rc)
		rc = route(x, b, 1);
	if (rc)
		return rc;
	share_mu(x);
	double sse = 0, sae = 0;
	for (uint32_t s = 0; s < x->S; s++) {
		struct shard *sh = &x->sh[s];
		mfs_loss_t l = {0};
		if ((rc = sh->e->iface->loss(sh->e, &(mfs_batch_t){sh->l.u, sh->l.i, sh->l.r, sh->l.n}, &l)))
			return rc;
		sse = s ? sse + l.sse : l.sse; /* shard order (S = 1: the engine's own sums) */
		sae = s ? sae + l.sae : l.sae;
	}
	out->sse = sse;
	out->sae = sae;
	out->n = b->n;
	out->rmse = b->n ? sqrt(sse / (double)b->n) : NAN;
	out->mae = b->n ? sae / (double)b->n : NAN;
	return 0;
}

/* ---- sets --------------------------------------------------------------------------------- */

static void set_free(struct sharded *x, struct sharded_set *ss)
{
	if (!ss)
		return;
	mfs_engine_t *subs[MFS_SHARD_MAX];
	for (uint32_t s = 0; s < x->S; s++)
		subs[s] = x->sh[s].e;
	for (uint32_t p = 0; ss->pc && p < ss->pieces; p++) {
		struct piece *pc = &ss->pc[p];
		if (!x->host && x->sh[0].e->iface->merge_forget)
			x->sh[0].e->iface->merge_forget(subs, x->S, &pc->job);
		for (uint32_t s = 0; s < x->S; s++) {
			if (pc->set[s])
				mfs_engine_resident_free(x->sh[s].e, pc->set[s]);
			free(pc->p2[s]);
		}
		free(pc->rows);
		free(pc->cnt);
	}
	free(ss->pc);
	free(ss);
}

/* The merges after each piece, worked out at load (the counts of a set are known): after piece
 * p the rows one shard gave merge_hot ratings since their last merge, after the last piece
 * every row with ratings since. part[j]: rating j's piece. */
static int plan_merges(mfs_engine_t *e, const mfs_batch_t *b, const uint8_t *part, struct sharded_set *ss)
{
	struct sharded *x = impl(e);
	const uint32_t S = x->S, P = ss->pieces, T = e->conf.merge_hot, ni = e->model->n_items;
	/* an epoch in one piece: its one merge takes BLEND's epoch step (gpu/shard.h) */
	const double epoch_g = P > 1 ? 0 : e->conf.merge_epoch_g > 0 ? e->conf.merge_epoch_g : mfs_shard_blend_epoch_g(S);
	uint32_t *acc = calloc((size_t)ni * S + 1, sizeof *acc), *cur = calloc((size_t)ni * S + 1, sizeof *cur);
	size_t *pstart = calloc((size_t)P + 1, sizeof *pstart);
	uint32_t *order = malloc((b->n ? b->n : 1) * sizeof *order);
	int rc = acc && cur && pstart && order ? 0 : ENOMEM;
	if (!rc) { /* the ratings of each piece, in order */
		for (size_t j = 0; j < b->n; j++)
			pstart[part[j] + 1]++;
		for (uint32_t p = 0; p < P; p++)
			pstart[p + 1] += pstart[p];
		size_t *at = malloc(((size_t)P + 1) * sizeof *at);
		if (!at) {
			rc = ENOMEM;
		} else {
			memcpy(at, pstart, ((size_t)P + 1) * sizeof *at);
			for (size_t j = 0; j < b->n; j++)
				order[at[part[j]]++] = (uint32_t)j;
			free(at);
		}
	}
	for (uint32_t p = 0; p < P && !rc; p++) {
		struct piece *pc = &ss->pc[p];
		size_t touched = 0;
		for (size_t y = pstart[p]; y < pstart[p + 1]; y++) {
			const size_t j = order[y];
			if (b->u[j] == MFS_ROW_NONE || b->i[j] == MFS_ROW_NONE)
				continue;
			acc[(size_t)b->i[j] * S + mfs_shard_of_user(b->u[j], S)]++;
			cur[(size_t)b->i[j] * S + mfs_shard_of_user(b->u[j], S)]++;
		}
		const int last = p + 1 == P;
		/* the due rows: every row with ratings after the last piece, before it the rows one shard
		 * gave T ratings in this piece (scans of the table: loads are rare, a set covers most
		 * items anyway) */
		for (uint32_t i = 0; i < ni; i++) {
			const uint32_t *c = acc + (size_t)i * S, *pcs = cur + (size_t)i * S;
			uint32_t any = 0, most = 0;
			for (uint32_t s = 0; s < S; s++) {
				any |= c[s];
				most = pcs[s] > most ? pcs[s] : most;
			}
			touched += any && (last || (T && most >= T));
		}
		pc->rows = malloc((touched ? touched : 1) * sizeof *pc->rows);
		pc->cnt = malloc((touched ? touched : 1) * S * sizeof *pc->cnt);
		if (!pc->rows || !pc->cnt) {
			rc = ENOMEM;
			break;
		}
		for (uint32_t i = 0; i < ni; i++) {
			uint32_t *c = acc + (size_t)i * S;
			const uint32_t *pcs = cur + (size_t)i * S;
			uint32_t any = 0, most = 0;
			for (uint32_t s = 0; s < S; s++) {
				any |= c[s];
				most = pcs[s] > most ? pcs[s] : most;
			}
			if (!any || !(last || (T && most >= T)))
				continue;
			pc->rows[pc->n] = i;
			memcpy(pc->cnt + pc->n * S, c, S * sizeof *c);
			memset(c, 0, S * sizeof *c);
			pc->n++;
		}
		for (size_t y = pstart[p]; y < pstart[p + 1]; y++) { /* this piece's counts, back to zero */
			const size_t j = order[y];
			if (b->u[j] != MFS_ROW_NONE && b->i[j] != MFS_ROW_NONE)
				cur[(size_t)b->i[j] * S + mfs_shard_of_user(b->u[j], S)] = 0;
		}
		pc->job = (mfs_merge_job_t){.rows = pc->rows, .n = pc->n, .cnt = pc->cnt, .keep = 1, .epoch_g = epoch_g};
		for (uint32_t s = 0; s < S; s++) {
			pc->job.p2_rows[s] = pc->p2[s];
			pc->job.p2_n[s] = pc->p2_n[s];
		}
	}
	free(acc);
	free(cur);
	free(pstart);
	free(order);
	return rc;
}

/* Pieces an epoch of set b runs in: conf.merge_pieces where at least HOT_SHARE_MIN of its
 * ratings fall on rows hot in a piece (a shard gives them merge_hot ratings in a piece's share
 * of the set), else 1: pieces cost a barrier and a merge each, and pay only where the rows that
 * drift within an epoch carry most of the set (heavy skew). */
static uint32_t pieces_for(mfs_engine_t *e, const mfs_batch_t *b)
{
	const struct sharded *x = impl(e);
	const uint32_t P = e->conf.merge_pieces ? e->conf.merge_pieces : 1, T = e->conf.merge_hot, ni = e->model->n_items;
	if (P == 1 || !T || !b->n)
		return P;
	const size_t cells = (size_t)ni * x->S;
	uint32_t *cnt = calloc(cells + 1, sizeof *cnt);
	if (!cnt)
		return P;
	uint64_t rated = 0, on_hot = 0;
	for (size_t j = 0; j < b->n; j++)
		if (b->u[j] != MFS_ROW_NONE && b->i[j] != MFS_ROW_NONE) {
			cnt[(size_t)b->i[j] * x->S + mfs_shard_of_user(b->u[j], x->S)]++;
			rated++;
		}
	for (size_t c = 0; c < cells; c++)
		on_hot += cnt[c] / P >= T ? cnt[c] : 0;
	free(cnt);
	const double share = rated ? (double)on_hot / (double)rated : 0;
	const double min = e->conf.merge_pieces_share > 0 ? e->conf.merge_pieces_share : HOT_SHARE_MIN;
	mfs_info("engine", "msg=\"sharded set hot share\" pieces=%u hot=%u share=%.3f min=%.3f", P, T, share, min);
	return share >= min ? P : 1;
}

static int sharded_resident_load(mfs_engine_t *e, const mfs_batch_t *b, mfs_resident_t **out)
{
	struct sharded *x = impl(e);
	const uint32_t S = x->S;
	const uint32_t P = pieces_for(e, b);
	const size_t n = b->n, cells = (size_t)P * S;
	struct sharded_set *ss = calloc(1, sizeof *ss);
	uint8_t *part = malloc(n ? n : 1);
	size_t *start = calloc(cells + 1, sizeof *start), *at = malloc((cells + 1) * sizeof *at);
	uint32_t *u = malloc((n ? n : 1) * sizeof *u), *it = malloc((n ? n : 1) * sizeof *it);
	float *r = malloc((n ? n : 1) * sizeof *r);
	int rc = ss && part && start && at && u && it && r && P <= 255 ? 0 : P > 255 ? MFS_EINVAL : ENOMEM;
	if (!rc)
		rc = quiesce(e);
	if (!rc) {
		ss->pieces = P;
		ss->ratings = n;
		if (!(ss->pc = calloc(P, sizeof *ss->pc)))
			rc = ENOMEM;
	}
	if (!rc) {
		/* each rating's piece, by a seeded hash of its index: every piece an iid share of each
		 * user's ratings, so a piece's hot rows settle on all of the shard's users, not on the
		 * same 1/P of them every epoch (split by user, 2 H200s at Zipf 1.2: +1.5 % test RMSE at
		 * 8 pieces, +2.0 % at 16; by rating +0.8 %, +0.1 %). Pieces are only used where most
		 * ratings are on hot rows (pieces_for), and there the CUDA engine keeps the iid order
		 * anyway (no user runs to keep whole). Then the ratings by (piece, shard), order kept,
		 * user rows local. */
		const uint64_t seed = e->conf.seed ^ 0x5A4D1ECEull;
		for (size_t j = 0; j < n; j++) {
			const uint64_t key = (uint64_t)j | 1ull << 40;
			part[j] = (uint8_t)(mfs_mix64(seed, key) % P);
			start[(size_t)part[j] * S + shard_of(b->u[j], S) + 1]++;
		}
		for (size_t c = 0; c < cells; c++)
			start[c + 1] += start[c];
		memcpy(at, start, (cells + 1) * sizeof *at);
		for (size_t j = 0; j < n; j++) {
			const size_t y = at[(size_t)part[j] * S + shard_of(b->u[j], S)]++;
			u[y] = b->u[j] == MFS_ROW_NONE ? MFS_ROW_NONE : mfs_shard_local_row(b->u[j], S);
			it[y] = b->i[j];
			r[y] = b->r[j];
		}
	}
	if (!rc)
		share_mu(x);
	for (uint32_t p = 0; p < P && !rc; p++) {
		struct piece *pc = &ss->pc[p];
		for (uint32_t s = 0; s < S && !rc; s++) {
			const size_t lo = start[(size_t)p * S + s], cnt = start[(size_t)p * S + s + 1] - lo;
			/* |p|^2's sample: every (cnt / P2_SAMPLE)-th rating's user */
			const size_t step = cnt > P2_SAMPLE ? (cnt + P2_SAMPLE - 1) / P2_SAMPLE : 1;
			size_t have = 0;
			if (!(pc->p2[s] = malloc((cnt / step + 1) * sizeof *pc->p2[s]))) {
				rc = ENOMEM;
				break;
			}
			for (size_t j = 0; j < cnt; j += step)
				if (u[lo + j] != MFS_ROW_NONE)
					pc->p2[s][have++] = u[lo + j];
			pc->p2_n[s] = have;
			rc = mfs_engine_resident_load(x->sh[s].e, &(mfs_batch_t){u + lo, it + lo, r + lo, cnt}, &pc->set[s]);
		}
	}
	if (!rc)
		rc = plan_merges(e, b, part, ss);
	if (!rc) {
		size_t merged = 0;
		for (uint32_t p = 0; p < P; p++)
			merged += ss->pc[p].n;
		mfs_info("engine",
		         "msg=\"sharded set\" ratings=%zu shards=%u pieces=%u rows_merged_per_epoch=%zu epoch_g=%g", n,
		         S, P, merged, ss->pc[P - 1].job.epoch_g);
	}
	free(part);
	free(start);
	free(at);
	free(u);
	free(it);
	free(r);
	if (rc) {
		set_free(x, ss);
		return rc;
	}
	*out = (mfs_resident_t *)ss;
	return 0;
}

static void sharded_resident_free(mfs_engine_t *e, mfs_resident_t *s)
{
	(void)quiesce(e); /* the driver's error, if any, reaches the caller from its next call */
	set_free(impl(e), (struct sharded_set *)s);
}

struct epoch_arg {
	mfs_engine_t *e;
	mfs_resident_t *set;
	uint64_t epoch;
	int rc;
	pthread_t tid;
	int started;
};

static void *epoch_main(void *arg)
{
	struct epoch_arg *a = arg;
	a->rc = mfs_engine_sgd_epoch(a->e, a->set, a->epoch);
	return NULL;
}

static int sharded_sgd_epoch(mfs_engine_t *e, mfs_resident_t *s, uint64_t epoch)
{
	struct sharded *x = impl(e);
	struct sharded_set *ss = (struct sharded_set *)s;
	/* what batches left pending first: the set's plan starts from merged replicas */
	int rc = quiesce(e);
	if (!rc)
		rc = merge_pending(e, 0);
	share_mu(x);
	double t0 = mfs_now_s();
	for (uint32_t p = 0; p < ss->pieces && !rc; p++) {
		struct epoch_arg a[MFS_SHARD_MAX];
		struct piece *pc = &ss->pc[p];
		for (uint32_t sh = 0; sh < x->S; sh++) {
			a[sh] = (struct epoch_arg){x->sh[sh].e, pc->set[sh], epoch * ss->pieces + p, 0, 0, 0};
			/* device engines at once, a thread each (the caller runs the last) */
			if (x->threads && sh + 1 < x->S && pthread_create(&a[sh].tid, NULL, epoch_main, &a[sh]) == 0)
				a[sh].started = 1;
			else
				epoch_main(&a[sh]);
		}
		for (uint32_t sh = 0; sh < x->S; sh++) {
			if (a[sh].started)
				pthread_join(a[sh].tid, NULL);
			if (a[sh].rc && !rc)
				rc = a[sh].rc;
		}
		const double t1 = mfs_now_s();
		x->run_s += t1 - t0;
		collect_applied(e, 0);
		if (!rc)
			rc = run_merge(e, &pc->job);
		t0 = mfs_now_s();
		x->merge_s += t0 - t1;
	}
	return rc;
}

static int sharded_loss_resident(mfs_engine_t *e, mfs_resident_t *s, mfs_loss_t *out)
{
	struct sharded *x = impl(e);
	struct sharded_set *ss = (struct sharded_set *)s;
	int rc0 = quiesce(e);
	if (rc0)
		return rc0;
	share_mu(x);
	double sse = 0, sae = 0;
	int first = 1;
	for (uint32_t sh = 0; sh < x->S; sh++)
		for (uint32_t p = 0; p < ss->pieces; p++) {
			mfs_loss_t l = {0};
			int rc = mfs_engine_loss_resident(x->sh[sh].e, ss->pc[p].set[sh], &l);
			if (rc)
				return rc;
			sse = first ? l.sse : sse + l.sse;
			sae = first ? l.sae : sae + l.sae;
			first = 0;
		}
	out->sse = sse;
	out->sae = sae;
	out->n = ss->ratings;
	out->rmse = ss->ratings ? sqrt(sse / (double)ss->ratings) : NAN;
	out->mae = ss->ratings ? sae / (double)ss->ratings : NAN;
	return 0;
}

/* ---- rows in and out ---------------------------------------------------------------------- */

/* Rows given to new ids: their fresh values F (n x k) and B (n), in the order of rows, to the
 * shards that hold them (items: every replica and, host shards, the base). */
static int apply_reset(mfs_engine_t *e, int ent, const uint32_t *rows, size_t n, const float *F, const float *B,
                       int in_flight)
{
	struct sharded *x = impl(e);
	const uint32_t S = x->S;
	const size_t k = (size_t)x->k;
	int rc = 0;
	if (ent == 1) { /* every replica and (host shards) the base take the fresh values */
		for (size_t j = 0; j < n; j++) {
			const uint32_t i = rows[j];
			if (i >= x->sh[0].m.n_items) /* the shards do not have it yet: grow brings it */
				continue;
			if (x->in_uni[i]) /* its old counts are another id's: nothing left to merge */
				memset(x->cnt + (size_t)i * S, 0, S * sizeof *x->cnt);
			for (uint32_t s = 0; s < S; s++) {
				memcpy(x->sh[s].m.Q + (size_t)i * k, F + j * k, k * sizeof(float));
				x->sh[s].m.bi[i] = B[j];
			}
			if (x->host) {
				memcpy(x->base.Q + (size_t)i * k, F + j * k, k * sizeof(float));
				x->base.bi[i] = B[j];
			}
		}
		for (uint32_t s = 0; s < S && !rc; s++)
			rc = mfs_engine_reset_rows(x->sh[s].e, 1, rows, n, in_flight);
		return rc;
	}
	uint32_t *loc = malloc((n ? n : 1) * sizeof *loc);
	if (!loc)
		return ENOMEM;
	for (uint32_t s = 0; s < S && !rc; s++) {
		struct shard *sh = &x->sh[s];
		size_t c = 0;
		for (size_t j = 0; j < n; j++) {
			if (mfs_shard_of_user(rows[j], S) != s)
				continue;
			const uint32_t l = mfs_shard_local_row(rows[j], S);
			if (l >= sh->m.n_users)
				continue;
			memcpy(sh->m.P + (size_t)l * k, F + j * k, k * sizeof(float));
			sh->m.bu[l] = B[j];
			loc[c++] = l;
		}
		rc = mfs_engine_reset_rows(sh->e, 0, loc, c, in_flight);
	}
	free(loc);
	return rc;
}

/* The caller's rows given to new ids (fresh values in its model): copied, then applied at once
 * or (the driver running) queued behind the batches given before, as grow is (an evicting
 * table reuses rows at nearly every batch). */
static int sharded_reset_rows(mfs_engine_t *e, int ent, const uint32_t *rows, size_t n, int in_flight)
{
	struct sharded *x = impl(e);
	const mfs_model_t *m = e->model;
	const size_t k = (size_t)x->k;
	struct slot *q = &x->q[0]; /* inline: the queue is unused, its first slot the scratch */
	int rc = x->drv_on ? slot_take(x, &q) : quiesce(e);
	if (rc)
		return rc;
	if (mfs_grow_from((void **)&q->u, &q->cap_u, n, sizeof *q->u, 1024) ||
	    mfs_grow_from((void **)&q->P, &q->cap_P, n * k, sizeof *q->P, 1024) ||
	    mfs_grow_from((void **)&q->bu, &q->cap_bu, n, sizeof *q->bu, 1024))
		return ENOMEM;
	const float *F = ent ? m->Q : m->P, *B = ent ? m->bi : m->bu;
	for (size_t j = 0; j < n; j++) {
		q->u[j] = rows[j];
		memcpy(q->P + j * k, F + (size_t)rows[j] * k, k * sizeof(float));
		q->bu[j] = B[rows[j]];
	}
	if (!x->drv_on)
		return apply_reset(e, ent, q->u, n, q->P, q->bu, in_flight);
	q->grow = 0, q->reset = 1, q->ent = ent, q->in_flight = in_flight, q->n = n;
	slot_give(x, 0);
	return 0;
}

static int sharded_sync(mfs_engine_t *e)
{
	struct sharded *x = impl(e);
	mfs_model_t *m = e->model;
	const size_t k = (size_t)x->k;
	int rc = quiesce(e);
	if (!rc)
		rc = merge_pending(e, 0);
	for (uint32_t s = 0; s < x->S && !rc; s++) {
		struct shard *sh = &x->sh[s];
		if ((rc = mfs_engine_sync(sh->e)))
			break;
		for (uint32_t l = 0; l < sh->m.n_users; l++) {
			const size_t g = (size_t)l * x->S + s;
			memcpy(m->P + g * k, sh->m.P + (size_t)l * k, k * sizeof(float));
			m->bu[g] = sh->m.bu[l];
		}
	}
	if (!rc) { /* the replicas agree: shard 0's is the table */
		memcpy(m->Q, x->sh[0].m.Q, (size_t)x->sh[0].m.n_items * k * sizeof(float));
		memcpy(m->bi, x->sh[0].m.bi, (size_t)x->sh[0].m.n_items * sizeof(float));
	}
	collect_applied(e, 0);
	return rc;
}

static int cap_reserve(struct shard *sh, size_t n, int k)
{
	return mfs_grow_from((void **)&sh->cap_rows, &sh->cap_rows_n, n, sizeof *sh->cap_rows, 1024) ||
	               mfs_grow_from((void **)&sh->cap_pos, &sh->cap_pos_n, n, sizeof *sh->cap_pos, 1024) ||
	               mfs_grow_from((void **)&sh->cap_vals, &sh->cap_vals_n, n * (1 + (size_t)k), sizeof *sh->cap_vals,
	                             1024)
	           ? ENOMEM
	           : 0;
}

static int sharded_capture(mfs_engine_t *e, const uint32_t *ur, size_t nu, float *du, const uint32_t *ir, size_t ni,
                           float *di)
{
	struct sharded *x = impl(e);
	const uint32_t S = x->S;
	int rc = quiesce(e);
	if (!rc)
		rc = merge_pending(e, 0); /* one item table */
	for (uint32_t s = 0; s < S && !rc; s++)
		x->sh[s].cap_n = 0;
	size_t want[MFS_SHARD_MAX] = {0};
	for (size_t j = 0; j < nu; j++)
		want[mfs_shard_of_user(ur[j], S)]++;
	for (uint32_t s = 0; s < S && !rc; s++)
		rc = cap_reserve(&x->sh[s], want[s], x->k);
	if (rc)
		return rc;
	for (size_t j = 0; j < nu; j++) {
		struct shard *sh = &x->sh[mfs_shard_of_user(ur[j], S)];
		sh->cap_rows[sh->cap_n] = mfs_shard_local_row(ur[j], S);
		sh->cap_pos[sh->cap_n++] = j;
	}
	for (uint32_t s = 0; s < S && !rc; s++) {
		struct shard *sh = &x->sh[s];
		rc = mfs_engine_capture(sh->e, sh->cap_rows, sh->cap_n, sh->cap_vals, s ? NULL : ir, s ? 0 : ni,
		                        s ? NULL : di);
	}
	if (!rc) {
		x->cap_pending = 1;
		x->cap_du = du;
	}
	return rc;
}

static int sharded_capture_wait(mfs_engine_t *e)
{
	struct sharded *x = impl(e);
	if (!x->cap_pending)
		return 0;
	int rc = 0;
	const size_t row = 1 + (size_t)x->k;
	for (uint32_t s = 0; s < x->S; s++) {
		struct shard *sh = &x->sh[s];
		int r = mfs_engine_capture_wait(sh->e);
		if (r && !rc)
			rc = r;
		if (r)
			continue;
		for (size_t j = 0; j < sh->cap_n; j++)
			memcpy(x->cap_du + sh->cap_pos[j] * row, sh->cap_vals + j * row, row * sizeof(float));
	}
	x->cap_pending = 0;
	return rc;
}

static int sharded_drain(mfs_engine_t *e)
{
	struct sharded *x = impl(e);
	int rc = quiesce(e);
	for (uint32_t s = 0; s < x->S && !rc; s++)
		rc = mfs_engine_drain(x->sh[s].e);
	if (!rc)
		progress_pop(x);
	return rc;
}

/* Batches given (tickets, taken at sgd) and applied on every shard. With the driver busy, what
 * it published after its last batch; idle, the shards asked here (they are the caller's then). */
static void sharded_progress(mfs_engine_t *e, uint64_t *ticket, uint64_t *applied)
{
	struct sharded *x = impl(e);
	if (!x->drv_on) {
		progress_pop(x);
		*ticket = x->ticket;
		*applied = x->done;
		return;
	}
	pthread_mutex_lock(&x->lk);
	if (!x->q_n && !x->drv_busy) {
		progress_pop(x);
		x->done_pub = x->done;
	}
	*ticket = x->ticket;
	*applied = x->done_pub;
	pthread_mutex_unlock(&x->lk);
}

/* The device that is fullest (used / total). */
static int sharded_memory(mfs_engine_t *e, uint64_t *used, uint64_t *total)
{
	struct sharded *x = impl(e);
	int rc = MFS_ENODEV; /* no wait for the driver: a device's memory query is thread-safe */
	double worst = -1;
	for (uint32_t s = 0; s < x->S; s++) {
		uint64_t u = 0, t = 0;
		if (mfs_engine_memory(x->sh[s].e, &u, &t) || !t)
			continue;
		if ((double)u / (double)t > worst) {
			worst = (double)u / (double)t;
			*used = u, *total = t;
			rc = 0;
		}
	}
	return rc;
}

static int sharded_set_hparams(mfs_engine_t *e, const mfs_hparams_t *hp)
{
	struct sharded *x = impl(e);
	int rc0 = quiesce(e);
	if (rc0)
		return rc0;
	for (uint32_t s = 0; s < x->S; s++) {
		int rc = mfs_engine_set_hparams(x->sh[s].e, hp);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

static void sharded_close(mfs_engine_t *e)
{
	struct sharded *x = impl(e);
	if (!x)
		return;
	if (x->drv_on) { /* what is queued is applied first */
		pthread_mutex_lock(&x->lk);
		x->drv_stop = 1;
		pthread_cond_signal(&x->work);
		pthread_mutex_unlock(&x->lk);
		pthread_join(x->drv, NULL);
		x->drv_on = 0;
	}
	if (x->lk_init) {
		pthread_mutex_destroy(&x->lk);
		pthread_cond_destroy(&x->work);
		pthread_cond_destroy(&x->room);
	}
	for (size_t j = 0; j < DRV_SLOTS; j++) {
		free(x->q[j].u);
		free(x->q[j].i);
		free(x->q[j].r);
		free(x->q[j].P);
		free(x->q[j].bu);
		free(x->q[j].Q);
		free(x->q[j].bi);
	}
	free(x->base.Q);
	free(x->base.bi);
	if (x->merges)
		mfs_info("engine", "msg=\"sharded engine\" shards=%u merges=%llu rows_merged=%llu epoch_run_s=%.3f "
		         "epoch_merge_s=%.3f",
		         x->S, (unsigned long long)x->merges, (unsigned long long)x->rows_merged, x->run_s, x->merge_s);
	for (uint32_t s = 0; s < x->S; s++) {
		struct shard *sh = &x->sh[s];
		mfs_engine_close(sh->e);
		free(sh->m.P);
		free(sh->m.Q);
		free(sh->m.bu);
		free(sh->m.bi);
		part_free(&sh->b);
		part_free(&sh->l);
		free(sh->cap_rows);
		free(sh->cap_pos);
		free(sh->cap_vals);
	}
	free(x->cnt);
	free(x->bcnt);
	free(x->in_uni);
	free(x->uni);
	free(x->m_rows);
	free(x->m_cnt);
	free(x->acc);
	free(x->tq);
	free(x->fifo);
	free(x);
	e->impl = NULL;
}

static int sharded_open(mfs_engine_t *e, char *errstr, size_t es)
{
	const mfs_engine_conf_t *c = &e->conf;
	mfs_model_t *m = e->model;
	uint32_t S = c->shards;
	if (S == MFS_SHARDS_ALL) {
#ifdef MFS_HAVE_CUDA
		char why[256];
		S = (uint32_t)mfs_cuda_probe(0, why, sizeof why);
		if (S < 1)
			return mfs_errf(errstr, es, MFS_ENODEV, "engine.devices=all: no CUDA device answers (%s)", why);
#else
		return mfs_errf(errstr, es, MFS_ENODEV, "engine.devices=all: this build has no CUDA engine");
#endif
	}
	if (S < 2 || S > MFS_SHARD_MAX)
		return mfs_errf(errstr, es, MFS_EINVAL, "engine: %u shards (want 2..%d)", S, MFS_SHARD_MAX);
	if (c->merge_batches < 1 || c->merge_pieces < 1 || c->merge_pieces > 255 || !(c->merge_epoch_g >= 0) ||
	    c->merge_epoch_g > 1)
		return mfs_errf(errstr, es, MFS_EINVAL,
		                "engine: engine.merge_batches >= 1, engine.merge_pieces in 1..255 and engine.merge_epoch_g "
		                "in 0..1 wanted");
	struct sharded *x = calloc(1, sizeof *x);
	if (!x)
		return mfs_errf(errstr, es, ENOMEM, "engine: out of memory");
	e->impl = x;
	x->S = S;
	x->k = m->k;
	x->acc = malloc(((size_t)m->k + 1) * sizeof *x->acc);
	x->tq = malloc((size_t)m->k * sizeof *x->tq);
	if (!x->acc || !x->tq) {
		sharded_close(e);
		return mfs_errf(errstr, es, ENOMEM, "engine: out of memory");
	}
	for (uint32_t s = 0; s < S; s++) {
		struct shard *sh = &x->sh[s];
		sh->m.k = m->k;
		sh->m.init_scale = m->init_scale;
		sh->m.seed = m->seed;
		sh->m.engine_init_from[0] = sh->m.engine_init_from[1] = MFS_ROW_NONE;
		mfs_engine_conf_t sc = *c;
		sc.shards = 1;
		sc.items_base = 1;
		sc.device = c->shards == MFS_SHARDS_ALL ? (int)s : c->devices[s];
		int rc = mfs_engine_open(&sc, &sh->m, &sh->e, errstr, es);
		if (rc) {
			sharded_close(e);
			return rc;
		}
	}
	x->host = x->sh[0].e->iface->merge == NULL;
	x->threads = !x->host;
	if (!x->host && S > MFS_SHARD_DEVICE_MAX) {
		sharded_close(e);
		return mfs_errf(errstr, es, MFS_EINVAL, "engine.devices: %u devices; a merge on the devices takes at most %d",
		                S, MFS_SHARD_DEVICE_MAX);
	}
	int rc = take_rows(e);
	if (rc) {
		sharded_close(e);
		return mfs_errf(errstr, es, rc, "engine: cannot place the model on %u shards", S);
	}
	int lk = pthread_mutex_init(&x->lk, NULL) == 0;
	int cw = lk && pthread_cond_init(&x->work, NULL) == 0;
	int cr = cw && pthread_cond_init(&x->room, NULL) == 0;
	if (!cr) {
		if (cw)
			pthread_cond_destroy(&x->work);
		if (lk)
			pthread_mutex_destroy(&x->lk);
		sharded_close(e);
		return mfs_errf(errstr, es, ENOMEM, "engine: cannot make the driver's lock");
	}
	x->lk_init = 1;
	if (!c->batches_inline) {
		if (pthread_create(&x->drv, NULL, drv_main, e)) {
			sharded_close(e);
			return mfs_errf(errstr, es, ENOMEM, "engine: cannot start the sharded engine's driver thread");
		}
		x->drv_on = 1;
	}
	mfs_info("engine", "msg=\"sharded engine\" shards=%u engine=%s merge=%s merge_batches=%u merge_hot=%u "
	         "merge_pieces=%u batches=%s",
	         S, mfs_engine_name(x->sh[0].e), x->host ? "host" : "device", c->merge_batches, c->merge_hot,
	         c->merge_pieces, x->drv_on ? "driver" : "inline");
	return 0;
}

const struct mfs_engine_i mfs_engine_sharded_i = {
	.name = "sharded",
	.open = sharded_open,
	.close = sharded_close,
	.set_hparams = sharded_set_hparams,
	.grow = take_rows,
	.sgd = sharded_sgd,
	.loss = sharded_loss,
	.resident_load = sharded_resident_load,
	.resident_free = sharded_resident_free,
	.sgd_epoch = sharded_sgd_epoch,
	.loss_resident = sharded_loss_resident,
	.sync = sharded_sync,
	.memory = sharded_memory,
	.drain = sharded_drain,
	.progress = sharded_progress,
	.capture = sharded_capture,
	.capture_wait = sharded_capture_wait,
	.reset_rows = sharded_reset_rows,
};
