/* test_cuda_first_launch.c - kernels launched for the first time while the persistent kernel
 * runs. CUDA loads a kernel's code at its first launch (lazy loading, the default since CUDA
 * 12.2), and that load may wait for the device to be idle, which it never is while the
 * persistent kernel runs. serve hung that way in the launch of the kernel that draws new rows
 * (the first batch with a new user after a restart from a snapshot, test_serve_kill9 on the
 * CUDA engine); the engine now loads every kernel it may launch beside the ring when it opens
 * (gpu/cuda/ring.cu pk_load_beside).
 *
 * A process of its own, so that no earlier test has loaded those kernels. For fp32 then fp16
 * storage (different kernels): the persistent kernel is started by a batch over rows the host
 * drew, then, with it running, rows drawn on the device (within the device table's capacity,
 * so nothing stops the kernel), a batch that trains them, a rows reset and a capture. A hang is
 * the failure: an alarm ends the test with a message. Exits 77 where no CUDA device answers. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "gpu/engine.h"
#include "model_store/store.h"
#include "testhelp.h"
#include "model_help.h"

#define LIMIT_S 120 /* the whole test takes about a second (two engines opened) */
#define STR_(x) #x
#define STR(x) STR_(x)

static void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] = "FAIL: not done after " STR(LIMIT_S) " s: a kernel launched beside the running "
	                          "persistent kernel never started (not loaded before it ran?)\n";
	if (write(2, msg, sizeof msg - 1) < 0) {
	}
	_exit(1);
}

static void first_launches(int fp16)
{
	const int k = 32;
	const uint32_t n0 = 1000, i0 = 300, n1 = 1020, i1 = 310; /* the device tables hold 1024 */
	mfs_model_conf_t mc = {k, 0.1, 3};
	mfs_model_t *m;
	TEST_OK(mfs_model_init(&mc, &m));
	for (uint32_t u = 0; u < n0; u++)
		add_user(m, mfs_id_u64(u));
	for (uint32_t i = 0; i < i0; i++)
		add_item(m, mfs_id_u64(i));
	mfs_engine_conf_t ec = {MFS_ENGINE_CUDA, 1, 0, 0, 1, fp16 ? MFS_DTYPE_FP16 : MFS_DTYPE_FP32, 1, 1};
	mfs_engine_t *e = NULL;
	char err[256];
	TEST_ASSERT_MSG(mfs_engine_open(&ec, m, &e, err, sizeof err) == 0, "open cuda: %s", err);
	int taken = 0;
	TEST_OK(mfs_engine_take_new_rows(e, &taken));
	TEST_EQ_INT(taken, 1);
	mfs_hparams_t hp = {0.05f, 0.0f, 0.0f, 0.0f, 0.0f, -INFINITY, INFINITY};
	TEST_OK(mfs_engine_set_hparams(e, &hp));
	m->mu = 0;
	const size_t nb = 4096;
	uint32_t *u = malloc(nb * sizeof *u), *it = malloc(nb * sizeof *it);
	float *r = malloc(nb * sizeof *r), *du = malloc((size_t)(n1 - n0) * (1 + k) * sizeof *du);
	TEST_ASSERT(u && it && r && du);
	for (size_t x = 0; x < nb; x++)
		u[x] = (uint32_t)(x % n0), it[x] = (uint32_t)(x % i0), r[x] = 1.0f;
	mfs_batch_t b = {u, it, r, nb};
	TEST_OK(mfs_engine_sgd(e, &b)); /* launches the persistent kernel */
	/* new rows, drawn on the device while it runs */
	for (uint32_t x = n0; x < n1; x++)
		add_user(m, mfs_id_u64(x));
	for (uint32_t x = i0; x < i1; x++)
		add_item(m, mfs_id_u64(x));
	TEST_OK(mfs_engine_grow(e));
	for (size_t x = 0; x < nb; x++)
		u[x] = n0 + (uint32_t)(x % (n1 - n0)), it[x] = i0 + (uint32_t)(x % (i1 - i0));
	TEST_OK(mfs_engine_sgd(e, &b));
	/* a rows reset and a capture beside it (their buffers' first allocation stops the kernel
	 * today; the next batch relaunches it, then they run beside it) */
	const uint32_t reset[2] = {1, 2};
	TEST_OK(mfs_engine_reset_rows(e, 0, reset, 2, 0));
	TEST_OK(mfs_engine_sgd(e, &b));
	uint32_t rows[20];
	for (uint32_t x = 0; x < n1 - n0; x++)
		rows[x] = n0 + x;
	TEST_OK(mfs_engine_capture(e, rows, n1 - n0, du, NULL, 0, NULL));
	TEST_OK(mfs_engine_capture_wait(e));
	TEST_OK(mfs_engine_sgd(e, &b));
	TEST_OK(mfs_engine_reset_rows(e, 0, reset, 2, 0));
	TEST_OK(mfs_engine_capture(e, rows, n1 - n0, du, NULL, 0, NULL));
	TEST_OK(mfs_engine_capture_wait(e));
	TEST_OK(mfs_engine_drain(e));
	/* the new rows were drawn and trained: a moved, finite bias and finite factors */
	size_t ok = 0;
	for (uint32_t x = 0; x < n1 - n0; x++) {
		const float *row = du + (size_t)x * (1 + k);
		int good = row[0] != 0.0f && isfinite(row[0]);
		for (int j = 1; j <= k; j++)
			good &= isfinite(row[j]) && fabsf(row[j]) < 10.0f;
		ok += good;
	}
	TEST_ASSERT_MSG(ok == n1 - n0, "fp16=%d: %zu of %u new rows drawn and trained", fp16, ok, n1 - n0);
	mfs_engine_close(e);
	mfs_model_free(m);
	free(u), free(it), free(r), free(du);
}

static void test_first_launches_fp32(void) { first_launches(0); }
static void test_first_launches_fp16(void) { first_launches(1); }

int main(void)
{
	if (!mfs_engine_cuda_available())
		TEST_SKIP("no CUDA device answers (or the CUDA engine is not built)");
	signal(SIGALRM, on_alarm);
	alarm(LIMIT_S);
	TEST_RUN(test_first_launches_fp32);
	TEST_RUN(test_first_launches_fp16);
	return TEST_REPORT();
}
