/* serve.c - see serve.h: `mfstream serve` wired from its stages.
 *
 * DESIGN: two threads and a queue. This (the calling) thread runs the consumer loop
 * (serve/consumer.c: Kafka -> validated events -> batches of whole messages); the learner
 * thread (serve/learner.c) owns model, engine and snapshots and applies the batches in order;
 * the bounded queue between them (serve/batcher.h) is the backpressure. The HTTP thread
 * (ops/http.h) answers /metrics, /healthz and /readyz from what the learner publishes about
 * itself (the scrape hook). Start order: queue, metrics, learner (loads the snapshot), consumer
 * (resumes at the snapshot's offsets), learner thread (opens the engine). Stop: a final barrier
 * (the learner applies everything polled and publishes), then the consumer leaves the group.
 */
#include "serve/serve.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/timeutil.h"
#include "ops/catalog.h"
#include "ops/http.h"
#include "ops/metrics.h"
#include "serve/batcher.h"
#include "serve/consumer.h"
#include "serve/learner.h"

typedef struct svc {
	const mfs_conf_t *c;
	mfs_batchq_t queue;
	mfs_learner_t *l;
	mfs_metrics_t *reg;
	mfs_catalog_t cat;
} svc_t;

/* At every scrape (HTTP thread, under the registry's render lock): copy what the learner
 * publishes about itself. Counters restored from the snapshot (rejections, events) are set,
 * so they continue across restarts like the snapshot's own. */
static void scrape_hook(mfs_metrics_t *r, void *ctx)
{
	(void)r;
	svc_t *s = ctx;
	mfs_catalog_t *c = &s->cat;
	mfs_learner_stats_t st;
	mfs_learner_get_stats(s->l, &st);
	mfs_counter_set(c->events_applied, st.events_applied);
	mfs_counter_set(c->updates, st.events_applied + st.events_replayed);
	mfs_counter_set(c->events_held_out, st.events_held_out);
	for (int j = 0; j < MFS_REJ__COUNT && j < MFS_CAT_FIXED_MAX; j++)
		mfs_counter_set(c->messages_rejected_at[j], st.rejected[j]);
	mfs_gauge_set(c->learning_rate, st.lr);
	mfs_gauge_set(c->window_rmse, st.window_rmse);
	mfs_gauge_set(c->holdout_rmse, st.holdout_rmse);
	mfs_gauge_set(c->prequential_rmse, st.prequential_rmse);
	mfs_gauge_set(c->prequential_window_rmse, st.prequential_window_rmse);
	mfs_counter_set(c->replayed_events, st.events_replayed);
	mfs_counter_set(c->events_dropped, st.events_dropped);
	mfs_counter_set(c->ids_not_admitted_at[MFS_CAT_USERS], st.not_admitted[0]);
	mfs_counter_set(c->ids_not_admitted_at[MFS_CAT_ITEMS], st.not_admitted[1]);
	mfs_gauge_set(c->replay_owed_events, st.replay_owed);
	mfs_gauge_set(c->learner_stalled_seconds, mfs_learner_stalled_s(s->l, NULL));
	mfs_gauge_set(c->prequential_cumulative_rmse, st.prequential_cumulative_rmse);
	for (int j = 0; j < MFS_LPH__COUNT && j < MFS_CAT_FIXED_MAX; j++)
		mfs_gauge_set(c->learner_seconds_at[j], st.phase_s[j]);
	for (int j = 0; j < MFS_LRS__COUNT && j < MFS_CAT_FIXED_MAX; j++)
		mfs_gauge_set(c->learner_rows_seconds_at[j], st.rows_step_s[j]);
	mfs_counter_set(c->learner_rows_ahead_batches, st.rows_ahead_batches);
	mfs_counter_set(c->exchange_published_rows, st.xch_published_rows);
	mfs_counter_set(c->exchange_merged_rows, st.xch_merged_rows);
	mfs_counter_set(c->exchange_items_added, st.xch_items_added);
	mfs_counter_set(c->exchange_bad_messages, st.xch_bad_messages);
	mfs_counter_set(c->exchange_produce_errors, st.xch_produce_errors);
	mfs_gauge_set(c->model_rows_at[MFS_CAT_USERS], st.live_users);
	mfs_gauge_set(c->model_rows_at[MFS_CAT_ITEMS], st.live_items);
	const int tab[2] = {MFS_CAT_USERS, MFS_CAT_ITEMS};
	for (int e = 0; e < 2; e++) {
		mfs_counter_set(c->ids_evicted_at[tab[e]], st.evicted[e]);
		mfs_counter_set(c->ids_expired_at[tab[e]], st.expired[e]);
		mfs_counter_set(c->ids_deleted_at[tab[e]], st.deleted[e]);
	}
	mfs_gauge_set(c->model_capacity_rows_at[MFS_CAT_USERS], st.cap_users);
	mfs_gauge_set(c->model_capacity_rows_at[MFS_CAT_ITEMS], st.cap_items);
	mfs_counter_set(c->snapshots, st.snapshots);
	if (st.snap_wall_s > 0) {
		mfs_gauge_set(c->snapshot_sequence, (double)st.snap_seq);
		mfs_gauge_set(c->snapshot_timestamp, st.snap_wall_s);
		mfs_gauge_set(c->snapshot_age, (double)mfs_wall_ms() / 1000.0 - st.snap_wall_s);
		mfs_gauge_set(c->snapshot_rows_at[MFS_CAT_USERS], (double)st.snap_users);
		mfs_gauge_set(c->snapshot_rows_at[MFS_CAT_ITEMS], (double)st.snap_items);
	}
	mfs_gauge_set(c->ring_batches_queued, (double)mfs_batchq_fill(&s->queue));
	mfs_gauge_set(c->ring_batches_capacity, (double)s->c->serve_ring_batches);
	mfs_gauge_set(c->gpu_memory_used, st.gpu_mem_used);
	mfs_gauge_set(c->gpu_memory_total, st.gpu_mem_total);
}

/* The stop's deadline (serve.stop_deadline_ms): armed once the final snapshot is published or
 * a fatal error is seen, when nothing is left that a restart could not redo. A client library
 * that never returns (librdkafka's destroy with a broker gone, a wedged device) must not keep
 * an orchestrator from restarting the process: past the deadline this thread says so and
 * ends the process with the status it was going to have. */
typedef struct deadline {
	int64_t ms;
	int status;
} deadline_t;

static void *deadline_main(void *arg)
{
	const deadline_t d = *(deadline_t *)arg;
	free(arg);
	mfs_thread_name("mfs-deadline");
	mfs_sleep_ms((int)d.ms);
	mfs_error("serve", "msg=\"stop did not finish in time: exiting now\" waited_ms=%" PRId64 " exit_status=%d "
	                   "detail=\"serve.stop_deadline_ms; what is published is all a restart needs\"",
	          d.ms, d.status);
	_exit(d.status);
}

static void deadline_arm(int64_t ms, int status)
{
	deadline_t *d = malloc(sizeof *d);
	pthread_t t;
	if (!d)
		return;
	*d = (deadline_t){ms, status};
	if (pthread_create(&t, NULL, deadline_main, d)) {
		free(d);
		return;
	}
	pthread_detach(t);
}

const char *mfs_signal_name(int sig)
{
	switch (sig) {
	case SIGHUP: return "SIGHUP";
	case SIGINT: return "SIGINT";
	case SIGQUIT: return "SIGQUIT";
	case SIGTERM: return "SIGTERM";
	case SIGUSR1: return "SIGUSR1";
	case SIGUSR2: return "SIGUSR2";
	default: {
		static char buf[24];
		snprintf(buf, sizeof buf, "signal %d", sig);
		return buf;
	}
	}
}

int mfs_serve_run(const mfs_conf_t *c, const mfs_serve_opts_t *o, volatile sig_atomic_t *stop, char *errstr,
                  size_t es)
{
	svc_t s;
	memset(&s, 0, sizeof s);
	s.c = c;
	mfs_consumer_t *cons = NULL;
	mfs_http_t *http = NULL;
	int rc, queue_ok = 0, learner_done = 0, hooked = 0;
	if ((rc = mfs_fault_arm(c->test_fault, errstr, es)))
		return rc;
	if ((rc = mfs_batchq_init(&s.queue, (size_t)c->serve_ring_batches, mfs_consumer_keep_free))) {
		mfs_errf(errstr, es, rc, "queue: %s", mfs_strerror(rc));
		goto out;
	}
	queue_ok = 1;
	/* metrics first: /healthz answers while the snapshot loads */
	if ((rc = mfs_metrics_init(&s.reg)) || (rc = mfs_catalog_register(s.reg, &s.cat, errstr, es))) {
		mfs_errf(errstr, es, rc, "metrics: %s", mfs_strerror(rc));
		goto out;
	}
	if (*c->metrics_listen) {
		mfs_http_opts_t ho = {s.reg, c->metrics_healthz_stale_ms};
		if ((rc = mfs_http_open(c->metrics_listen, &ho, &http, errstr, es)))
			goto out;
		mfs_info("serve", "msg=\"metrics listening\" listen=%s port=%d", c->metrics_listen, mfs_http_port(http));
	}
	/* recovery: the learner loads the snapshot; partitions resume at its offsets */
	if ((rc = mfs_learner_open(c, &s.queue, &s.l, errstr, es)))
		goto out;
	mfs_consumer_opts_t co = {o->brokers, o->topics, o->n_topics, o->embedded, &s.queue, mfs_learner_loaded(s.l),
	                          &s.cat, http};
	if ((rc = mfs_consumer_open(c, &co, &cons, errstr, es)))
		goto out;
	mfs_learner_set_metrics(s.l, &s.cat);
	if ((rc = mfs_learner_set_brokers(s.l, o->brokers))) {
		mfs_errf(errstr, es, rc, "out of memory");
		goto out;
	}
	if ((rc = mfs_learner_start(s.l, mfs_consumer_commit, cons, errstr, es)))
		goto out;
	mfs_catalog_set_build_info(&s.cat, NULL, mfs_learner_engine_name(s.l));
	if ((rc = mfs_metrics_add_hook(s.reg, scrape_hook, &s))) {
		mfs_errf(errstr, es, rc, "metrics: %s", mfs_strerror(rc));
		goto out;
	}
	hooked = 1;
	mfs_info("serve", "msg=started engine=%s topics=%zu batch=%" PRId64 " ring=%" PRId64 " snapshot_ms=%" PRId64
	         " holdout_fraction=%g", mfs_learner_engine_name(s.l), o->n_topics, c->serve_batch_size,
	         c->serve_ring_batches, c->serve_snapshot_ms, c->serve_holdout_fraction);

	int fatal = 0;
	/* the learner must end a phase of its loop now and then (twice a second when idle): after
	 * metrics.healthz_stale_ms without one it is stalled (waiting on the device, the snapshot
	 * writer, its pool), said once per such period and when it goes again */
	const double stall_s = c->metrics_healthz_stale_ms > 0 ? (double)c->metrics_healthz_stale_ms / 1000.0 : 0;
	double stall_said = 0, stall_long = 0;
	while (!*stop && !fatal) {
		mfs_http_heartbeat(http);
		const char *lph = NULL;
		const double lst = mfs_learner_stalled_s(s.l, &lph);
		if (stall_said > 0 && lst > stall_long)
			stall_long = lst;
		if (stall_s > 0 && lst >= stall_said + stall_s) { /* first after stall_s, then every stall_s */
			stall_said = stall_long = lst;
			mfs_warn("serve", "msg=\"learner stalled\" seconds=%.0f last_phase=%s detail=\"the learner thread has ended "
			                  "no step for this long; the phase after the one named holds it (docs/OPERATIONS.md, "
			                  "a stalled learner)\"",
			         lst, lph ? lph : "-");
		} else if (stall_said > 0 && lst < stall_s) {
			mfs_info("serve", "msg=\"learner going again\" stalled_s=%.0f", stall_long);
			stall_said = stall_long = 0;
		}
		if (o->ignored && *o->ignored) {
			const int sig = *o->ignored;
			*o->ignored = 0;
			mfs_warn("serve", "msg=\"signal ignored\" signal=%s detail=\"the configuration is read at start only: "
			                  "restart to change it; SIGTERM or SIGINT stop\"",
			         mfs_signal_name(sig));
		}
		if ((fatal = mfs_consumer_step(cons)))
			break;
		if (mfs_batchq_failed(&s.queue)) { /* the learner stopped: do not wait for a message to find out */
			fatal = EPIPE;
			break;
		}
		if (c->serve_exit_at_end && mfs_consumer_all_at_end(cons)) {
			uint64_t msgs, pauses;
			size_t parts;
			mfs_consumer_counts(cons, &msgs, &pauses, &parts);
			mfs_info("serve", "msg=\"every assigned partition read to its end: stopping (serve.exit_at_end)\" "
			                  "partitions=%zu",
			         parts);
			break;
		}
	}
	if (fatal) {
		char err[1024];
		rc = fatal;
		snprintf(err, sizeof err, "%s", *mfs_consumer_error(cons) ? mfs_consumer_error(cons) : mfs_strerror(rc));
		if (rc == EPIPE) /* the learner failed: its error is the cause */
			rc = mfs_learner_join(s.l, err, sizeof err);
		/* 503 with the cause for as long as the process lives: the HTTP server closes last */
		mfs_http_set_fatal(http, err);
		mfs_error("serve", "msg=\"fatal error: stopping\" err=\"%s\" exit_status=1 detail=\"nothing past the last "
		                   "published snapshot is committed; a restart resumes from it\"",
		          err);
		deadline_arm(c->serve_stop_deadline_ms, 1);
		if (c->test_fatal_linger_ms)
			mfs_sleep_ms(c->test_fatal_linger_ms);
		learner_done = 1;
		mfs_consumer_learner_done(cons);
		mfs_errf(errstr, es, rc ? rc : MFS_EINVAL, "%s", err);
		rc = rc ? rc : MFS_EINVAL;
		goto out;
	}
	if (*stop)
		mfs_info("serve", "msg=stopping signal=%s detail=\"applying what was polled, final snapshot, commit\"",
		         mfs_signal_name((int)*stop));
	/* shutdown: stop polling, let the learner apply everything and publish, commit, close */
	rc = mfs_consumer_barrier(cons, MFS_EBATCH_FINAL);
	learner_done = 1;
	mfs_consumer_learner_done(cons);
	int jrc = mfs_learner_join(s.l, errstr, es);
	if (rc || jrc) {
		if (!jrc)
			mfs_errf(errstr, es, rc, "final snapshot: %s", mfs_strerror(rc));
		rc = jrc ? jrc : rc;
		mfs_http_set_fatal(http, errstr);
		mfs_error("serve", "msg=\"fatal error at the final snapshot\" err=\"%s\" exit_status=1", errstr);
		deadline_arm(c->serve_stop_deadline_ms, 1);
		goto out;
	}
	deadline_arm(c->serve_stop_deadline_ms, 0); /* the final snapshot is published */
	mfs_consumer_close(cons);
	mfs_learner_stats_t st;
	mfs_learner_get_stats(s.l, &st);
	uint64_t msgs, pauses;
	size_t parts;
	mfs_consumer_counts(cons, &msgs, &pauses, &parts);
	mfs_info("serve", "msg=stopped events_applied=%" PRIu64 " held_out=%" PRIu64 " messages=%" PRIu64
	         " snapshots=%" PRIu64 " pauses=%" PRIu64 " latency_p50_ms=%.1f latency_p99_ms=%.1f applied_p50_ms=%.1f"
	         " applied_p99_ms=%.1f",
	         st.events_applied, st.events_held_out, msgs, st.snapshots, pauses, st.lat_p50_ms, st.lat_p99_ms,
	         st.applied_p50_ms, st.applied_p99_ms);
	rc = 0;
out:
	if (hooked) /* it reads the learner and the queue, which go first; /healthz keeps answering */
		mfs_metrics_remove_hook(s.reg, scrape_hook, &s);
	if (s.l && !learner_done && queue_ok)
		mfs_batchq_close(&s.queue);
	mfs_learner_close(s.l); /* joins the thread if it still runs */
	if (queue_ok) /* its batches' messages first: librdkafka wants them released before its handle */
		mfs_batchq_destroy(&s.queue);
	mfs_consumer_free(cons);
	mfs_http_close(http); /* last: a fatal error's 503 stays visible until the process ends */
	mfs_metrics_free(s.reg);
	return rc;
}
