/* cmd_train.c - `mfstream train`: offline training from a ratings file, then publish a snapshot.
 *
 * The path is the service's, minus Kafka: ingest (file reader) -> model_store (ids to rows)
 * -> engine (epochs of SGD, full-pass loss, learning-rate controller) -> snapshots (one LMDB
 * write transaction). Progress is a table on stdout, one row per epoch; logs go to stderr.
 */
#include <math.h>
#include <stdio.h>
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

static void usage(void)
{
	fprintf(stderr, "usage: mfstream train --input FILE [--test FILE] --snapshot DIR [--k N] [--epochs N]\n"
	                "                      [--lr X] [--engine auto|cpu|cuda] [--threads N] [--key value ...]\n");
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

int mfs_cmd_train(int argc, char **argv)
{
	mfs_conf_t c;
	int n_pos;
	char *pos[1];
	if (mfs_cmd_conf("train", argc - 1, argv + 1, train_aliases, &c, pos, 0, &n_pos))
		return 2;
	int exit_code = 1, rc;
	char err[1024] = "";
	mfs_model_t *m = NULL;
	mfs_engine_t *e = NULL;
	mfs_resident_t *strain = NULL, *stest = NULL;
	mfs_snap_writer_t *w = NULL;
	mfs_ratings_t train = {0}, test = {0};

	if (!*c.train_input) {
		fprintf(stderr, "mfstream train: --input FILE (train.input) is required\n");
		usage();
		exit_code = 2;
		goto out;
	}
	if (c.rating_min >= c.rating_max) {
		fprintf(stderr, "mfstream train: rating.min (%g) must be below rating.max (%g)\n", c.rating_min,
		        c.rating_max);
		exit_code = 2;
		goto out;
	}
	mfs_model_conf_t mc;
	mfs_model_conf_from(&c, &mc);
	if ((rc = mfs_model_init(&mc, &m))) {
		fprintf(stderr, "mfstream train: model: %s\n", mfs_strerror(rc));
		goto out;
	}

	/* ingest -> model_store */
	mfs_load_opts_t lo = {
		.file = {.format = c.input_format, .fail_on_error = c.input_on_error == 1,
		         .rating_min = c.rating_min, .rating_max = c.rating_max, .max_reported = 10},
		.test_fraction = *c.train_test ? 0.0 : c.train_test_fraction,
		.split_seed = (uint64_t)c.train_split_seed,
	};
	mfs_rfile_stats_t st_train, st_test;
	double t_load = mfs_now_s();
	rc = mfs_dataset_load(m, c.train_input, *c.train_test ? c.train_test : NULL, &lo, &train, &test, &st_train,
	                      &st_test, err, sizeof err);
	if (rc) {
		fprintf(stderr, "mfstream train: %s\n", *err ? err : mfs_strerror(rc));
		goto out;
	}
	t_load = mfs_now_s() - t_load;
	mfs_info("train", "msg=\"data loaded\" file=%s format=%s lines=%llu train=%zu test=%zu rejected=%llu users=%u items=%u mu=%.4f seconds=%.2f",
	         c.train_input, mfs_rfmt_name(st_train.format), (unsigned long long)st_train.lines, train.n, test.n,
	         (unsigned long long)(st_train.rejected + (*c.train_test ? st_test.rejected : 0)), m->n_users, m->n_items,
	         m->mu, t_load);

	/* engine */
	mfs_engine_conf_t ec;
	mfs_engine_conf_from(&c, &ec);
	if ((rc = mfs_engine_open(&ec, m, &e, err, sizeof err))) {
		fprintf(stderr, "mfstream train: engine: %s\n", *err ? err : mfs_strerror(rc));
		goto out;
	}
	mfs_lr_t lr;
	mfs_lr_conf_t lc;
	mfs_lr_conf_from(&c, c.lr_schedule, &lc);
	mfs_lr_init(&lr, &lc);
	mfs_hparams_t hp;
	mfs_hparams_from(&c, lr.lr, &hp);
	mfs_batch_t bt = mfs_ratings_batch(&train), bs = mfs_ratings_batch(&test);
	if ((rc = mfs_engine_set_hparams(e, &hp)) || (rc = mfs_engine_resident_load(e, &bt, &strain)) ||
	    (test.n && (rc = mfs_engine_resident_load(e, &bs, &stest)))) {
		fprintf(stderr, "mfstream train: engine: %s\n", mfs_strerror(rc));
		goto out;
	}

	printf("mfstream train: %zu train / %zu test ratings, %u users x %u items, k=%d, engine=%s, lr=%g (%s)\n",
	       train.n, test.n, m->n_users, m->n_items, m->k, mfs_engine_name(e), lr.lr,
	       mfs_conf_enum_name("lr.schedule", c.lr_schedule));
	printf("%5s %8s %10s %10s %10s %10s %10s %8s\n", "epoch", "time_s", "updates/s", "train_rmse", "test_rmse",
	       "test_mae", "lr", "eta");
	fflush(stdout);

	double t_train = 0, best = INFINITY, last_train = NAN;
	mfs_loss_t lt = {0}, ls = {0};
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
		if ((rc = mfs_engine_loss_resident(e, strain, &lt)) || (stest && (rc = mfs_engine_loss_resident(e, stest, &ls)))) {
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
		char rate[32], eta[32], trs[16], tes[16], tem[16];
		fmt_rate(rate, sizeof rate, (double)train.n / dt);
		fmt_eta(eta, sizeof eta, t_train / ep * (c.train_epochs - ep));
		snprintf(trs, sizeof trs, "%.4f", lt.rmse);
		snprintf(tes, sizeof tes, stest ? "%.4f" : "-", ls.rmse);
		snprintf(tem, sizeof tem, stest ? "%.4f" : "-", ls.mae);
		printf("%5d %8.2f %10s %10s %10s %10s %10.3g %8s\n", ep, dt, rate, trs, tes, tem, used_lr, eta);
		fflush(stdout);
		if (stest) {
			if (ls.rmse < best - 1e-6) {
				best = ls.rmse;
				best_epoch = ep;
				bad = 0;
			} else if (c.train_patience && ++bad >= c.train_patience) {
				printf("early stop: test RMSE has not improved for %d epochs (best %.4f at epoch %d)\n", bad, best,
				       best_epoch);
				break;
			}
		}
	}
	if ((rc = mfs_engine_sync(e)))
		goto out;

	printf("done: %d epochs, %.2f s training, %s updates/s, train RMSE %.4f", epochs, t_train,
	       (fmt_rate(err, sizeof err, (double)train.n * epochs / (t_train > 0 ? t_train : 1)), err), last_train);
	if (stest)
		printf(", test RMSE %.4f MAE %.4f (best %.4f at epoch %d)", ls.rmse, ls.mae, best, best_epoch);
	printf("\n");
	err[0] = '\0';

	/* snapshots */
	if (*c.snapshot_dir) {
		if ((rc = mfs_snap_writer_open_sync(c.snapshot_dir, (size_t)c.snapshot_map_size,
		                                    (mfs_snap_sync_t)c.snapshot_sync, &w, err, sizeof err))) {
			fprintf(stderr, "mfstream train: snapshot: %s\n", *err ? err : mfs_strerror(rc));
			goto out;
		}
		mfs_snap_info_t info = {.learning_rate = hp.lr, .last_loss = last_train, .rating_min = c.rating_min,
		                        .rating_max = c.rating_max};
		uint64_t seq = 0;
		double t0 = mfs_now_s();
		if ((rc = mfs_snap_publish(w, m, &info, &seq, err, sizeof err))) {
			fprintf(stderr, "mfstream train: snapshot: %s\n", *err ? err : mfs_strerror(rc));
			goto out;
		}
		printf("published snapshot seq=%llu to %s (%u users, %u items, %.2f s)\n", (unsigned long long)seq,
		       c.snapshot_dir, m->n_users, m->n_items, mfs_now_s() - t0);
	} else {
		printf("no snapshot.dir given: the model was not published\n");
	}
	exit_code = 0;
out:
	mfs_snap_writer_close(w);
	if (e) {
		mfs_engine_resident_free(e, strain);
		mfs_engine_resident_free(e, stest);
	}
	mfs_engine_close(e);
	mfs_ratings_free(&train);
	mfs_ratings_free(&test);
	mfs_model_free(m);
	mfs_conf_free(&c);
	return exit_code;
}
