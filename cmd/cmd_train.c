/* cmd_train.c - `mfstream train`: offline training from a ratings file, then publish a snapshot.
 *
 * The path is the service's, minus Kafka: ingest (file reader) -> model_store (ids to rows)
 * -> engine (epochs of SGD, full-pass loss, learning-rate controller) -> snapshots (one LMDB
 * write transaction). Progress is a table on stdout, one row per epoch; logs go to stderr.
 * Between loading and the engine, the item rows are renumbered at random (train.item_order).
 *
 * Hygiene: early stopping and the choice of the model kept look at a validation set carved from
 * the training file (train.validation_fraction), never at the test; the test (a file, read
 * only after training, or the share held out of the input) is scored once, at the end, on the
 * model kept. train.trace_test (for benchmarks: time to a target test RMSE) reads the test before
 * training and prints its RMSE after every epoch as well; that column is printed, never read, so
 * it steers nothing.
 *
 * The snapshot directory is checked and its writer opened before the data is read, so no
 * epoch runs for a model that cannot be published: a directory that holds a snapshot is
 * refused unless snapshot.mode says replace or append, as is one whose snapshot has another
 * k (readers size their buffers by it) or one that cannot be written. The writer's lock is
 * held from then on, so no other writer can take the directory while the epochs run.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/err.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "gpu/engine.h"
#include "gpu/lr.h"
#include "ingest/dataset.h"
#include "serve/stage_conf.h"
#include "snapshots/snap_writer.h"

static const mfs_conf_alias_t train_aliases[] = {
	{"--patience", "train.patience"},
	{"--test-fraction", "train.test_fraction"},
	{NULL, NULL},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: mfstream train --input FILE [--test FILE] --snapshot DIR [--k N] [--epochs N]\n"
	           "                      [--lr X] [--engine auto|cpu|cuda] [--threads N]\n"
	           "                      [--snapshot.mode new|replace|append] [--key value ...]\n"
	           "Trains on FILE (tsv, dat, csv or bin; plain, .gz or .zst), early-stopping on a validation\n"
	           "split of it, scores the test once at the end and publishes the model kept to DIR.\n"
	           "A DIR that holds a snapshot already is refused unless --snapshot.mode is replace (the new\n"
	           "model takes its place) or append (the new rows are written over the old ones).\n"
	           "Every train.* / model.* / sgd.* key: mfstream config --doc.\n");
}

static void fmt_rate(char *buf, size_t n, double v)
{
	if (v >= 1e9)
		snprintf(buf, n, "%.2fG", v / 1e9);
	else if (v >= 1e6)
		snprintf(buf, n, "%.2fM", v / 1e6);
	else if (v >= 1e3)
		snprintf(buf, n, "%.1fK", v / 1e3);
	else
		snprintf(buf, n, "%.0f", v);
}

static void fmt_eta(char *buf, size_t n, double s)
{
	if (s < 100)
		snprintf(buf, n, "%.1fs", s);
	else if (s < 6000)
		snprintf(buf, n, "%.1fm", s / 60);
	else
		snprintf(buf, n, "%.1fh", s / 3600);
}

/* A copy of the host model's values (the best epoch's, for model selection). */
typedef struct saved_model {
	float *P, *Q, *bu, *bi;
	size_t np, nq, nbu, nbi;
} saved_model_t;

static int save_model(saved_model_t *s, const mfs_model_t *m)
{
	const size_t np = (size_t)m->n_users * (size_t)m->k, nq = (size_t)m->n_items * (size_t)m->k;
	if (!s->P && (!(s->P = malloc(np * sizeof *s->P)) || !(s->Q = malloc(nq * sizeof *s->Q)) ||
	              !(s->bu = malloc(m->n_users * sizeof *s->bu)) || !(s->bi = malloc(m->n_items * sizeof *s->bi))))
		return ENOMEM;
	memcpy(s->P, m->P, np * sizeof *s->P);
	memcpy(s->Q, m->Q, nq * sizeof *s->Q);
	memcpy(s->bu, m->bu, m->n_users * sizeof *s->bu);
	memcpy(s->bi, m->bi, m->n_items * sizeof *s->bi);
	s->np = np, s->nq = nq, s->nbu = m->n_users, s->nbi = m->n_items;
	return 0;
}

static void restore_model(const saved_model_t *s, mfs_model_t *m)
{
	memcpy(m->P, s->P, s->np * sizeof *s->P);
	memcpy(m->Q, s->Q, s->nq * sizeof *s->Q);
	memcpy(m->bu, s->bu, s->nbu * sizeof *s->bu);
	memcpy(m->bi, s->bi, s->nbi * sizeof *s->bi);
}

static void free_saved(saved_model_t *s)
{
	free(s->P);
	free(s->Q);
	free(s->bu);
	free(s->bi);
}

/* RMSE/MAE of ratings r against the host model (a CPU engine over m's own arrays, so the score
 * is the same whatever engine trained it). */
static int score_host(const mfs_conf_t *c, mfs_model_t *m, const mfs_ratings_t *r, mfs_loss_t *out, char *err,
                      size_t es)
{
	mfs_engine_conf_t ec = {.kind = MFS_ENGINE_CPU, .seed = 1};
	mfs_engine_t *e = NULL;
	mfs_resident_t *res = NULL;
	mfs_batch_t b = mfs_ratings_batch(r);
	/* predictions clipped to [rating.min, rating.max], as the epochs' scores and serving's */
	mfs_hparams_t hp;
	mfs_hparams_from(c, c->sgd_lr, &hp);
	int rc = mfs_engine_open(&ec, m, &e, err, es);
	if (!rc)
		rc = mfs_engine_set_hparams(e, &hp);
	if (!rc && !(rc = mfs_engine_resident_load(e, &b, &res)))
		rc = mfs_engine_loss_resident(e, res, out);
	if (e)
		mfs_engine_resident_free(e, res);
	mfs_engine_close(e);
	return rc;
}

/* train.trace_test: the test set, before training, resident on the engine like the validation
 * set so that every epoch can score it. A test file is read here (ids only looked up, as after
 * training); the share held out of the input is in *test already. *out stays NULL for an empty
 * test. Errors: as mfs_dataset_load_test (err filled) or mfs_engine_resident_load. */
static int trace_test_load(const mfs_conf_t *c, const mfs_model_t *m, const mfs_load_opts_t *lo, mfs_engine_t *e,
                           mfs_ratings_t *test, mfs_rfile_stats_t *st, mfs_resident_t **out, char *err, size_t es)
{
	int rc;
	if (*c->train_test && (rc = mfs_dataset_load_test(m, c->train_test, lo, test, st, err, es)))
		return rc;
	if (!test->n)
		return 0;
	mfs_batch_t b = mfs_ratings_batch(test);
	return mfs_engine_resident_load(e, &b, out);
}

enum { SNAP_MODE_NEW, SNAP_MODE_REPLACE, SNAP_MODE_APPEND }; /* snapshot.mode */

struct by_time {
	int64_t ts;
	size_t j;
};

static int by_time_cmp(const void *pa, const void *pb)
{
	const struct by_time *a = pa, *b = pb;
	if (a->ts != b->ts)
		return a->ts < b->ts ? -1 : 1;
	return (a->j > b->j) - (a->j < b->j);
}

/* The items each user rated (snapshot.seen_items, issue 20): every training rating goes into the
 * tracker in event-time order (file order between equal times, and for files without times), so
 * each user's list ends with their latest. The sort is skipped when the file is in time order. */
static int rated_from_train(const mfs_ratings_t *t, const mfs_model_t *m, uint32_t max, mfs_snap_rated_t **out)
{
	struct by_time *o = NULL;
	size_t j;
	int rc = mfs_snap_rated_init(max, out);
	for (j = 1; !rc && t->ts && j < t->n && t->ts[j - 1] <= t->ts[j]; j++)
		;
	if (!rc && t->ts && j < t->n) {
		if (!(o = malloc(t->n * sizeof *o)))
			return ENOMEM;
		for (j = 0; j < t->n; j++)
			o[j] = (struct by_time){t->ts[j], j};
		qsort(o, t->n, sizeof *o, by_time_cmp);
	}
	for (j = 0; !rc && j < t->n; j++) {
		const size_t x = o ? o[j].j : j;
		rc = mfs_snap_rated_add(*out, m, t->u[x], t->i[x]);
	}
	free(o);
	return rc;
}

enum { ITEM_ORDER_RANDOM, ITEM_ORDER_APPEARANCE }; /* train.item_order */

/* train.item_order random: the items' rows, handed out in order of first appearance (hot items
 * first, side by side), renumbered by a permutation drawn from model.seed, in the model (ids,
 * factors, biases) and in the loaded sets alike. Before anything else holds rows (the rated
 * lists, the engine); a test file read later looks its ids up in the renumbered map. On the GPU,
 * hot rows side by side cost 25 % of the Hogwild kernel's speed at Zipf 1.2 (docs/ENGINE.md). */
static int items_renumber(mfs_model_t *m, mfs_ratings_t *train, mfs_ratings_t *valid, mfs_ratings_t *test)
{
	const double t0 = mfs_now_s();
	uint32_t *perm = malloc(((size_t)m->n_items + 1) * sizeof *perm);
	if (!perm)
		return ENOMEM;
	mfs_model_draw_order(m, 1, perm);
	int rc = mfs_model_permute_rows(m, 1, perm);
	if (!rc) {
		mfs_ratings_remap(train, 1, perm);
		mfs_ratings_remap(valid, 1, perm);
		mfs_ratings_remap(test, 1, perm);
		mfs_info("train", "msg=\"item rows renumbered\" order=random items=%u seed=%llu seconds=%.3f", m->n_items,
		         (unsigned long long)m->seed, mfs_now_s() - t0);
	}
	free(perm);
	return rc;
}

/* What an environment's writer leaves in its directory; anything else is someone's file. */
static int snap_own_file(const char *name)
{
	return !strcmp(name, "data.mdb") || !strcmp(name, "lock.mdb") || !strcmp(name, "writer.lock");
}

/* Check snapshot.dir against snapshot.mode and open its writer, before any data is read.
 * Prints why not and returns -1 (exit 2) when the directory cannot take this model: it cannot
 * be written, or it is not empty (a snapshot, or files of another program) and the mode is
 * new, or its snapshot's k is not model.k. */
static int snap_open_checked(const mfs_conf_t *c, mfs_snap_writer_t **w)
{
	const char *dir = c->snapshot_dir;
	char err[1024] = "", other[300] = "";
	DIR *d = opendir(dir);
	if (!d && errno != ENOENT) {
		fprintf(stderr, "mfstream train: snapshot directory %s: %s\n", dir, strerror(errno));
		return -1;
	}
	if (d) {
		for (struct dirent *de; !*other && (de = readdir(d));)
			if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && !snap_own_file(de->d_name))
				snprintf(other, sizeof other, "%s", de->d_name);
		closedir(d);
		if (access(dir, W_OK) != 0) {
			fprintf(stderr, "mfstream train: snapshot directory %s is not writable: %s\n", dir, strerror(errno));
			return -1;
		}
	}
	if (*other && c->snapshot_mode == SNAP_MODE_NEW) {
		fprintf(stderr, "mfstream train: snapshot directory %s is not empty (it holds \"%s\"): use a new or empty "
		                "directory, or say --snapshot.mode replace or append to write into it anyway\n", dir, other);
		return -1;
	}
	int rc = mfs_snap_writer_open_sync(dir, (size_t)c->snapshot_map_size, (mfs_snap_sync_t)c->snapshot_sync, w, err,
	                                   sizeof err);
	mfs_snap_existing_t ex;
	if (!rc)
		rc = mfs_snap_writer_existing(*w, &ex, err, sizeof err);
	if (rc) {
		fprintf(stderr, "mfstream train: snapshot: %s\n", *err ? err : mfs_strerror(rc));
		goto refuse;
	}
	if (!ex.seq)
		return 0;
	if (c->snapshot_mode == SNAP_MODE_NEW) {
		fprintf(stderr, "mfstream train: snapshot directory %s holds a snapshot already (seq %llu, k=%u, %llu users, "
		                "%llu items); training into it would mix the two models. Say --snapshot.mode replace to "
		                "publish the new model in its place, --snapshot.mode append to write the new rows over the "
		                "old ones, or use another directory\n",
		        dir, (unsigned long long)ex.seq, ex.k, (unsigned long long)ex.n_users, (unsigned long long)ex.n_items);
		goto refuse;
	}
	if ((int64_t)ex.k != c->model_k) { /* readers size their buffers by k: it never changes in a directory */
		fprintf(stderr, "mfstream train: --snapshot.mode %s: the snapshot in %s has k=%u, this model k=%lld; "
		                "say --k %u, or use another directory (k never changes in place)\n",
		        c->snapshot_mode == SNAP_MODE_REPLACE ? "replace" : "append", dir, ex.k, (long long)c->model_k, ex.k);
		goto refuse;
	}
	mfs_info("train", "msg=\"%s the snapshot in the directory\" dir=%s seq=%llu k=%u users=%llu items=%llu",
	         c->snapshot_mode == SNAP_MODE_REPLACE ? "replacing" : "appending to", dir, (unsigned long long)ex.seq, ex.k,
	         (unsigned long long)ex.n_users, (unsigned long long)ex.n_items);
	return 0;
refuse:
	mfs_snap_writer_close(*w);
	*w = NULL;
	return -1;
}

int mfs_cmd_train(int argc, char **argv)
{
	for (int k = 1; k < argc; k++)
		if (strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0) {
			usage(stdout);
			return 0;
		}
	mfs_conf_t c;
	int n_pos;
	char *pos[1];
	if (mfs_cmd_conf("train", argc - 1, argv + 1, train_aliases, &c, pos, 0, &n_pos))
		return 2;
	int exit_code = 1, rc;
	char err[1024] = "";
	mfs_model_t *m = NULL;
	mfs_engine_t *e = NULL;
	mfs_resident_t *strain = NULL, *svalid = NULL, *stest = NULL;
	mfs_snap_writer_t *w = NULL;
	mfs_ratings_t train = {0}, test = {0}, valid = {0};
	saved_model_t best_model = {0};
	mfs_snap_rated_t *rated = NULL;

	if (!*c.train_input) {
		fprintf(stderr, "mfstream train: --input FILE (train.input) is required\n");
		usage(stderr);
		exit_code = 2;
		goto out;
	}
	if (c.rating_min >= c.rating_max) {
		fprintf(stderr, "mfstream train: rating.min (%g) must be below rating.max (%g)\n", c.rating_min,
		        c.rating_max);
		exit_code = 2;
		goto out;
	}
	if (*c.snapshot_dir && snap_open_checked(&c, &w)) {
		exit_code = 2;
		goto out;
	}
	mfs_model_conf_t mc;
	mfs_model_conf_from(&c, &mc);
	if ((rc = mfs_model_init(&mc, &m))) {
		fprintf(stderr, "mfstream train: model: %s\n", mfs_strerror(rc));
		goto out;
	}

	/* ingest -> model_store: training (and validation, and the held-out test share when there is
	 * no test file); a test file is read only after training, so nothing of it can steer it */
	const int test_file = *c.train_test != '\0';
	mfs_load_opts_t lo = {
		.file = {.format = c.input_format, .fail_on_error = c.input_on_error == 1,
		         .rating_min = c.rating_min, .rating_max = c.rating_max, .max_reported = 10},
		.test_fraction = test_file ? 0.0 : c.train_test_fraction,
		.valid_fraction = c.train_validation_fraction,
		.split_seed = (uint64_t)c.train_split_seed,
		.keep_ts = w && c.snapshot_seen_items > 0,
	};
	mfs_rfile_stats_t st_train, st_test;
	double t_load = mfs_now_s();
	rc = mfs_dataset_load(m, c.train_input, NULL, &lo, &train, &test, &valid, &st_train, &st_test, err, sizeof err);
	if (rc) {
		fprintf(stderr, "mfstream train: %s\n", *err ? err : mfs_strerror(rc));
		goto out;
	}
	if (c.train_item_order == ITEM_ORDER_RANDOM && (rc = items_renumber(m, &train, &valid, &test))) {
		fprintf(stderr, "mfstream train: item rows: %s\n", mfs_strerror(rc));
		goto out;
	}
	if (w && c.snapshot_seen_items > 0) { /* the lists go into the snapshot with the model */
		if ((rc = rated_from_train(&train, m, (uint32_t)c.snapshot_seen_items, &rated))) {
			fprintf(stderr, "mfstream train: rated items: %s\n", mfs_strerror(rc));
			goto out;
		}
		free(train.ts); /* the times served only this */
		train.ts = NULL;
		train.keep_ts = 0;
	}
	t_load = mfs_now_s() - t_load;
	mfs_info("train", "msg=\"data loaded\" file=%s format=%s lines=%llu train=%zu validation=%zu test=%zu rejected=%llu users=%u items=%u mu=%.4f seconds=%.2f",
	         c.train_input, mfs_rfmt_name(st_train.format), (unsigned long long)st_train.lines, train.n, valid.n,
	         test.n, (unsigned long long)st_train.rejected, m->n_users, m->n_items, m->mu, t_load);

	/* engine */
	mfs_engine_conf_t ec;
	if ((rc = mfs_engine_conf_from(&c, &ec, err, sizeof err)) || (rc = mfs_engine_open(&ec, m, &e, err, sizeof err))) {
		fprintf(stderr, "mfstream train: engine: %s\n", *err ? err : mfs_strerror(rc));
		goto out;
	}
	mfs_lr_t lr;
	mfs_lr_conf_t lc;
	mfs_lr_conf_from(&c, c.lr_schedule, &lc);
	mfs_lr_init(&lr, &lc);
	mfs_hparams_t hp;
	mfs_hparams_from(&c, lr.lr, &hp);
	mfs_batch_t bt = mfs_ratings_batch(&train), bv = mfs_ratings_batch(&valid);
	if ((rc = mfs_engine_set_hparams(e, &hp)) || (rc = mfs_engine_resident_load(e, &bt, &strain)) ||
	    (valid.n && (rc = mfs_engine_resident_load(e, &bv, &svalid)))) {
		fprintf(stderr, "mfstream train: engine: %s\n", mfs_strerror(rc));
		goto out;
	}
	const int trace = c.train_trace_test;
	if (trace && (rc = trace_test_load(&c, m, &lo, e, &test, &st_test, &stest, err, sizeof err))) {
		fprintf(stderr, "mfstream train: test (train.trace_test): %s\n", *err ? err : mfs_strerror(rc));
		goto out;
	}

	char held[64];
	if (test_file && !trace)
		snprintf(held, sizeof held, "a test file");
	else
		snprintf(held, sizeof held, "%zu test", test.n);
	printf("mfstream train: %zu train / %zu validation / %s ratings, %u users x %u items, k=%d, engine=%s, lr=%g (%s)\n",
	       train.n, valid.n, held, m->n_users, m->n_items, m->k, mfs_engine_name(e), lr.lr,
	       mfs_conf_enum_name("lr.schedule", c.lr_schedule));
	printf("%5s %8s %10s %10s %10s %10s %8s%s\n", "epoch", "time_s", "updates/s", "train_rmse", "valid_rmse", "lr",
	       "eta", trace ? "  test_rmse" : "");
	fflush(stdout);

	double t_train = 0, best = INFINITY, last_train = NAN, best_loss_train = NAN;
	mfs_loss_t lt = {0}, lv = {0}, ltest = {0};
	int best_epoch = 0, bad = 0, epochs = 0;
	for (int ep = 1; ep <= c.train_epochs; ep++) {
		double t0 = mfs_now_s();
		if ((rc = mfs_engine_sgd_epoch(e, strain, (uint64_t)ep))) {
			fprintf(stderr, "mfstream train: epoch %d: %s\n", ep, mfs_strerror(rc));
			goto out;
		}
		double dt = mfs_now_s() - t0;
		t_train += dt;
		epochs = ep;
		if ((rc = mfs_engine_loss_resident(e, strain, &lt)) || (svalid && (rc = mfs_engine_loss_resident(e, svalid, &lv))) ||
		    (stest && (rc = mfs_engine_loss_resident(e, stest, &ltest)))) {
			fprintf(stderr, "mfstream train: loss pass: %s\n", mfs_strerror(rc));
			goto out;
		}
		if (!isfinite(lt.rmse)) {
			fprintf(stderr, "mfstream train: training diverged at epoch %d (RMSE %g); lower sgd.lr (now %g)\n",
			        ep, lt.rmse, (double)hp.lr);
			goto out;
		}
		last_train = lt.rmse;
		double used_lr = hp.lr;
		mfs_hparams_from(&c, mfs_lr_update(&lr, lt.rmse), &hp);
		if ((rc = mfs_engine_set_hparams(e, &hp)))
			goto out;
		char rate[32], eta[32], trs[16], vas[16];
		fmt_rate(rate, sizeof rate, (double)train.n / dt);
		fmt_eta(eta, sizeof eta, t_train / ep * (c.train_epochs - ep));
		snprintf(trs, sizeof trs, "%.4f", lt.rmse);
		snprintf(vas, sizeof vas, svalid ? "%.4f" : "-", lv.rmse);
		printf("%5d %8.3f %10s %10s %10s %10.3g %8s", ep, dt, rate, trs, vas, used_lr, eta);
		if (trace) { /* printed only: selection and stopping below look at validation alone */
			char tes[16] = "-";
			if (stest)
				snprintf(tes, sizeof tes, "%.4f", ltest.rmse);
			printf(" %10s", tes);
		}
		printf("\n");
		fflush(stdout);
		if (svalid) { /* model selection and early stopping on validation, never on the test */
			if (lv.rmse < best - 1e-6) {
				best = lv.rmse;
				best_epoch = ep;
				best_loss_train = lt.rmse;
				bad = 0;
				if ((rc = mfs_engine_sync(e)) || (rc = save_model(&best_model, m))) {
					fprintf(stderr, "mfstream train: keeping the best model: %s\n", mfs_strerror(rc));
					goto out;
				}
			} else if (c.train_patience && !mfs_lr_holding(&lr) && ++bad >= c.train_patience) {
				/* (epochs of a start off a plateau are not counted: the loss may rise before it falls) */
				printf("early stop: validation RMSE has not improved for %d epochs (best %.4f at epoch %d)\n", bad,
				       best, best_epoch);
				break;
			}
		}
	}
	if ((rc = mfs_engine_sync(e)))
		goto out;
	if (best_model.P && best_epoch != epochs) { /* the best validation epoch's model is the one kept */
		restore_model(&best_model, m);
		last_train = best_loss_train;
	}

	printf("done: %d epochs, %.2f s training, %s updates/s, train RMSE %.4f", epochs, t_train,
	       (fmt_rate(err, sizeof err, (double)train.n * epochs / (t_train > 0 ? t_train : 1)), err), last_train);
	if (svalid)
		printf(", validation RMSE %.4f (the model of epoch %d)", best, best_epoch);
	printf("\n");
	err[0] = '\0';
	/* the test, once, at the end, on the model kept */
	if (test_file && !trace && (rc = mfs_dataset_load_test(m, c.train_test, &lo, &test, &st_test, err, sizeof err))) {
		fprintf(stderr, "mfstream train: %s\n", *err ? err : mfs_strerror(rc));
		goto out;
	}
	if (test.n) {
		mfs_loss_t ls;
		if ((rc = score_host(&c, m, &test, &ls, err, sizeof err))) {
			fprintf(stderr, "mfstream train: test: %s\n", *err ? err : mfs_strerror(rc));
			goto out;
		}
		printf("test: %zu ratings, test RMSE %.4f MAE %.4f\n", test.n, ls.rmse, ls.mae);
	}
	fflush(stdout);

	/* snapshots */
	if (w) {
		mfs_snap_info_t info = {.learning_rate = hp.lr, .last_loss = last_train, .rating_min = c.rating_min,
		                        .rating_max = c.rating_max, .replace = c.snapshot_mode == SNAP_MODE_REPLACE,
		                        .rated = rated, .rated_merge = 0};
		uint64_t seq = 0;
		double t0 = mfs_now_s();
		if ((rc = mfs_snap_publish(w, m, &info, &seq, err, sizeof err))) {
			fprintf(stderr, "mfstream train: snapshot: %s\n", *err ? err : mfs_strerror(rc));
			goto out;
		}
		double dt = mfs_now_s() - t0;
		mfs_snap_existing_t now;
		if (c.snapshot_mode == SNAP_MODE_APPEND && mfs_snap_writer_existing(w, &now, err, sizeof err) == 0)
			printf("published snapshot seq=%llu to %s (%u users, %u items written; it holds %llu users, %llu items, "
			       "%.2f s)\n", (unsigned long long)seq, c.snapshot_dir, m->n_users, m->n_items,
			       (unsigned long long)now.n_users, (unsigned long long)now.n_items, dt);
		else
			printf("published snapshot seq=%llu to %s (%u users, %u items, %.2f s)\n", (unsigned long long)seq,
			       c.snapshot_dir, m->n_users, m->n_items, dt);
	} else {
		printf("no snapshot.dir given: the model was not published\n");
	}
	exit_code = 0;
out:
	mfs_snap_writer_close(w);
	mfs_snap_rated_free(rated);
	if (e) {
		mfs_engine_resident_free(e, strain);
		mfs_engine_resident_free(e, svalid);
		mfs_engine_resident_free(e, stest);
	}
	mfs_engine_close(e);
	free_saved(&best_model);
	mfs_ratings_free(&train);
	mfs_ratings_free(&valid);
	mfs_ratings_free(&test);
	mfs_model_free(m);
	mfs_conf_free(&c);
	return exit_code;
}
