/* cumf_rmse.c - the test RMSE of a cuMF_SGD model, as cuMF's own test/mf-predict computes it
 * (bench/side_by_side.sh; issue 19). cuMF_SGD prints no RMSE while it trains.
 *
 *   cumf_rmse [-c LO,HI] MODEL TEST.bin
 *
 * MODEL (cuMF's save_model): i32 fun, i32 m, i32 n, i32 k, f32 b, then m*k f32 (P, row per
 * user) and n*k f32 (Q, row per item), native byte order. cuMF trains on scaled ratings and scales
 * the factors back before saving, and it has no biases: the prediction is p_u . q_v alone.
 * TEST.bin: cuMF's headerless input records {i32 u, i32 v, f32 r} (bench/cumf_split.c).
 *
 * The arithmetic is LIBMF's mf_predict + calc_rmse, which mf-predict calls:
 *   z = std::inner_product(p, p + k, q, 0.0f)     a float sum in index order
 *   z = b  when u or v is outside the model, or z is NaN
 *   e = r - z (float), loss += e * e (a float square added to a double), rmse = sqrt(loss / n)
 * No clipping: cuMF's figure is the unclipped one. mfstream's loss clips its prediction to
 * [rating.min, rating.max]; -c LO,HI adds that figure (rmse_clipped) for comparison.
 * Prints one line of key=value: counts (outside, nan) and the RMSE to 6 decimals.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK 65536

struct crec { /* cuMF's input record */
	int32_t u, v;
	float r;
};
_Static_assert(sizeof(struct crec) == 12, "cuMF records are 12 bytes");

static void usage(FILE *f)
{
	fprintf(f, "usage: cumf_rmse [-c LO,HI] MODEL TEST.bin\n"
	           "Test RMSE of a cuMF_SGD model file on cuMF-format test records, as cuMF's mf-predict computes it;\n"
	           "-c also prints it with predictions clipped to [LO, HI].\n");
}

/* p . q as std::inner_product does it: ((0 + p0 q0) + p1 q1) + ..., in float. */
static float dot_in_order(const float *p, const float *q, long k)
{
	float acc = 0.0f;
	for (long d = 0; d < k; d++)
		acc = acc + p[d] * q[d];
	return acc;
}

int main(int argc, char **argv)
{
	int clip = 0, opt;
	float lo = 0, hi = 0;
	while ((opt = getopt(argc, argv, "c:h")) != -1) {
		switch (opt) {
		case 'c':
			if (sscanf(optarg, "%f,%f", &lo, &hi) != 2 || !(lo < hi)) {
				fprintf(stderr, "cumf_rmse: -c %s: want LO,HI with LO < HI\n", optarg);
				return 2;
			}
			clip = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (argc - optind != 2) {
		usage(stderr);
		return 2;
	}
	const char *model_path = argv[optind], *test_path = argv[optind + 1];
	int ret = 1;
	float *P = NULL, *Q = NULL;
	FILE *tf = NULL, *mf = fopen(model_path, "rb");
	struct crec *rec = malloc(CHUNK * sizeof *rec);
	if (!mf) {
		perror(model_path);
		goto done;
	}
	int32_t hdr[4];
	float b;
	struct stat sb;
	if (fread(hdr, 4, 4, mf) != 4 || fread(&b, 4, 1, mf) != 1 || fstat(fileno(mf), &sb)) {
		fprintf(stderr, "cumf_rmse: %s: short model header\n", model_path);
		goto done;
	}
	const long m = hdr[1], n = hdr[2], k = hdr[3];
	if (m < 0 || n < 0 || k < 1 || (long long)sb.st_size != 20 + ((long long)m + n) * k * 4) {
		fprintf(stderr, "cumf_rmse: %s: m=%ld n=%ld k=%ld does not match its %lld bytes\n", model_path, m, n, k,
		        (long long)sb.st_size);
		goto done;
	}
	P = malloc(((size_t)m * k + 1) * sizeof *P);
	Q = malloc(((size_t)n * k + 1) * sizeof *Q);
	if (!P || !Q || !rec) {
		fprintf(stderr, "cumf_rmse: out of memory (m=%ld n=%ld k=%ld)\n", m, n, k);
		goto done;
	}
	if (fread(P, sizeof *P, (size_t)m * k, mf) != (size_t)m * k || fread(Q, sizeof *Q, (size_t)n * k, mf) != (size_t)n * k) {
		fprintf(stderr, "cumf_rmse: %s: short read of the factors\n", model_path);
		goto done;
	}
	if (!(tf = fopen(test_path, "rb"))) {
		perror(test_path);
		goto done;
	}
	double loss = 0, loss_c = 0;
	long long cnt = 0, outside = 0, nans = 0;
	size_t got;
	while ((got = fread(rec, sizeof *rec, CHUNK, tf)) > 0) {
		for (size_t j = 0; j < got; j++) {
			const int32_t u = rec[j].u, v = rec[j].v;
			float z;
			if (u < 0 || u >= m || v < 0 || v >= n) {
				z = b;
				outside++;
			} else {
				z = dot_in_order(P + (size_t)u * k, Q + (size_t)v * k, k);
				if (isnan(z)) {
					z = b;
					nans++;
				}
			}
			const float e = rec[j].r - z;
			loss += e * e;
			if (clip) {
				const float zc = z < lo ? lo : z > hi ? hi : z, ec = rec[j].r - zc;
				loss_c += ec * ec;
			}
			cnt++;
		}
	}
	if (ferror(tf)) {
		perror(test_path);
		goto done;
	}
	if (!cnt) {
		fprintf(stderr, "cumf_rmse: %s: no test records\n", test_path);
		goto done;
	}
	printf("cumf_rmse: m=%ld n=%ld k=%ld b=%g test=%lld outside=%lld nan=%lld rmse=%.6f", m, n, k, (double)b, cnt,
	       outside, nans, sqrt(loss / (double)cnt));
	if (clip)
		printf(" rmse_clipped=%.6f", sqrt(loss_c / (double)cnt));
	printf("\n");
	ret = 0;
done:
	if (mf)
		fclose(mf);
	if (tf)
		fclose(tf);
	free(P);
	free(Q);
	free(rec);
	return ret;
}
