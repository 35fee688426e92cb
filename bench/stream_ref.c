/* A STREAM-method reference (McCalpin's STREAM: copy, scale, add, triad over
 * three arrays of doubles, OpenMP static loops, best of NTIMES passes, bytes
 * counted without write-allocate). Written for anvil so that `anvil bench
 * membw` can be compared with a plain C build at -O3 -march=native -fopenmp.
 * Usage: stream_ref [elements per array, default 20000000] [passes, default 10]
 * Prints one line per kernel: name, best MB/s, and a JSON line at the end. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static double now(void) {
  return omp_get_wtime();
}

int main(int argc, char** argv) {
  const long n = argc > 1 ? atol(argv[1]) : 20000000L;
  const int passes = argc > 2 ? atoi(argv[2]) : 10;
  if (n < 1000 || passes < 2) {
    fprintf(stderr, "stream_ref: expected elements >= 1000 and passes >= 2\n");
    return 2;
  }
  double *a, *b, *c;
  if (posix_memalign((void**)&a, 4096, n * sizeof(double)) ||
      posix_memalign((void**)&b, 4096, n * sizeof(double)) ||
      posix_memalign((void**)&c, 4096, n * sizeof(double))) {
    fprintf(stderr, "stream_ref: out of memory\n");
    return 1;
  }
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) {
    a[i] = 1.0;
    b[i] = 2.0;
    c[i] = 0.0;
  }
  const double s = 3.0;
  double best[4] = {1e30, 1e30, 1e30, 1e30};
  for (int p = 0; p < passes; ++p) {
    double t[4];
    t[0] = now();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) c[i] = a[i];
    t[0] = now() - t[0];
    t[1] = now();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) b[i] = s * c[i];
    t[1] = now() - t[1];
    t[2] = now();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) c[i] = a[i] + b[i];
    t[2] = now() - t[2];
    t[3] = now();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
    t[3] = now() - t[3];
    if (p == 0) continue; /* the first pass is a warm-up, as in STREAM */
    for (int k = 0; k < 4; ++k) best[k] = t[k] < best[k] ? t[k] : best[k];
  }
  const char* names[4] = {"copy", "scale", "add", "triad"};
  const double bytes[4] = {16.0 * n, 16.0 * n, 24.0 * n, 24.0 * n};
  printf("stream_ref: %ld elements per array (%.1f MiB each), %d threads\n", n, n * 8.0 / 1048576.0,
         omp_get_max_threads());
  for (int k = 0; k < 4; ++k) printf("%-6s %10.1f MB/s\n", names[k], bytes[k] / best[k] / 1e6);
  printf(
      "{\"threads\": %d, \"elements\": %ld, \"copy_gbs\": %.3f, \"scale_gbs\": %.3f, "
      "\"add_gbs\": %.3f, \"triad_gbs\": %.3f}\n",
      omp_get_max_threads(), n, bytes[0] / best[0] / 1e9, bytes[1] / best[1] / 1e9,
      bytes[2] / best[2] / 1e9, bytes[3] / best[3] / 1e9);
  /* Keep the results live. */
  double sum = 0;
  for (long i = 0; i < n; i += n / 7) sum += a[i] + b[i] + c[i];
  return sum == 12345.678 ? 3 : 0;
}
