/* cumf_split.c - one `mfstream gen` binary ratings file split into the same train/test
 * partition for mfstream and for cuMF_SGD (bench/side_by_side.sh; issue 19).
 *
 *   cumf_split [-m MOD] IN OUTDIR
 *
 * IN: a file, a FIFO (gen writes straight into it: no 2.8 GB file sits on disk) or - for stdin,
 * in mfstream's binary format (ingest/ratings_file.h): the magic "MFSRAT01", then 28-byte
 * little-endian records {u64 user, u64 item, f32 rating, i64 timestamp_ms}. Compressed input is
 * not read here: give gen a plain .bin output.
 * Record n (0-based, in file order) is a test record when n % MOD == MOD - 1 (MOD 100: 1 %
 * held out, every 100th record), otherwise a training record. Written to OUTDIR:
 *   mfs_train.bin  mfs_test.bin    mfstream binary, the records unchanged (magic included)
 *   cumf_train.bin cumf_test.bin   cuMF_SGD's input (its read_problem): headerless 12-byte
 *                                  records {i32 u, i32 v, f32 r}, ids 0-based (id - 1)
 * cuMF sizes its model by the largest id + 1 it reads, so ids must be 1 .. 2^31 - 1: gen's are
 * 1 .. users and 1 .. items. A record with an id outside that, or a short last record, stops the
 * split with exit 1 (nothing here is skipped silently: both programs must see the same ratings).
 * Prints one line of key=value counts (records, train, test, max ids) for the caller to check.
 * Host byte order is assumed little-endian, as on every machine the benchmark runs on.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAGIC "MFSRAT01"
#define MAGIC_LEN 8
#define REC 28                /* mfstream binary record */
#define CREC 12               /* cuMF record */
#define CHUNK (1u << 16)      /* records per read */
#define OUT_BUF (8u << 20)    /* stdio buffer per output file */

enum { O_MTRAIN, O_MTEST, O_CTRAIN, O_CTEST, O_N };
static const char *const out_name[O_N] = {"mfs_train.bin", "mfs_test.bin", "cumf_train.bin", "cumf_test.bin"};

static void usage(FILE *f)
{
	fprintf(f, "usage: cumf_split [-m MOD] IN OUTDIR\n"
	           "Splits an mfstream binary ratings file (IN: a path, a FIFO or -) into OUTDIR/mfs_{train,test}.bin\n"
	           "and OUTDIR/cumf_{train,test}.bin; record n is test when n %% MOD == MOD - 1 (default MOD 100).\n");
}

int main(int argc, char **argv)
{
	unsigned long long mod = 100;
	int opt;
	while ((opt = getopt(argc, argv, "m:h")) != -1) {
		char *end;
		switch (opt) {
		case 'm':
			mod = strtoull(optarg, &end, 10);
			if (*end || mod < 2) {
				fprintf(stderr, "cumf_split: -m %s: want an integer >= 2\n", optarg);
				return 2;
			}
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
	const char *in_path = argv[optind], *dir = argv[optind + 1];
	FILE *in = strcmp(in_path, "-") ? fopen(in_path, "rb") : stdin;
	FILE *out[O_N] = {0};
	unsigned char *buf = malloc((size_t)CHUNK * REC), *cbuf[2] = {malloc((size_t)CHUNK * CREC), malloc((size_t)CHUNK * CREC)};
	int ret = 1;
	if (!in) {
		perror(in_path);
		goto done;
	}
	if (!buf || !cbuf[0] || !cbuf[1]) {
		fprintf(stderr, "cumf_split: out of memory\n");
		goto done;
	}
	setvbuf(in, NULL, _IOFBF, OUT_BUF);
	char magic[MAGIC_LEN];
	if (fread(magic, 1, MAGIC_LEN, in) != MAGIC_LEN || memcmp(magic, MAGIC, MAGIC_LEN)) {
		fprintf(stderr, "cumf_split: %s: no %s magic: not an uncompressed mfstream binary ratings file\n", in_path,
		        MAGIC);
		goto done;
	}
	for (int o = 0; o < O_N; o++) {
		char p[4096];
		snprintf(p, sizeof p, "%s/%s", dir, out_name[o]);
		if (!(out[o] = fopen(p, "wb"))) {
			perror(p);
			goto done;
		}
		setvbuf(out[o], NULL, _IOFBF, OUT_BUF);
	}
	if (fwrite(MAGIC, 1, MAGIC_LEN, out[O_MTRAIN]) != MAGIC_LEN || fwrite(MAGIC, 1, MAGIC_LEN, out[O_MTEST]) != MAGIC_LEN)
		goto write_fail;

	uint64_t n = 0, cnt[2] = {0, 0}, max_u = 0, max_i = 0;
	size_t got;
	while ((got = fread(buf, 1, (size_t)CHUNK * REC, in)) > 0) {
		if (got % REC) {
			/* fread of a FIFO returns only at EOF or a full buffer, so a remainder is a short last record */
			fprintf(stderr, "cumf_split: %s: truncated record %" PRIu64 " (%zu of %d bytes)\n", in_path,
			        n + got / REC + 1, got % REC, REC);
			goto done;
		}
		size_t cn[2] = {0, 0};
		for (size_t x = 0; x < got / REC; x++, n++) {
			const unsigned char *r = buf + x * REC;
			uint64_t u, i;
			memcpy(&u, r, 8);
			memcpy(&i, r + 8, 8);
			if (u < 1 || i < 1 || u > INT32_MAX || i > INT32_MAX) {
				fprintf(stderr, "cumf_split: record %" PRIu64 ": user %" PRIu64 " item %" PRIu64
				                " outside 1..2^31-1 (cuMF ids are int32)\n", n + 1, u, i);
				goto done;
			}
			const int t = n % mod == mod - 1;
			if (fwrite(r, REC, 1, out[t ? O_MTEST : O_MTRAIN]) != 1)
				goto write_fail;
			const int32_t cu = (int32_t)(u - 1), ci = (int32_t)(i - 1);
			unsigned char *c = cbuf[t] + cn[t]++ * CREC;
			memcpy(c, &cu, 4);
			memcpy(c + 4, &ci, 4);
			memcpy(c + 8, r + 16, 4); /* the f32 rating, bit for bit */
			cnt[t]++;
			if (u > max_u)
				max_u = u;
			if (i > max_i)
				max_i = i;
		}
		if (fwrite(cbuf[0], CREC, cn[0], out[O_CTRAIN]) != cn[0] || fwrite(cbuf[1], CREC, cn[1], out[O_CTEST]) != cn[1])
			goto write_fail;
	}
	if (ferror(in)) {
		perror(in_path);
		goto done;
	}
	for (int o = 0; o < O_N; o++) {
		FILE *f = out[o];
		out[o] = NULL;
		if (fclose(f))
			goto write_fail;
	}
	printf("cumf_split: input=%s mod=%llu records=%" PRIu64 " train=%" PRIu64 " test=%" PRIu64 " max_user=%" PRIu64
	       " max_item=%" PRIu64 "\n", in_path, mod, n, cnt[0], cnt[1], max_u, max_i);
	ret = 0;
	goto done;
write_fail:
	perror("cumf_split: write");
done:
	for (int o = 0; o < O_N; o++)
		if (out[o])
			fclose(out[o]);
	if (in && in != stdin)
		fclose(in);
	free(buf);
	free(cbuf[0]);
	free(cbuf[1]);
	return ret;
}
