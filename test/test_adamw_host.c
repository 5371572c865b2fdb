/* The host AdamW (src/optim/adamw_host.h) against the CPU ops table's adamw
 * and a scalar loop of dt_adamw_update written here, bit for bit: p, m, v
 * and the bf16 copy, on every path this CPU has (the others are named as
 * skipped), on lengths around every vector width and thread split, at
 * starts that are not 64-byte aligned, with 1, 2 and 3 threads, and with
 * values that stress the formula (zeros, denormal-sized gradients, huge
 * ones, a NaN and infinities in the gradient).
 *
 *   test_adamw_host            the test (make check)
 *   test_adamw_host --bench    GB/s of each path and of a STREAM-style
 *                              triad on the same threads (bench/offload.sh)
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/bf16.h"
#include "base/ops.h"
#include "src/backend/ops_cpu.h"
#include "src/optim/adamw_host.h"

static int fails = 0;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

typedef struct state {
    float *p, *m, *v, *g;
    uint16_t *p16;
} state_t;

/* 64-byte aligned; C11 wants the size a multiple of the alignment (ASan checks) */
static void *alloc64(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* n elements at an offset of off floats from a 64-byte boundary */
static state_t state_new(size_t n, size_t off)
{
    state_t s;
    s.p = (float *)alloc64((n + off + 16) * 4) + off;
    s.m = (float *)alloc64((n + off + 16) * 4) + off;
    s.v = (float *)alloc64((n + off + 16) * 4) + off;
    s.g = (float *)alloc64((n + off + 16) * 4) + off;
    s.p16 = (uint16_t *)alloc64((n + off + 32) * 2) + off;
    return s;
}

static void state_free(state_t *s, size_t off)
{
    free(s->p - off);
    free(s->m - off);
    free(s->v - off);
    free(s->g - off);
    free(s->p16 - off);
}

static void fill(state_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        s->p[i] = uniform();
        s->m[i] = 0.01f * uniform();
        s->v[i] = 1e-4f * fabsf(uniform());
        s->g[i] = uniform();
        switch (i % 97) {
        case 3: s->g[i] = 0.0f; break;
        case 5: s->v[i] = 0.0f; break;
        case 11: s->g[i] = 1e-30f * uniform(); break;
        case 13: s->g[i] = 3e18f * uniform(); break;
        case 17: s->p[i] = -0.0f; break;
        case 19: s->g[i] = (i / 97) % 3 == 0 ? NAN : (i / 97) % 3 == 1 ? INFINITY : -INFINITY; break;
        }
    }
}

static void copy(state_t *d, const state_t *s, size_t n)
{
    memcpy(d->p, s->p, n * 4);
    memcpy(d->m, s->m, n * 4);
    memcpy(d->v, s->v, n * 4);
    memcpy(d->g, s->g, n * 4);
    memset(d->p16, 0xa5, n * 2);
}

/* the first element where a and b differ in any bit, or -1 */
static long first_diff(const state_t *a, const state_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a->p[i], &b->p[i], 4) || memcmp(&a->m[i], &b->m[i], 4) || memcmp(&a->v[i], &b->v[i], 4) ||
            a->p16[i] != b->p16[i])
            return (long)i;
    return -1;
}

static int test(void)
{
    static const size_t lengths[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 47, 63, 64, 65, 97, 255, 1000, 4097, 100003};
    static const size_t offsets[] = {0, 1, 3, 7};
    const ops_t *cpu = ops_cpu_create();
    if (!cpu) {
        printf("FAIL cannot create the CPU ops\n");
        return 1;
    }
    const float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    for (adamw_host_isa_t isa = 0; isa < ADAMW_HOST_N; isa++) {
        if (!adamw_host_supported(isa)) {
            printf("skip %s: not supported by this CPU\n", adamw_host_isa_names[isa]);
            continue;
        }
        long checked = 0;
        for (int t = 1; t <= 1000; t *= 37) /* steps 1, 37: the bias corrections */
            for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++)
                for (size_t oi = 0; oi < sizeof offsets / sizeof *offsets; oi++)
                    for (int threads = 1; threads <= 3; threads++)
                        for (int with16 = 0; with16 <= 1; with16++) {
                            const size_t n = lengths[li], off = offsets[oi];
                            state_t init = state_new(n, off), ref = state_new(n, off), tab = state_new(n, off),
                                    got = state_new(n, off);
                            fill(&init, n);
                            copy(&ref, &init, n);
                            copy(&tab, &init, n);
                            copy(&got, &init, n);
                            const dt_adamw_coef_t k = dt_adamw_coef(lr, beta1, beta2, eps, wd, gs, t);
                            for (size_t i = 0; i < n; i++) { /* the formula, here */
                                dt_adamw_update(&ref.p[i], &ref.m[i], &ref.v[i], ref.g[i], &k);
                                if (with16)
                                    ref.p16[i] = dt_f32_to_bf16(ref.p[i]);
                            }
                            cpu->adamw(cpu->ctx, tab.p, with16 ? tab.p16 : NULL, tab.g, tab.m, tab.v, n, lr, beta1,
                                       beta2, eps, wd, gs, t);
                            omp_set_num_threads(threads);
                            adamw_host(isa, got.p, with16 ? got.p16 : NULL, got.g, got.m, got.v, n, &k);
                            const long d1 = first_diff(&got, &ref, n), d2 = first_diff(&got, &tab, n);
                            if (d1 >= 0 || d2 >= 0) {
                                long i = d1 >= 0 ? d1 : d2;
                                printf("FAIL %s n %zu off %zu threads %d t %d p16 %d: element %ld differs from %s: "
                                       "p %a/%a m %a/%a v %a/%a p16 %04x/%04x\n",
                                       adamw_host_isa_names[isa], n, off, threads, t, with16, i,
                                       d1 >= 0 ? "the formula" : "the ops table", got.p[i], (d1 >= 0 ? ref : tab).p[i],
                                       got.m[i], (d1 >= 0 ? ref : tab).m[i], got.v[i], (d1 >= 0 ? ref : tab).v[i],
                                       got.p16[i], (d1 >= 0 ? ref : tab).p16[i]);
                                fails++;
                            }
                            checked += (long)n;
                            state_free(&init, off);
                            state_free(&ref, off);
                            state_free(&tab, off);
                            state_free(&got, off);
                        }
        printf("ok   %s: %ld elements bit-identical to dt_adamw_update and the ops table's adamw "
               "(p, m, v, bf16; 19 lengths, 4 misalignments, 1-3 threads, steps 1 and 37)\n",
               adamw_host_isa_names[isa], checked);
    }
    ops_release(cpu);
    omp_set_num_threads(omp_get_num_procs());
    printf("%d failure(s)\n", fails);
    return fails != 0;
}

/* ---- --bench ----------------------------------------------------------------------------- */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bench_arg {
    state_t *s;
    float *a, *b, *c;
    size_t n;
    adamw_host_isa_t isa;
    int with16;
    const dt_adamw_coef_t *k;
    const ops_t *cpu;
} bench_arg_t;

static void triad(const bench_arg_t *x)
{
    float *a = x->a;
    const float *b = x->b, *c = x->c;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < x->n; i++)
        a[i] = b[i] + 3.0f * c[i];
}

static void host(const bench_arg_t *x)
{
    adamw_host(x->isa, x->s->p, x->with16 ? x->s->p16 : NULL, x->s->g, x->s->m, x->s->v, x->n, x->k);
}

static void table(const bench_arg_t *x)
{
    x->cpu->adamw(x->cpu->ctx, x->s->p, NULL, x->s->g, x->s->m, x->s->v, x->n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f,
                  10);
}

/* best of reps runs, as GB/s of bytes_per bytes moved per element */
static void best_of(const char *label, double bytes_per, void (*f)(const bench_arg_t *), const bench_arg_t *x, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        f(x);
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    printf("| %s | %d | %.1f | %.2f |\n", label, omp_get_max_threads(), bytes_per * (double)x->n / best / 1e9,
           1e3 * best);
}

static int bench(size_t n, int reps)
{
    state_t s = state_new(n, 0);
    float *a = alloc64(n * 4), *b = alloc64(n * 4), *c = alloc64(n * 4);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { /* first touch by the threads that run */
        s.p[i] = 0.5f, s.m[i] = 0.0f, s.v[i] = 0.0f, s.g[i] = 1e-3f, s.p16[i] = 0;
        a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;
    }
    const dt_adamw_coef_t k = dt_adamw_coef(3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10);
    bench_arg_t x = {.s = &s, .a = a, .b = b, .c = c, .n = n, .k = &k};
    printf("%zu elements (%.0f MiB of state), best of %d\n\n", n, 16.0 * (double)n / 1048576.0, reps);
    printf("| kernel | threads | GB/s | ms |\n| --- | ---: | ---: | ---: |\n");
    /* STREAM's triad, a = b + s c: 12 bytes an element (no write-allocate counted) */
    best_of("triad (a = b + s*c)", 12, triad, &x, reps);
    for (adamw_host_isa_t isa = 0; isa < ADAMW_HOST_N; isa++) {
        if (!adamw_host_supported(isa))
            continue;
        char label[64];
        x.isa = isa;
        /* p, m, v read and written, g read: 28 bytes; 30 with the bf16 copy */
        x.with16 = 0;
        snprintf(label, sizeof label, "adamw %s", adamw_host_isa_names[isa]);
        best_of(label, 28, host, &x, reps);
        x.with16 = 1;
        snprintf(label, sizeof label, "adamw %s + bf16", adamw_host_isa_names[isa]);
        best_of(label, 30, host, &x, reps);
    }
    x.cpu = ops_cpu_create();
    if (x.cpu) {
        best_of("ops table adamw (CPU backend)", 28, table, &x, reps);
        ops_release(x.cpu);
    }
    free(a);
    free(b);
    free(c);
    state_free(&s, 0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--bench") == 0)
        return bench(argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : (size_t)1 << 25, argc > 3 ? atoi(argv[3]) : 5);
    return test();
}
