/* An MPI program for roxe's middleware tests: a ping-pong between ranks 0
 * and 1 whose every byte is checked (sizes from 1 B to SIZE, default 1 MiB),
 * then an MPI_Allreduce over all ranks whose sum is checked. Prints one
 * "ok" line per part from rank 0 and the ping-pong's time per round trip
 * at the largest size; exits non-zero on any mismatch.
 *
 *   mpirun -np 2 mpi_check [SIZE [ITERS]]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(int iter, size_t i, int from)
{
	return (unsigned char)(i * 31 + iter * 7 + from * 101);
}

int main(int argc, char **argv)
{
	int rank, size, failed = 0;
	size_t max = argc > 1 ? strtoul(argv[1], NULL, 0) : (1 << 20);
	int iters = argc > 2 ? atoi(argv[2]) : 50;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	unsigned char *buf = malloc(max);
	if (!buf)
		MPI_Abort(MPI_COMM_WORLD, 2);
	double per_rt = 0;
	if (rank < 2 && size >= 2) {
		for (size_t len = 1; len <= max; len *= 4) {
			int n = len == max || len * 4 > max ? iters : 3;
			double t0 = MPI_Wtime();
			for (int it = 0; it < n; it++) {
				if (rank == 0) {
					for (size_t i = 0; i < len; i++)
						buf[i] = pattern(it, i, 0);
					MPI_Send(buf, (int)len, MPI_BYTE, 1, it, MPI_COMM_WORLD);
					MPI_Recv(buf, (int)len, MPI_BYTE, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
					for (size_t i = 0; i < len; i++)
						if (buf[i] != pattern(it, i, 1)) {
							fprintf(stderr, "rank 0: len %zu iter %d byte %zu: %u\n", len, it, i, buf[i]);
							failed = 1;
							break;
						}
				} else {
					MPI_Recv(buf, (int)len, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
					for (size_t i = 0; i < len; i++)
						if (buf[i] != pattern(it, i, 0)) {
							fprintf(stderr, "rank 1: len %zu iter %d byte %zu: %u\n", len, it, i, buf[i]);
							failed = 1;
							break;
						}
					for (size_t i = 0; i < len; i++)
						buf[i] = pattern(it, i, 1);
					MPI_Send(buf, (int)len, MPI_BYTE, 0, it, MPI_COMM_WORLD);
				}
			}
			if (len == max || len * 4 > max)
				per_rt = (MPI_Wtime() - t0) / n;
		}
	}
	int f = failed, any = 0;
	MPI_Allreduce(&f, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (rank == 0 && !any)
		printf("pingpong ok: %zu bytes, %.1f us per round trip\n", max, per_rt * 1e6);
	long mine = 1000 + rank, sum = 0, want = 0;
	MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	for (int r = 0; r < size; r++)
		want += 1000 + r;
	if (sum != want) {
		fprintf(stderr, "rank %d: allreduce %ld, want %ld\n", rank, sum, want);
		any = 1;
	} else if (rank == 0)
		printf("allreduce ok: %d ranks, sum %ld\n", size, sum);
	free(buf);
	MPI_Finalize();
	return any ? 1 : 0;
}
