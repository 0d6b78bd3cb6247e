/* bench_peer.c - GPU-to-GPU copy bandwidth for every ordered pair of the host's devices
 * (bench/peer_copy.cu): one direction, and both directions at once, best of --reps copies of
 * --mb MiB, next to each device's own copy bandwidth (bytes read + written). The exchange
 * budget of a model sharded over GPUs (docs/SCALE_OUT.md). Prints a table; writes CSV.
 *
 *   bench_peer [--mb 1024] [--reps 5] [--csv FILE]
 *
 * Needs a CUDA build and two or more devices (exit 77 with a line otherwise).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MFS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "bench/bench_cuda.h"
#endif

int main(int argc, char **argv)
{
	size_t mb = 1024;
	int reps = 5;
	const char *csv_path = NULL;
	for (int a = 1; a < argc; a++) {
		const char *v = a + 1 < argc ? argv[a + 1] : "";
		if (!strcmp(argv[a], "--mb"))
			mb = strtoull(v, NULL, 10), a++;
		else if (!strcmp(argv[a], "--reps"))
			reps = atoi(v), a++;
		else if (!strcmp(argv[a], "--csv"))
			csv_path = v, a++;
		else {
			fprintf(stderr, "usage: bench_peer [--mb 1024] [--reps 5] [--csv FILE]\n");
			return 2;
		}
	}
#ifndef MFS_HAVE_CUDA
	(void)mb, (void)reps, (void)csv_path;
	printf("bench_peer: built without the CUDA engine\n");
	return 77;
#else
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
		printf("bench_peer: %d CUDA device(s); two or more are needed\n", n);
		return 77;
	}
	FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
	if (csv)
		fprintf(csv, "src,dst,peer_access,mib,one_way_gbps,both_ways_gbps,src_copy_gbps\n");
	printf("%d devices, %zu MiB copies, best of %d\n%4s %4s %5s %12s %13s %14s\n", n, mb, reps, "src", "dst", "peer",
	       "one way GB/s", "both ways GB/s", "src copy GB/s");
	const size_t bytes = mb << 20;
	for (int s = 0; s < n; s++) {
		double own = 0;
		if (bench_cuda_copy_gbps(s, bytes, reps, &own))
			return 1;
		for (int d = 0; d < n; d++) {
			if (d == s)
				continue;
			int peer = 0;
			double one = 0, both = 0;
			if (bench_cuda_peer_gbps(s, d, bytes, reps, 0, &peer, &one) ||
			    bench_cuda_peer_gbps(s, d, bytes, reps, 1, &peer, &both)) {
				fprintf(stderr, "bench_peer: copy %d -> %d failed\n", s, d);
				return 1;
			}
			printf("%4d %4d %5s %12.1f %13.1f %14.1f\n", s, d, peer ? "yes" : "no", one, both, own);
			if (csv)
				fprintf(csv, "%d,%d,%d,%zu,%.2f,%.2f,%.2f\n", s, d, peer, mb, one, both, own);
		}
	}
	if (csv)
		fclose(csv);
	return 0;
#endif
}
