#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
void *gpumem_malloc(ssize_t size, int device, void *stream);
void gpumem_free(void *ptr, ssize_t size, int device, void *stream);
__attribute__((noinline)) void pairs(long n) {
  static const ssize_t sizes[3] = {512, 65536, 1048576};
  for (long i = 0; i < n; i++) {
    ssize_t s = sizes[i % 3];
    void *p = gpumem_malloc(s, 0, 0);
    if (!p) { fprintf(stderr, "NULL\n"); exit(1); }
    gpumem_free(p, s, 0, 0);
  }
}
int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100000;
  pairs(1000);  /* warm: the device built, the pool grown */
  pairs(n);
  return 0;
}
