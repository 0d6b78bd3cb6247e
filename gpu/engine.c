/* engine.c - the engine registry and the public engine.h functions.
 *
 * Every public call checks its arguments and validates its ratings here, once, for all
 * engines; then it dispatches through the vtable (struct mfs_engine_i). An implementation may
 * therefore assume: rows in range (or MFS_ROW_NONE where a loss pass or a set allows it),
 * ratings finite, pointers valid.
 *
 * DESIGN: a table indexed by enum mfs_engine_kind; a NULL entry is a kind this build lacks.
 * AUTO walks the preference order (CUDA, then CPU) and logs which engine it chose and why.
 * The registry holds no state of its own; an engine handle is used by one thread at a time
 * (the ingest or train thread), which is also the thread that grows the model between calls,
 * except mfs_engine_capture_wait, which the snapshot writer calls too: captures and waits take
 * the engine's capture lock.
 * Validation reads the whole batch before anything is applied, so a bad batch leaves the
 * model untouched.
 */
#include "gpu/engine.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/fault.h"
#include "common/log.h"
#include "gpu/engine_int.h"
#ifdef MFS_HAVE_CUDA
#include "gpu/cuda/cuda_probe.h"
#endif

static const struct mfs_engine_i *const engines[] = {
	[MFS_ENGINE_CPU] = &mfs_engine_cpu_i,
#ifdef MFS_HAVE_CUDA
	[MFS_ENGINE_CUDA] = &mfs_engine_cuda_i, /* gpu/cuda/engine_cuda.cu */
#else
	[MFS_ENGINE_CUDA] = NULL,
#endif
};

static const struct mfs_engine_i *engine_of(int kind)
{
	if (kind <= MFS_ENGINE_AUTO || kind > MFS_ENGINE_CUDA)
		return NULL;
	return engines[kind];
}

/* Does a CUDA device answer? Writes its description or the reason it does not into why. */
static int cuda_device_answers(int device, char *why, size_t why_size)
{
#ifdef MFS_HAVE_CUDA
	return mfs_cuda_probe(device, why, why_size) > 0;
#else
	(void)device;
	snprintf(why, why_size, "built without CUDA");
	return 0;
#endif
}

int mfs_engine_cuda_available(void)
{
	char why[256];
	return engine_of(MFS_ENGINE_CUDA) != NULL && cuda_device_answers(0, why, sizeof why);
}

/* AUTO: CUDA if this build has the engine and the device answers, else CPU. */
static int pick_auto(const mfs_engine_conf_t *conf, const mfs_model_t *m)
{
	char why[256] = "";
	int have_dev = cuda_device_answers(conf->device, why, sizeof why);
	const struct mfs_engine_i *cu = engine_of(MFS_ENGINE_CUDA);
	if (cu && have_dev && cu->can_implement && !cu->can_implement(m, why, sizeof why)) {
		mfs_info("engine",
		         "msg=\"engine chosen\" engine=cpu reason=\"auto: the CUDA engine cannot run this model, "
		         "so the CPU engine runs\" detail=\"%s\"",
		         why);
		return MFS_ENGINE_CPU;
	}
	if (cu && have_dev) {
		mfs_info("engine", "msg=\"engine chosen\" engine=cuda reason=\"auto: device %d answers: %s\"",
		         conf->device, why);
		return MFS_ENGINE_CUDA;
	}
	/* Say plainly what happened; the CUDA runtime's own text stays as the detail. Without a
	 * driver it reads "CUDA driver version is insufficient for CUDA runtime version", which
	 * sounds like an old driver on a GPU host when there is no GPU at all. */
	if (!engine_of(MFS_ENGINE_CUDA))
		mfs_info("engine",
		         "msg=\"engine chosen\" engine=cpu reason=\"auto: this build has no CUDA engine, so the CPU "
		         "engine runs\" detail=\"%s\"",
		         why);
	else
		mfs_info("engine",
		         "msg=\"engine chosen\" engine=cpu reason=\"auto: no usable GPU or driver found (CUDA device "
		         "%d), so the CPU engine runs\" cuda_error=\"%s\"",
		         conf->device, why);
	return MFS_ENGINE_CPU;
}

static int open_with(const struct mfs_engine_i *iface, const mfs_engine_conf_t *conf, int kind, mfs_model_t *m,
                     mfs_engine_t **out, char *errstr, size_t errstr_size)
{
	mfs_engine_t *e = calloc(1, sizeof *e);
	if (!e)
		return mfs_errf(errstr, errstr_size, ENOMEM, "engine: out of memory");
	e->iface = iface;
	e->conf = *conf;
	e->conf.kind = kind;
	e->model = m;
	/* until the caller sets its own (a loss pass before set_hparams still means something) */
	e->hp = (mfs_hparams_t)MFS_HPARAMS_DEFAULT;
	if (pthread_mutex_init(&e->cap_mu, NULL)) {
		free(e);
		return mfs_errf(errstr, errstr_size, ENOMEM, "engine: cannot create the capture lock");
	}
	int rc = iface->open(e, errstr, errstr_size);
	if (rc) {
		pthread_mutex_destroy(&e->cap_mu);
		free(e);
		return rc;
	}
	*out = e;
	return 0;
}

int mfs_engine_open(const mfs_engine_conf_t *conf, mfs_model_t *m, mfs_engine_t **out,
                    char *errstr, size_t errstr_size)
{
	if (out)
		*out = NULL;
	if (!conf || !m || !out)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "engine: NULL argument");
	if (m->k < 1 || (m->n_users && !m->bu) || (m->n_items && !m->bi))
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "engine: model not initialized (k=%d)", m->k);
	if (conf->threads < 0)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "engine: threads must be >= 0 (got %d)",
		                conf->threads);
	int kind = conf->kind;
	if (kind < MFS_ENGINE_AUTO || kind > MFS_ENGINE_CUDA)
		return mfs_errf(errstr, errstr_size, MFS_EINVAL, "engine: unknown kind %d", kind);
	if (conf->shards > 1) /* several engines of `kind` under one (gpu/sharded.c): it opens them */
		return open_with(&mfs_engine_sharded_i, conf, kind, m, out, errstr, errstr_size);
	if (kind == MFS_ENGINE_AUTO)
		kind = pick_auto(conf, m);
	else
		mfs_info("engine", "msg=\"engine chosen\" engine=%s reason=\"configured (engine.kind)\"",
		         kind == MFS_ENGINE_CUDA ? "cuda" : "cpu");
	const struct mfs_engine_i *iface = engine_of(kind);
	if (!iface)
		return mfs_errf(errstr, errstr_size, MFS_ENODEV,
		                "engine.kind=%s: the %s engine is not in this build",
		                kind == MFS_ENGINE_CUDA ? "cuda" : "cpu", kind == MFS_ENGINE_CUDA ? "CUDA" : "CPU");
	if (kind == MFS_ENGINE_CUDA) {
		char why[256] = "";
		if (!cuda_device_answers(conf->device, why, sizeof why))
			return mfs_errf(errstr, errstr_size, MFS_ENODEV,
			                "engine.kind=cuda: no usable GPU or driver found for CUDA device %d (CUDA: %s); "
			                "engine.kind=auto runs the CPU engine instead",
			                conf->device, why);
	}

	return open_with(iface, conf, kind, m, out, errstr, errstr_size);
}

void mfs_engine_close(mfs_engine_t *e)
{
	if (!e)
		return;
	(void)mfs_engine_capture_wait(e); /* its buffers go with the engine */
	e->iface->close(e);
	pthread_mutex_destroy(&e->cap_mu);
	free(e);
}

const char *mfs_engine_name(const mfs_engine_t *e) { return e ? e->iface->name : "none"; }

int mfs_engine_set_hparams(mfs_engine_t *e, const mfs_hparams_t *hp)
{
	if (!e || !hp)
		return MFS_EINVAL;
	/* A rate of 0 would silently stop learning and a negative one ascends: both are bugs. */
	if (!(isfinite(hp->lr) && hp->lr > 0) || !(isfinite(hp->lambda_p) && hp->lambda_p >= 0) ||
	    !(isfinite(hp->lambda_q) && hp->lambda_q >= 0) || !(isfinite(hp->lambda_bu) && hp->lambda_bu >= 0) ||
	    !(isfinite(hp->lambda_bi) && hp->lambda_bi >= 0) || isnan(hp->clip_min) || isnan(hp->clip_max) ||
	    hp->clip_min > hp->clip_max)
		return MFS_EINVAL;
	int rc = e->iface->set_hparams(e, hp);
	if (!rc)
		e->hp = *hp; /* the host's copy: the CPU engine's updates and the CUDA engine's row modes read it */
	return rc;
}

int mfs_engine_grow(mfs_engine_t *e)
{
	if (!e)
		return MFS_EINVAL;
	return e->iface->grow ? e->iface->grow(e) : 0;
}

int mfs_engine_reset_rows(mfs_engine_t *e, int ent, const uint32_t *rows, size_t n, int in_flight)
{
	if (!e || (ent != 0 && ent != 1) || (n && !rows))
		return MFS_EINVAL;
	const uint32_t have = ent ? e->model->n_items : e->model->n_users;
	for (size_t j = 0; j < n; j++)
		if (rows[j] >= have)
			return MFS_EINVAL;
	return n && e->iface->reset_rows ? e->iface->reset_rows(e, ent, rows, n, in_flight) : 0;
}

int mfs_engine_take_new_rows(mfs_engine_t *e, int *taken)
{
	*taken = 0;
	if (!e)
		return MFS_EINVAL;
	if (!e->iface->take_new_rows)
		return 0;
	int rc = e->iface->take_new_rows(e);
	*taken = rc == 0;
	return rc;
}

int mfs_engine_sync(mfs_engine_t *e)
{
	if (!e)
		return MFS_EINVAL;
	return e->iface->sync ? e->iface->sync(e) : 0;
}

/* Rows named for a capture: a list wherever there are rows, each in the model. */
static int rows_ok(const mfs_engine_t *e, const uint32_t *ur, size_t nu, const uint32_t *ir, size_t ni)
{
	if ((nu && !ur) || (ni && !ir))
		return 0;
	for (size_t j = 0; j < nu; j++)
		if (ur[j] >= e->model->n_users)
			return 0;
	for (size_t j = 0; j < ni; j++)
		if (ir[j] >= e->model->n_items)
			return 0;
	return 1;
}

/* The capture lock makes a capture and every wait one at a time. Without it the learner's
 * capture (its wait for the capture before, then the new one) could run beside the writer's
 * wait: the writer could find nothing pending and read its values while the learner was still
 * copying them, or copy the learner's new capture while the engine grew its buffers. With it,
 * when a wait returns, every capture begun before it has its values in place, whichever thread
 * copied them. */
static int capture_wait_locked(mfs_engine_t *e)
{
	return e->iface->capture_wait ? e->iface->capture_wait(e) : 0;
}

int mfs_engine_capture(mfs_engine_t *e, const uint32_t *user_rows, size_t n_users, float *dst_users,
                       const uint32_t *item_rows, size_t n_items, float *dst_items)
{
	if (!e || (n_users && !dst_users) || (n_items && !dst_items) ||
	    !rows_ok(e, user_rows, n_users, item_rows, n_items))
		return MFS_EINVAL;
	pthread_mutex_lock(&e->cap_mu);
	int rc = capture_wait_locked(e);
	if (rc)
		goto out;
	if (e->iface->capture) {
		rc = e->iface->capture(e, user_rows, n_users, dst_users, item_rows, n_items, dst_items);
		goto out;
	}
	if ((rc = mfs_engine_sync(e))) /* a host engine: the host's rows are the model's */
		goto out;
	const mfs_model_t *m = e->model;
	mfs_engine_copy_rows(m->bu, m->P, m->k, user_rows, n_users, dst_users);
	mfs_engine_copy_rows(m->bi, m->Q, m->k, item_rows, n_items, dst_items);
out:
	pthread_mutex_unlock(&e->cap_mu);
	return rc;
}

int mfs_engine_capture_wait(mfs_engine_t *e)
{
	if (!e)
		return MFS_EINVAL;
	pthread_mutex_lock(&e->cap_mu);
	int rc = capture_wait_locked(e);
	pthread_mutex_unlock(&e->cap_mu);
	return rc;
}

void mfs_engine_progress(mfs_engine_t *e, uint64_t *ticket, uint64_t *applied)
{
	if (e->iface->progress) {
		e->iface->progress(e, ticket, applied);
		return;
	}
	*ticket = *applied = e->sgd_calls;
}

int mfs_engine_drain(mfs_engine_t *e)
{
	if (!e)
		return MFS_EINVAL;
	return e->iface->drain ? e->iface->drain(e) : 0;
}

int mfs_engine_memory(mfs_engine_t *e, uint64_t *used, uint64_t *total)
{
	if (!e || !used || !total)
		return MFS_EINVAL;
	return e->iface->memory ? e->iface->memory(e, used, total) : MFS_ENODEV;
}

/* Check every rating before any is applied. none_ok: MFS_ROW_NONE is allowed (loss, sets).
 * The first bad rating decides the code (for one rating, a bad row before a bad value). */
static int batch_check(const mfs_model_t *m, const mfs_batch_t *b, int none_ok)
{
	if (!b)
		return MFS_EINVAL;
	if (b->n == 0)
		return 0;
	if (!b->u || !b->i || !b->r)
		return MFS_EINVAL;
	const uint32_t nu = m->n_users, ni = m->n_items;
	for (size_t j = 0; j < b->n; j++) {
		uint32_t u = b->u[j], i = b->i[j];
		if ((u >= nu && !(none_ok && u == MFS_ROW_NONE)) || (i >= ni && !(none_ok && i == MFS_ROW_NONE)))
			return MFS_EINVAL;
		if (!isfinite(b->r[j]))
			return MFS_ENAN;
	}
	return 0;
}

int mfs_engine_sgd(mfs_engine_t *e, const mfs_batch_t *b)
{
	if (!e)
		return MFS_EINVAL;
	int rc = batch_check(e->model, b, 0);
	if (rc || b->n == 0)
		return rc;
	if ((rc = mfs_fault("engine.sgd"))) /* test.fault: a failing device */
		return rc;
	if ((rc = e->iface->sgd(e, b, 1.0f, 0)) == 0)
		e->sgd_calls++;
	return rc;
}

int mfs_engine_replay(mfs_engine_t *e, const mfs_batch_t *b, float lr_scale)
{
	if (!e || !(lr_scale > 0.0f) || !isfinite(lr_scale))
		return MFS_EINVAL;
	int rc = batch_check(e->model, b, 0);
	if (rc || b->n == 0)
		return rc;
	if ((rc = e->iface->sgd(e, b, lr_scale, 1)) == 0)
		e->sgd_calls++;
	return rc;
}

int mfs_engine_loss(mfs_engine_t *e, const mfs_batch_t *b, mfs_loss_t *out)
{
	if (!e || !out)
		return MFS_EINVAL;
	int rc = batch_check(e->model, b, 1);
	if (rc)
		return rc;
	return e->iface->loss(e, b, out);
}

int mfs_engine_resident_load(mfs_engine_t *e, const mfs_batch_t *b, mfs_resident_t **out)
{
	if (out)
		*out = NULL;
	if (!e || !out)
		return MFS_EINVAL;
	int rc = batch_check(e->model, b, 1);
	if (rc)
		return rc;
	return e->iface->resident_load(e, b, out);
}

void mfs_engine_resident_free(mfs_engine_t *e, mfs_resident_t *s)
{
	if (e && s)
		e->iface->resident_free(e, s);
}

int mfs_engine_sgd_epoch(mfs_engine_t *e, mfs_resident_t *s, uint64_t epoch)
{
	if (!e || !s)
		return MFS_EINVAL;
	return e->iface->sgd_epoch(e, s, epoch);
}

int mfs_engine_loss_resident(mfs_engine_t *e, mfs_resident_t *s, mfs_loss_t *out)
{
	if (!e || !s || !out)
		return MFS_EINVAL;
	return e->iface->loss_resident(e, s, out);
}
