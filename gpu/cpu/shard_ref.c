/* shard_ref.c - the CPU reference of the sharded algorithm (shard_ref.h): S shards in one
 * process, the reference SGD update (mfs_sgd_batch_ref, mfs_sgd_ratings_ref) on each shard's
 * ratings, and the two item-exchange schemes of gpu/shard.h.
 *
 * DESIGN
 *
 * Rounds. Work goes in rounds: a batch (allreduce) or a sub-epoch (rotation). In a round
 * every shard applies its ratings, in input order, to rows nobody else writes in that round:
 * its own users (the partition), and its item replica (allreduce) or the item block it holds
 * (rotation). So running the shards one after another or on threads (conf.threads, a thread
 * per group of shards, created per round and joined) gives the same bits. Between rounds,
 * on the calling thread: the exchange (allreduce) or the hand-over of the blocks (rotation).
 *
 * Allreduce exchange. Each shard marks the item rows its ratings name (touched) as they are
 * routed, and the union of those rows is kept in arrival order. For each row of the union:
 *     SUM:  q = q_c + sum over touched shards s > c of (q_s - q0)   c: the lowest touched shard
 *     MEAN: q = (sum over touched shards of q_s) / their number
 *     BLEND: q = q0 + (1 - prod a_s) / N sum_s n_s (q_s - q0) / (1 - a_s), a_s = (1 - g)^n_s,
 *            n_s the ratings shard s routed to the row since the last exchange (sh_touched
 *            counts them), N their sum (gpu/shard.h says why)
 * element by element in shard order (bias the same), written to the model (q0's home) and to
 * every replica. SUM is q0 + the sum of the deltas, the all-reduce of item deltas, arranged so
 * that a row one shard alone changed takes its value exactly (q0 + (q_c - q0) may round);
 * MEAN averages the replicas that changed; BLEND goes from the sum to a count-weighted mean
 * as the shards' moves grow (gpu/shard.h). Any way, with one shard, or one shard per
 * batch, the serial result comes out bit for bit. A device
 * implementation that wants that parity all-gathers touched rows and applies the same formula
 * in the same order; a dense NCCL all-reduce of deltas sums in its own order (parity within a
 * tolerance). Both are counted: bytes_sparse and bytes_dense.
 *
 * Rotation. At load each shard's ratings are bucketed by item block, stably (input order in a
 * bucket). owner[b] says which shard holds item block b; it starts as at sub-epoch 0. At each
 * sub-epoch the blocks move to the shards that work them (each hands its block to s - 1),
 * and the bytes of every block that changes hands are counted. Every rating's block is checked
 * against owner[] before the shard applies it (owner_violations).
 *
 * Hosts. The allreduce's replicas and routing, no barrier. Each shard keeps, per item row,
 * (bias then k factors)
 *     ref     the value at its last publish, moved by every merge since (float, like the
 *             replica): q - ref is its own unpublished move
 *     own     its cumulative contribution, the sum of its published moves (double), and own_n
 *             the ratings behind them
 *     got[g]  the cumulative contribution of shard g it has merged, and got_n[g]
 * Every exchange_every batches each shard publishes its touched rows: own += q - ref,
 * own_n += its ratings of the row, ref = q; the message (row, own_n, own, the value q, and
 * got_n[g] for every other shard g: what it had merged of theirs) is delivered to the others
 * lag batches later. A receiver takes, per row and sender in
 * publish order, the difference d = own_g - got[g] (n ratings) and
 *     SUM:   q += d
 *     BLEND: n virtual ratings towards the sender's target. With a = (1 - g)^n (g as in
 *            gpu/shard.h), the sender's n steps moved it d and left a of its distance, so its
 *            target is t = v + d a / (1 - a) (v the value it sent). The receiver's own n_r
 *            ratings of the row the sender had not merged (its own_n + unpublished, less the
 *            got_n the message carries for it) pulled it to its current q, a_r = (1 - g)^n_r;
 *            interleaved, both sets of steps end near the
 *            count-weighted mean m = (n_r q + n t) / (n_r + n):
 *                q = m + (q - m) a_r a
 *            A cold row (n g, n_r g small) gets q + d (the sum: the moves add); a hot row the
 *            count-weighted mean of the receiver's value and the sender's target; a row the
 *            receiver has not rated since (n_r = 0), q + (1 - a)(t - q).
 * and ref moves by as much as q (a merge is not the receiver's own move). Cumulative values, not
 * deltas, so that the latest message per (row, sender) is all a late receiver needs (a
 * compacted topic). Why not gpu/shard.h's BLEND from a common start: between hosts there is
 * none (the receiver moved on during the lag), and estimating one from the receiver's own
 * recent moves weighs those moves again at every delivery: measured, that diverged at Zipf 1.2
 * with 4 shards and a lag of 10 batches (docs/BENCHMARKS.md, "Between hosts").
 *
 * Ownership: the reference keeps m (the caller's) and writes its arrays; it owns the replicas,
 * the routing scratch and the loaded ratings.
 */
#include "gpu/cpu/shard_ref.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gpu/cpu/cpu_ref.h"

/* BLEND: the largest fraction of its distance to the target one step may cover (log1p(-1)
 * would be -inf). */
#define MAX_STEP MFS_SHARD_BLEND_MAX_STEP

/* hosts: one shard's publish, delivered to the others at batch `at` */
struct hmsg {
	uint64_t at;
	uint32_t from;
	size_t n;
	uint32_t *rows;
	uint64_t *own_n;
	double *own; /* n x (k + 1) */
	float *val;  /* n x (k + 1): the sender's value of the row at the publish */
	uint64_t *seen; /* n x S: of each shard's ratings of the row, how many the sender had merged */
};

struct shard {
	/* allreduce: this round's ratings (routed from the batch, in order) */
	uint32_t *sh_u, *sh_i;
	float *sh_r;
	size_t sh_n;
	float *sh_Q, *sh_bi;    /* allreduce: the replica of the item table */
	uint32_t *sh_touched;   /* allreduce: per item row, ratings routed here since the last exchange */
	uint32_t *sh_bt;        /* allreduce: per item row, ratings routed here in this batch (hot_ratings) */
	size_t sh_ntouched;
	/* rotation: this shard's ratings bucketed by item block */
	mfs_rating_t *sh_rt;
	size_t sh_boff[MFS_SHARD_MAX + 1];
	uint32_t sh_block;      /* rotation: the block worked this round */
	uint64_t sh_applied;    /* this round */
	uint64_t sh_violations; /* this round */
	/* hosts (DESIGN): (k + 1) values a row, bias first */
	uint32_t *sh_tlist;     /* the rows touched since the last publish, first-touch order */
	float *sh_ref;
	double *sh_own;
	uint64_t *sh_own_n;
	double *sh_got[MFS_SHARD_MAX];
	uint64_t *sh_got_n[MFS_SHARD_MAX];
};

struct mfs_shard_ref {
	mfs_shard_conf_t sr_c;
	mfs_model_t *sr_m;
	uint32_t sr_nu, sr_ni;  /* row counts at init */
	int sr_k;
	mfs_hparams_t sr_hp;
	struct shard *sr_sh;
	uint32_t *sr_union;     /* allreduce: item rows touched by any shard, first-touch order */
	size_t sr_nunion;
	uint8_t *sr_inunion;
	uint32_t sr_since;      /* batches since the last exchange */
	/* an epoch's merges (mfs_shard_ref_epoch): the one that closes an epoch in which no other
	 * merge ran takes BLEND's epoch step (mfs_shard_blend_lr), as the engine's one-piece epochs */
	int sr_in_epoch;        /* mfs_shard_ref_epoch is running */
	int sr_epoch_last;      /* ... and its last batch has been applied */
	uint64_t sr_epoch_merges; /* merges since the epoch began */
	float *sr_acc;          /* k + 1 floats */
	double *sr_tacc;        /* k doubles */
	mfs_batch_t sr_set;     /* the loaded ratings (allreduce) */
	uint32_t *sr_set_u, *sr_set_i;
	float *sr_set_r;
	int sr_loaded;
	uint32_t sr_owner[MFS_SHARD_MAX]; /* rotation: block -> shard holding it */
	uint64_t sr_sub_epochs;
	mfs_shard_stats_t sr_st;
	/* hosts */
	struct hmsg *sr_q;      /* published, not yet delivered, in publish order */
	size_t sr_nq, sr_capq;
	uint64_t sr_round;      /* batches so far */
};

/* ---- rounds on threads ---------------------------------------------------------------- */

typedef void (*shard_fn)(mfs_shard_ref_t *r, uint32_t s);

struct runner {
	mfs_shard_ref_t *r;
	shard_fn fn;
	uint32_t first, step;
};

static void *runner_main(void *arg)
{
	struct runner *x = arg;
	for (uint32_t s = x->first; s < x->r->sr_c.shards; s += x->step)
		x->fn(x->r, s);
	return NULL;
}

/* fn(r, s) for every shard, on min(threads, S) threads (the caller is one of them). */
static int run_round(mfs_shard_ref_t *r, shard_fn fn)
{
	const uint32_t S = r->sr_c.shards;
	uint32_t T = r->sr_c.threads > 1 ? (uint32_t)r->sr_c.threads : 1;
	if (T > S)
		T = S;
	struct runner w[MFS_SHARD_MAX];
	pthread_t tid[MFS_SHARD_MAX];
	uint32_t started = 0;
	int rc = 0;
	for (uint32_t t = 0; t < T; t++)
		w[t] = (struct runner){r, fn, t, T};
	for (uint32_t t = 1; t < T; t++) {
		if ((rc = pthread_create(&tid[t], NULL, runner_main, &w[t])))
			break;
		started = t;
	}
	if (rc) { /* run what did not start on the caller: same results, fewer threads */
		for (uint32_t t = started + 1; t < T; t++)
			runner_main(&w[t]);
		rc = 0;
	}
	runner_main(&w[0]);
	for (uint32_t t = 1; t <= started; t++)
		pthread_join(tid[t], NULL);
	return rc;
}

/* ---- checks ----------------------------------------------------------------------------- */

/* engine.c's rule: every row below the row counts, every rating finite; the first bad rating
 * decides the code. loss: MFS_ROW_NONE allowed. */
static int check_batch(const mfs_shard_ref_t *r, const mfs_batch_t *b, int loss)
{
	if (!b || (b->n && (!b->u || !b->i || !b->r)))
		return MFS_EINVAL;
	for (size_t j = 0; j < b->n; j++) {
		if ((b->u[j] >= r->sr_nu && !(loss && b->u[j] == MFS_ROW_NONE)) ||
		    (b->i[j] >= r->sr_ni && !(loss && b->i[j] == MFS_ROW_NONE)))
			return MFS_EINVAL;
		if (!isfinite(b->r[j]))
			return MFS_ENAN;
	}
	return 0;
}

/* What a shard's SGD reads: the model's user rows, its own item table. */
static mfs_sgd_args_t args_of(const mfs_shard_ref_t *r, uint32_t s)
{
	const mfs_model_t *m = r->sr_m;
	mfs_sgd_args_t a = {r->sr_k, (float)m->mu, m->P, m->Q, m->bu, m->bi, r->sr_hp};
	if (r->sr_c.scheme != MFS_SHARD_ROTATE) {
		a.Q = r->sr_sh[s].sh_Q;
		a.bi = r->sr_sh[s].sh_bi;
	}
	return a;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

void mfs_shard_ref_free(mfs_shard_ref_t *r)
{
	if (!r)
		return;
	for (uint32_t s = 0; r->sr_sh && s < r->sr_c.shards; s++) {
		struct shard *sh = &r->sr_sh[s];
		free(sh->sh_u);
		free(sh->sh_i);
		free(sh->sh_r);
		free(sh->sh_Q);
		free(sh->sh_bi);
		free(sh->sh_touched);
		free(sh->sh_bt);
		free(sh->sh_rt);
		free(sh->sh_tlist);
		free(sh->sh_ref);
		free(sh->sh_own);
		free(sh->sh_own_n);
		for (uint32_t g = 0; g < r->sr_c.shards; g++) {
			free(sh->sh_got[g]);
			free(sh->sh_got_n[g]);
		}
	}
	for (size_t x = 0; x < r->sr_nq; x++) {
		free(r->sr_q[x].rows);
		free(r->sr_q[x].own_n);
		free(r->sr_q[x].own);
		free(r->sr_q[x].val);
		free(r->sr_q[x].seen);
	}
	free(r->sr_q);
	free(r->sr_sh);
	free(r->sr_union);
	free(r->sr_inunion);
	free(r->sr_acc);
	free(r->sr_tacc);
	free(r->sr_set_u);
	free(r->sr_set_i);
	free(r->sr_set_r);
	free(r);
}

int mfs_shard_ref_init(const mfs_shard_conf_t *conf, mfs_model_t *m, mfs_shard_ref_t **out, char *errstr,
                       size_t errstr_size)
{
	if (!conf || !m || !out)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "shard reference: no configuration or model");
	if (conf->shards < 1 || conf->shards > MFS_SHARD_MAX)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "shard reference: %u shards (want 1..%d)",
		                conf->shards, MFS_SHARD_MAX);
	if (conf->scheme != MFS_SHARD_ALLREDUCE && conf->scheme != MFS_SHARD_ROTATE && conf->scheme != MFS_SHARD_HOSTS)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "shard reference: unknown scheme %d", conf->scheme);
	if (conf->scheme != MFS_SHARD_ROTATE && (conf->batch < 1 || conf->exchange_every < 1))
		return mfs_errf(errstr, errstr_size, MFS_EINVAL,
		                "shard reference: allreduce and hosts want batch >= 1 and exchange_every >= 1");
	if (conf->scheme == MFS_SHARD_HOSTS && conf->combine == MFS_SHARD_MEAN)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "shard reference: hosts merge by SUM or BLEND");
	if (conf->combine != MFS_SHARD_SUM && conf->combine != MFS_SHARD_MEAN &&
	    conf->combine != MFS_SHARD_BLEND)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "shard reference: unknown combine %d", conf->combine);
	mfs_shard_ref_t *r = calloc(1, sizeof *r);
	if (!r)
		return mfs_errf(errstr, errstr_size, ENOMEM, "shard reference: out of memory");
	r->sr_c = *conf;
	r->sr_m = m;
	r->sr_nu = m->n_users;
	r->sr_ni = m->n_items;
	r->sr_k = m->k;
	r->sr_hp = (mfs_hparams_t)MFS_HPARAMS_DEFAULT;
	const uint32_t S = conf->shards;
	const size_t ni = r->sr_ni ? r->sr_ni : 1, ks = (size_t)r->sr_k;
	r->sr_sh = calloc(S, sizeof *r->sr_sh);
	r->sr_acc = malloc((ks + 1) * sizeof *r->sr_acc);
	r->sr_tacc = malloc((ks + 1) * sizeof *r->sr_tacc);
	if (!r->sr_sh || !r->sr_acc || !r->sr_tacc)
		goto nomem;
	if (conf->scheme != MFS_SHARD_ROTATE) {
		r->sr_union = malloc(ni * sizeof *r->sr_union);
		r->sr_inunion = calloc(ni, 1);
		if (!r->sr_union || !r->sr_inunion)
			goto nomem;
		for (uint32_t s = 0; s < S; s++) {
			struct shard *sh = &r->sr_sh[s];
			sh->sh_Q = malloc(ni * ks * sizeof *sh->sh_Q);
			sh->sh_bi = malloc(ni * sizeof *sh->sh_bi);
			sh->sh_touched = calloc(ni, sizeof *sh->sh_touched);
			sh->sh_bt = calloc(ni, sizeof *sh->sh_bt);
			if (!sh->sh_Q || !sh->sh_bi || !sh->sh_touched || !sh->sh_bt)
				goto nomem;
			/* every replica starts as the model's item table */
			memcpy(sh->sh_Q, m->Q, (size_t)r->sr_ni * ks * sizeof *sh->sh_Q);
			memcpy(sh->sh_bi, m->bi, (size_t)r->sr_ni * sizeof *sh->sh_bi);
		}
	}
	if (conf->scheme == MFS_SHARD_HOSTS) {
		const size_t kv = ks + 1;
		for (uint32_t s = 0; s < S; s++) {
			struct shard *sh = &r->sr_sh[s];
			sh->sh_tlist = malloc(ni * sizeof *sh->sh_tlist);
			sh->sh_ref = malloc(ni * kv * sizeof *sh->sh_ref);
			sh->sh_own = calloc(ni * kv, sizeof *sh->sh_own);
			sh->sh_own_n = calloc(ni, sizeof *sh->sh_own_n);
			if (!sh->sh_tlist || !sh->sh_ref || !sh->sh_own || !sh->sh_own_n)
				goto nomem;
			for (uint32_t i = 0; i < r->sr_ni; i++) {
				sh->sh_ref[i * kv] = m->bi[i];
				memcpy(sh->sh_ref + i * kv + 1, m->Q + i * ks, ks * sizeof *sh->sh_ref);
			}
			for (uint32_t g = 0; g < S; g++) {
				if (g == s)
					continue;
				sh->sh_got[g] = calloc(ni * kv, sizeof *sh->sh_got[g]);
				sh->sh_got_n[g] = calloc(ni, sizeof *sh->sh_got_n[g]);
				if (!sh->sh_got[g] || !sh->sh_got_n[g])
					goto nomem;
			}
		}
	}
	for (uint32_t b = 0; b < S; b++) /* blocks start where sub-epoch 0 wants them */
		r->sr_owner[mfs_shard_rotation_block(b, 0, S)] = b;
	*out = r;
	return 0;
nomem:
	mfs_shard_ref_free(r);
	return mfs_errf(errstr, errstr_size, ENOMEM, "shard reference: out of memory (%u shards, %u items, k=%d)",
	                S, m->n_items, m->k);
}

int mfs_shard_ref_set_hparams(mfs_shard_ref_t *r, const mfs_hparams_t *hp)
{
	if (!r || !hp || !(isfinite(hp->lr) && hp->lr > 0) || !(isfinite(hp->lambda_p) && hp->lambda_p >= 0) ||
	    !(isfinite(hp->lambda_q) && hp->lambda_q >= 0) || !(isfinite(hp->lambda_bu) && hp->lambda_bu >= 0) ||
	    !(isfinite(hp->lambda_bi) && hp->lambda_bi >= 0) || isnan(hp->clip_min) || isnan(hp->clip_max) ||
	    hp->clip_min > hp->clip_max)
		return MFS_EINVAL;
	r->sr_hp = *hp;
	return 0;
}

/* ---- allreduce ---------------------------------------------------------------------------- */

/* Route b's ratings to their users' shards (input order kept) and mark the items touched. */
static int route(mfs_shard_ref_t *r, const mfs_batch_t *b)
{
	const uint32_t S = r->sr_c.shards;
	for (uint32_t s = 0; s < S; s++) {
		struct shard *sh = &r->sr_sh[s];
		sh->sh_n = 0;
		/* room for the whole batch: shards are uneven under skew, and the scratch is reused */
		uint32_t *u = realloc(sh->sh_u, (b->n ? b->n : 1) * sizeof *u);
		if (u)
			sh->sh_u = u;
		uint32_t *i = realloc(sh->sh_i, (b->n ? b->n : 1) * sizeof *i);
		if (i)
			sh->sh_i = i;
		float *x = realloc(sh->sh_r, (b->n ? b->n : 1) * sizeof *x);
		if (x)
			sh->sh_r = x;
		if (!u || !i || !x)
			return ENOMEM;
	}
	for (size_t j = 0; j < b->n; j++) {
		const uint32_t u = b->u[j], i = b->i[j];
		struct shard *sh = &r->sr_sh[mfs_shard_of_user(u, S)];
		sh->sh_u[sh->sh_n] = u;
		sh->sh_i[sh->sh_n] = i;
		sh->sh_r[sh->sh_n++] = b->r[j];
		sh->sh_bt[i]++;
		if (sh->sh_touched[i]++ == 0) {
			if (sh->sh_tlist)
				sh->sh_tlist[sh->sh_ntouched] = i;
			sh->sh_ntouched++;
		}
		if (r->sr_c.scheme == MFS_SHARD_ALLREDUCE && !r->sr_inunion[i]) {
			r->sr_inunion[i] = 1;
			r->sr_union[r->sr_nunion++] = i;
		}
	}
	return 0;
}

static void shard_batch(mfs_shard_ref_t *r, uint32_t s)
{
	struct shard *sh = &r->sr_sh[s];
	const mfs_sgd_args_t a = args_of(r, s);
	sh->sh_applied = mfs_sgd_batch_ref(&a, sh->sh_u, sh->sh_i, sh->sh_r, sh->sh_n);
}

/* BLEND's sums of |p|^2 and (p.p')^2 (mfs_norm2_pairs_ref) over the user rows of this round's
 * ratings (the last batch's, an estimate for the period), as they are now: each shard's sums,
 * added in shard order (as the sharded engine adds its devices'). */
static void round_p2(const mfs_shard_ref_t *r, double *p2, double *pp)
{
	double sum = 0, pairs = 0;
	for (uint32_t s = 0; s < r->sr_c.shards; s++) {
		double part, pa;
		mfs_norm2_pairs_ref(r->sr_m->P, r->sr_k, r->sr_sh[s].sh_u, r->sr_sh[s].sh_n, &part, &pa);
		sum = s ? sum + part : part;
		pairs = s ? pairs + pa : pa;
	}
	*p2 = sum;
	*pp = pairs;
}

/* ---- hosts ---------------------------------------------------------------------------------- */

/* Shard s publishes its touched rows (DESIGN): own += q - ref, ref = q; one message. */
static int hosts_publish(mfs_shard_ref_t *r, uint32_t s)
{
	struct shard *sh = &r->sr_sh[s];
	const size_t ks = (size_t)r->sr_k, kv = ks + 1, n = sh->sh_ntouched;
	if (!n)
		return 0;
	if (r->sr_nq == r->sr_capq) {
		const size_t cap = r->sr_capq ? 2 * r->sr_capq : 16;
		struct hmsg *q = realloc(r->sr_q, cap * sizeof *q);
		if (!q)
			return ENOMEM;
		r->sr_q = q;
		r->sr_capq = cap;
	}
	struct hmsg *msg = &r->sr_q[r->sr_nq];
	const uint32_t S = r->sr_c.shards;
	*msg = (struct hmsg){r->sr_round + r->sr_c.lag, s, n, malloc(n * sizeof(uint32_t)),
	                     malloc(n * sizeof(uint64_t)), malloc(n * kv * sizeof(double)),
	                     malloc(n * kv * sizeof(float)), calloc(n * S, sizeof(uint64_t))};
	if (!msg->rows || !msg->own_n || !msg->own || !msg->val || !msg->seen) {
		free(msg->rows);
		free(msg->own_n);
		free(msg->own);
		free(msg->val);
		free(msg->seen);
		return ENOMEM;
	}
	for (size_t x = 0; x < n; x++) {
		const uint32_t i = sh->sh_tlist[x];
		float *ref = sh->sh_ref + i * kv;
		double *own = sh->sh_own + i * kv;
		const float *q = sh->sh_Q + i * ks;
		own[0] += (double)sh->sh_bi[i] - (double)ref[0];
		ref[0] = sh->sh_bi[i];
		for (size_t f = 0; f < ks; f++) {
			own[1 + f] += (double)q[f] - (double)ref[1 + f];
			ref[1 + f] = q[f];
		}
		sh->sh_own_n[i] += sh->sh_touched[i];
		sh->sh_touched[i] = 0;
		msg->rows[x] = i;
		msg->own_n[x] = sh->sh_own_n[i];
		memcpy(msg->own + x * kv, own, kv * sizeof *own);
		memcpy(msg->val + x * kv, ref, kv * sizeof *ref);
		for (uint32_t g = 0; g < S; g++)
			if (g != s)
				msg->seen[x * S + g] = sh->sh_got_n[g][i];
	}
	sh->sh_ntouched = 0;
	r->sr_nq++;
	r->sr_st.rows_exchanged += n;
	/* per row: id, count, the contribution (doubles) and the value (floats), to each other shard */
	r->sr_st.bytes_sparse += (uint64_t)n * (S - 1) *
	                         (kv * (sizeof(double) + sizeof(float)) + (S + 1) * sizeof(uint64_t));
	return 0;
}

/* BLEND's |p|^2 for shard s: the mean over its last batch's users. The hosts' lagged merge takes
 * g = lr (|p|^2 / k + lambda_q), not the in-host merge's lr (rho + lambda_q): rho measured worse
 * here (docs/BENCHMARKS.md, "Between hosts"). */
static double shard_p2(const mfs_shard_ref_t *r, uint32_t s)
{
	const size_t ks = (size_t)r->sr_k;
	const struct shard *sh = &r->sr_sh[s];
	double sum = 0;
	for (size_t j = 0; j < sh->sh_n; j++) {
		const float *p = r->sr_m->P + sh->sh_u[j] * ks;
		for (size_t f = 0; f < ks; f++)
			sum += (double)p[f] * (double)p[f];
	}
	return sh->sh_n ? sum / (double)sh->sh_n : 0;
}

/* Receiver h merges the messages q[0 .. nmsg) of the other shards (DESIGN), in order. */
static void hosts_merge(mfs_shard_ref_t *r, uint32_t h, const struct hmsg *q, size_t nmsg)
{
	struct shard *sh = &r->sr_sh[h];
	const size_t ks = (size_t)r->sr_k, kv = ks + 1;
	const int blend = r->sr_c.combine == MFS_SHARD_BLEND;
	const double p2 = blend ? shard_p2(r, h) : 0;
	const double lb = mfs_shard_blend_log((double)r->sr_hp.lr * (1.0 + (double)r->sr_hp.lambda_bi));
	const double lq = mfs_shard_blend_log((double)r->sr_hp.lr * (p2 / (double)ks + (double)r->sr_hp.lambda_q));
	for (size_t m = 0; m < nmsg; m++) {
		const struct hmsg *msg = &q[m];
		if (msg->from == h)
			continue;
		double *got = sh->sh_got[msg->from];
		uint64_t *got_n = sh->sh_got_n[msg->from];
		for (size_t x = 0; x < msg->n; x++) {
			const uint32_t i = msg->rows[x];
			const double *own = msg->own + x * kv;
			const float *val = msg->val + x * kv;
			double *g = got + i * kv;
			const double n = (double)(msg->own_n[x] - got_n[i]);
			got_n[i] = msg->own_n[x];
			if (n == 0)
				continue;
			const uint64_t seen = msg->seen[x * r->sr_c.shards + h], mine = sh->sh_own_n[i] + sh->sh_touched[i];
			const double nr = mine > seen ? (double)(mine - seen) : 0;
			float *qv = sh->sh_Q + i * ks, *ref = sh->sh_ref + i * kv;
			for (size_t f = 0; f < kv; f++) {
				float *v = f ? &qv[f - 1] : &sh->sh_bi[i];
				const double d = own[f] - g[f], cur = *v;
				g[f] = own[f];
				const double next = blend ? mfs_shard_hosts_merge(cur, d, (double)val[f], n, nr, f ? lq : lb) : cur + d;
				*v = (float)next;
				ref[f] = (float)((double)ref[f] + ((double)*v - cur));
			}
		}
	}
}

/* Deliver the messages due by now (flush: all of them); they leave the queue. */
static void hosts_deliver(mfs_shard_ref_t *r, int flush)
{
	size_t due = 0;
	while (due < r->sr_nq && (flush || r->sr_q[due].at <= r->sr_round))
		due++;
	if (!due)
		return;
	for (uint32_t h = 0; h < r->sr_c.shards; h++)
		hosts_merge(r, h, r->sr_q, due);
	for (size_t x = 0; x < due; x++) {
		free(r->sr_q[x].rows);
		free(r->sr_q[x].own_n);
		free(r->sr_q[x].own);
		free(r->sr_q[x].val);
		free(r->sr_q[x].seen);
	}
	memmove(r->sr_q, r->sr_q + due, (r->sr_nq - due) * sizeof *r->sr_q);
	r->sr_nq -= due;
}

/* After a batch: publish when due, then deliver what is due. */
static int hosts_after_batch(mfs_shard_ref_t *r, int flush)
{
	int rc = 0;
	if (flush || ++r->sr_since >= r->sr_c.exchange_every) {
		for (uint32_t s = 0; s < r->sr_c.shards && !rc; s++)
			rc = hosts_publish(r, s);
		r->sr_st.exchanges++;
		r->sr_since = 0;
	}
	if (!rc)
		hosts_deliver(r, flush);
	return rc;
}

/* The model's item rows = shard 0's replica (what its host's snapshot would write). */
static void hosts_show(mfs_shard_ref_t *r)
{
	mfs_model_t *m = r->sr_m;
	memcpy(m->Q, r->sr_sh[0].sh_Q, (size_t)r->sr_ni * (size_t)r->sr_k * sizeof *m->Q);
	memcpy(m->bi, r->sr_sh[0].sh_bi, (size_t)r->sr_ni * sizeof *m->bi);
}

/* Allreduce: merge the rows of the union (every one, or with hot only those one shard gave
 * hot_ratings or more in this batch: the rows that drift fastest) into the model (q0's home)
 * and every replica by mfs_merge_row_ref, with the counts since each row's last merge; the
 * union keeps the rows not merged, in order. */
static void merge_union(mfs_shard_ref_t *r, int hot)
{
	const uint32_t S = r->sr_c.shards;
	const size_t ks = (size_t)r->sr_k, row_bytes = (ks + 1) * sizeof(float);
	mfs_model_t *m = r->sr_m;
	float *acc = r->sr_acc;
	double p2 = 0, pp = 0, lb, lq;
	if (r->sr_c.combine == MFS_SHARD_BLEND)
		round_p2(r, &p2, &pp);
	const int whole = !hot && r->sr_in_epoch && r->sr_epoch_last && r->sr_epoch_merges == 0;
	r->sr_epoch_merges++;
	mfs_merge_logs(&r->sr_hp, p2, pp, whole ? mfs_shard_blend_epoch_g(S) : 0, &lb, &lq);
	const float *rep_q[MFS_SHARD_MAX];
	float rep_b[MFS_SHARD_MAX];
	uint32_t cnt[MFS_SHARD_MAX];
	size_t kept = 0, merged = 0;
	for (size_t x = 0; x < r->sr_nunion; x++) {
		const uint32_t i = r->sr_union[x];
		uint32_t most = 0;
		for (uint32_t s = 0; s < S; s++) {
			const struct shard *sh = &r->sr_sh[s];
			cnt[s] = sh->sh_touched[i];
			most = sh->sh_bt[i] > most ? sh->sh_bt[i] : most;
			rep_q[s] = sh->sh_Q + i * ks;
			rep_b[s] = sh->sh_bi[i];
		}
		if (hot && most < r->sr_c.hot_ratings) {
			r->sr_union[kept++] = i;
			continue;
		}
		float *q0 = m->Q + i * ks;
		mfs_merge_row_ref(r->sr_k, S, r->sr_c.combine, cnt, m->bi[i], q0, rep_b, rep_q, lb, lq, acc, r->sr_tacc);
		m->bi[i] = acc[0];
		memcpy(q0, acc + 1, ks * sizeof *acc);
		for (uint32_t s = 0; s < S; s++) {
			struct shard *sh = &r->sr_sh[s];
			/* every other shard receives this shard's row, with its row number */
			if (sh->sh_touched[i])
				r->sr_st.bytes_sparse += (uint64_t)(S - 1) * (row_bytes + sizeof(uint32_t));
			sh->sh_bi[i] = acc[0];
			memcpy(sh->sh_Q + i * ks, acc + 1, ks * sizeof *acc);
			sh->sh_touched[i] = 0;
		}
		r->sr_inunion[i] = 0;
		merged++;
	}
	r->sr_st.rows_exchanged += merged;
	r->sr_nunion = kept;
}

int mfs_shard_ref_exchange(mfs_shard_ref_t *r)
{
	if (!r)
		return MFS_EINVAL;
	if (r->sr_c.scheme == MFS_SHARD_HOSTS) {
		int rc = hosts_after_batch(r, 1);
		if (!rc)
			hosts_show(r);
		return rc;
	}
	if (r->sr_c.scheme != MFS_SHARD_ALLREDUCE || (r->sr_nunion == 0 && r->sr_since == 0))
		return 0;
	merge_union(r, 0);
	for (uint32_t s = 0; s < r->sr_c.shards; s++)
		r->sr_sh[s].sh_ntouched = 0;
	r->sr_st.bytes_dense += mfs_shard_allreduce_bytes(r->sr_ni, ((size_t)r->sr_k + 1) * sizeof(float), r->sr_c.shards);
	r->sr_st.exchanges++;
	r->sr_since = 0;
	return 0;
}

/* One batch of valid ratings: route, apply on every shard, exchange when it is due. */
static int allreduce_batch(mfs_shard_ref_t *r, const mfs_batch_t *b)
{
	int rc = route(r, b);
	if (rc)
		return rc;
	if ((rc = run_round(r, shard_batch)))
		return rc;
	uint64_t applied = 0, max = 0;
	for (uint32_t s = 0; s < r->sr_c.shards; s++) {
		applied += r->sr_sh[s].sh_applied;
		if (r->sr_sh[s].sh_n > max)
			max = r->sr_sh[s].sh_n;
	}
	r->sr_m->events_applied += applied;
	r->sr_st.rounds++;
	r->sr_st.ratings += b->n;
	r->sr_st.ratings_max_sum += max;
	if (r->sr_c.scheme == MFS_SHARD_HOSTS) {
		r->sr_round++;
		rc = hosts_after_batch(r, 0);
	} else if (++r->sr_since >= r->sr_c.exchange_every) {
		rc = mfs_shard_ref_exchange(r);
	} else if (r->sr_c.hot_ratings) {
		merge_union(r, 1);
	}
	for (uint32_t s = 0; s < r->sr_c.shards; s++) /* this batch's counts, back to zero */
		for (size_t j = 0; j < r->sr_sh[s].sh_n; j++)
			r->sr_sh[s].sh_bt[r->sr_sh[s].sh_i[j]] = 0;
	return rc;
}

int mfs_shard_ref_sgd(mfs_shard_ref_t *r, const mfs_batch_t *b)
{
	if (!r || r->sr_c.scheme == MFS_SHARD_ROTATE)
		return MFS_EINVAL;
	int rc = check_batch(r, b, 0);
	return rc ? rc : allreduce_batch(r, b);
}

/* ---- rotation ------------------------------------------------------------------------------ */

/* Bucket shard s's ratings by item block, stably. */
static int rotate_load(mfs_shard_ref_t *r, const mfs_batch_t *b)
{
	const uint32_t S = r->sr_c.shards;
	size_t cnt[MFS_SHARD_MAX][MFS_SHARD_MAX + 1];
	memset(cnt, 0, sizeof cnt);
	for (size_t j = 0; j < b->n; j++)
		cnt[mfs_shard_of_user(b->u[j], S)][mfs_shard_item_block(b->i[j], S) + 1]++;
	for (uint32_t s = 0; s < S; s++) {
		struct shard *sh = &r->sr_sh[s];
		for (uint32_t blk = 0; blk < S; blk++)
			cnt[s][blk + 1] += cnt[s][blk];
		memcpy(sh->sh_boff, cnt[s], (S + 1) * sizeof *sh->sh_boff);
		free(sh->sh_rt);
		sh->sh_rt = malloc((cnt[s][S] ? cnt[s][S] : 1) * sizeof *sh->sh_rt);
		if (!sh->sh_rt)
			return ENOMEM;
	}
	for (size_t j = 0; j < b->n; j++) {
		const uint32_t s = mfs_shard_of_user(b->u[j], S), blk = mfs_shard_item_block(b->i[j], S);
		r->sr_sh[s].sh_rt[cnt[s][blk]++] = (mfs_rating_t){b->u[j], b->i[j], b->r[j]};
	}
	return 0;
}

static void shard_block(mfs_shard_ref_t *r, uint32_t s)
{
	struct shard *sh = &r->sr_sh[s];
	const uint32_t S = r->sr_c.shards, blk = sh->sh_block;
	const mfs_rating_t *rt = sh->sh_rt + sh->sh_boff[blk];
	const size_t n = sh->sh_boff[blk + 1] - sh->sh_boff[blk];
	/* The ownership check, on every rating: its item's block, held by this shard now. */
	uint64_t bad = 0;
	for (size_t j = 0; j < n; j++)
		bad += mfs_shard_item_block(rt[j].i, S) != blk || r->sr_owner[blk] != s;
	sh->sh_violations = bad;
	const mfs_sgd_args_t a = args_of(r, s);
	sh->sh_applied = bad ? 0 : mfs_sgd_ratings_ref(&a, rt, n);
}

static int rotate_epoch(mfs_shard_ref_t *r)
{
	const uint32_t S = r->sr_c.shards;
	const uint64_t row_bytes = ((uint64_t)r->sr_k + 1) * sizeof(float);
	uint32_t want[MFS_SHARD_MAX];
	int rc = 0;
	for (uint32_t t = 0; t < S && !rc; t++) {
		/* hand the blocks to the shards that work them in this sub-epoch */
		int moved = 0;
		for (uint32_t s = 0; s < S; s++) {
			const uint32_t blk = mfs_shard_rotation_block(s, t, S);
			want[s] = blk;
			if (r->sr_owner[blk] != s) {
				r->sr_st.bytes_sparse += mfs_shard_rows_in(r->sr_ni, blk, S) * row_bytes;
				r->sr_owner[blk] = s;
				moved = 1;
			}
		}
		r->sr_st.exchanges += (uint64_t)moved;
		if (r->sr_c.trace)
			r->sr_c.trace(r->sr_c.trace_arg, r->sr_sub_epochs, want, S);
		uint64_t max = 0, applied = 0, ratings = 0;
		for (uint32_t s = 0; s < S; s++)
			r->sr_sh[s].sh_block = want[s];
		rc = run_round(r, shard_block);
		for (uint32_t s = 0; s < S; s++) {
			const struct shard *sh = &r->sr_sh[s];
			const uint64_t n = sh->sh_boff[want[s] + 1] - sh->sh_boff[want[s]];
			applied += sh->sh_applied;
			ratings += n;
			max = n > max ? n : max;
			r->sr_st.owner_violations += sh->sh_violations;
		}
		r->sr_m->events_applied += applied;
		r->sr_st.rounds++;
		r->sr_st.ratings += ratings;
		r->sr_st.ratings_max_sum += max;
		r->sr_sub_epochs++;
	}
	return rc;
}

/* ---- epochs, loss, inspection ------------------------------------------------------------- */

int mfs_shard_ref_load(mfs_shard_ref_t *r, const mfs_batch_t *b)
{
	if (!r)
		return MFS_EINVAL;
	int rc = check_batch(r, b, 0);
	if (rc)
		return rc;
	r->sr_loaded = 0;
	if (r->sr_c.scheme == MFS_SHARD_ROTATE) {
		if ((rc = rotate_load(r, b)))
			return rc;
	} else {
		const size_t n = b->n ? b->n : 1;
		free(r->sr_set_u);
		free(r->sr_set_i);
		free(r->sr_set_r);
		r->sr_set_u = malloc(n * sizeof *r->sr_set_u);
		r->sr_set_i = malloc(n * sizeof *r->sr_set_i);
		r->sr_set_r = malloc(n * sizeof *r->sr_set_r);
		if (!r->sr_set_u || !r->sr_set_i || !r->sr_set_r)
			return ENOMEM;
		memcpy(r->sr_set_u, b->u, b->n * sizeof *b->u);
		memcpy(r->sr_set_i, b->i, b->n * sizeof *b->i);
		memcpy(r->sr_set_r, b->r, b->n * sizeof *b->r);
		r->sr_set = (mfs_batch_t){r->sr_set_u, r->sr_set_i, r->sr_set_r, b->n};
	}
	r->sr_loaded = 1;
	return 0;
}

int mfs_shard_ref_epoch(mfs_shard_ref_t *r)
{
	if (!r || !r->sr_loaded)
		return MFS_EINVAL;
	if (r->sr_c.scheme == MFS_SHARD_ROTATE)
		return rotate_epoch(r);
	int rc = 0;
	const size_t n = r->sr_set.n, B = r->sr_c.batch;
	r->sr_in_epoch = 1;
	r->sr_epoch_merges = 0;
	for (size_t off = 0; off < n && !rc; off += B) {
		mfs_batch_t b = {r->sr_set.u + off, r->sr_set.i + off, r->sr_set.r + off, n - off < B ? n - off : B};
		r->sr_epoch_last = n - off <= B;
		rc = allreduce_batch(r, &b);
	}
	if (r->sr_c.scheme == MFS_SHARD_HOSTS) {
		/* hosts never stop to agree (the stream goes on): the model shows shard 0's replica */
		r->sr_in_epoch = r->sr_epoch_last = 0;
		if (!rc)
			hosts_show(r);
		return rc;
	}
	r->sr_epoch_last = 1;
	if (!rc) /* an epoch ends with the replicas agreeing */
		rc = mfs_shard_ref_exchange(r);
	r->sr_in_epoch = r->sr_epoch_last = 0;
	return rc;
}

int mfs_shard_ref_loss(mfs_shard_ref_t *r, const mfs_batch_t *b, mfs_loss_t *out)
{
	if (!r || !out)
		return MFS_EINVAL;
	int rc = check_batch(r, b, 1);
	if (rc)
		return rc;
	const uint32_t S = r->sr_c.shards;
	const size_t n = b->n;
	uint32_t *u = malloc((n ? n : 1) * sizeof *u), *i = malloc((n ? n : 1) * sizeof *i);
	float *x = malloc((n ? n : 1) * sizeof *x);
	double *part = malloc(2 * ((n + MFS_LOSS_CHUNK - 1) / MFS_LOSS_CHUNK + 1) * sizeof *part);
	if (!u || !i || !x || !part) {
		rc = ENOMEM;
		goto done;
	}
	double sse = 0, sae = 0;
	for (uint32_t s = 0; s < S; s++) {
		size_t ns = 0; /* this shard's users' ratings, in order */
		for (size_t j = 0; j < n; j++) {
			const uint32_t owner = b->u[j] == MFS_ROW_NONE ? 0 : mfs_shard_of_user(b->u[j], S);
			if (owner == s) {
				u[ns] = b->u[j];
				i[ns] = b->i[j];
				x[ns++] = b->r[j];
			}
		}
		const mfs_sgd_args_t a = args_of(r, s);
		const size_t chunks = (ns + MFS_LOSS_CHUNK - 1) / MFS_LOSS_CHUNK;
		for (size_t c = 0; c < chunks; c++) {
			const size_t lo = c * MFS_LOSS_CHUNK, hi = lo + MFS_LOSS_CHUNK < ns ? lo + MFS_LOSS_CHUNK : ns;
			mfs_loss_batch_ref(&a, u + lo, i + lo, x + lo, hi - lo, &part[2 * c], &part[2 * c + 1]);
		}
		mfs_loss_t ls;
		mfs_loss_combine_ref(part, chunks, ns, &ls); /* the engine's reduction, per shard */
		/* the reduction across shards: sums, in shard order (S = 1: the engine's result) */
		sse = s ? sse + ls.sse : ls.sse;
		sae = s ? sae + ls.sae : ls.sae;
	}
	out->sse = sse;
	out->sae = sae;
	out->n = n;
	out->rmse = n ? sqrt(sse / (double)n) : NAN;
	out->mae = n ? sae / (double)n : NAN;
done:
	free(u);
	free(i);
	free(x);
	free(part);
	return rc;
}

const float *mfs_shard_ref_items(const mfs_shard_ref_t *r, uint32_t s, const float **bias)
{
	if (!r || s >= r->sr_c.shards)
		return NULL;
	const mfs_sgd_args_t a = args_of(r, s);
	if (bias)
		*bias = a.bi;
	return a.Q;
}

void mfs_shard_ref_stats(const mfs_shard_ref_t *r, mfs_shard_stats_t *out)
{
	if (r && out)
		*out = r->sr_st;
}
