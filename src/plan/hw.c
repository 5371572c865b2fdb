#include "src/plan/hw.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#include <cblas.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "src/cli/strparse.h"
#include "src/model/flops.h"

#define GIB 1073741824.0

/* Datasheet peaks (dense, no sparsity: issue #9 of ../shared/notes/anchors.md
 * is users dividing by the 2:4 number). Bandwidths are achievable bus
 * bandwidths, 80 % of the link's per-direction rate (nccl-tests' busbw on
 * NVLink and InfiniBand reaches about that). efficiency is calibrated so
 * that the planner's prediction for the Megatron-Core 70B anchor (TP8 PP2 on
 * H100, 42 % MFU) and the Megatron-LM A100 runs (44-52 % MFU) come out at
 * the published MFU; doc/design.md shows the calibration. */
static const hw_profile_t builtin[] = {
    {.name = "h100-sxm",
     .memory = 80 * GIB,
     .reserve = 4 * GIB,
     .peak_fp32 = 66.9e12,
     .peak_bf16 = 989.4e12,
     .efficiency = 0.50,
     .mem_bw = 3.35e12,
     .intra_bw = 0.8 * 450e9,
     .inter_bw = 0.8 * 50e9,
     .latency = 15e-6,
     .gpus_per_node = 8,
     /* DGX H100: 2 TiB; two Xeon 8480C with 8 DDR5-4800 channels each
      * (2 x 307 GB/s), 80 % of it as STREAM reaches; PCIe 5.0 x16 per GPU
      * (64 GB/s each way), 80 % of it */
     .host_memory = 2048 * GIB,
     .host_bw = 0.8 * 614e9,
     .h2d_bw = 0.8 * 64e9,
     /* no GPU measured dtrain's mma kernels yet: the published
      * FlashAttention-2 class on H100 at head size 128, S >= 2k (forward
      * causal about 300-335 TFLOP/s, backward 290-320; FA3 paper,
      * ../shared/notes/anchors-wave3.md 1c), forward and backward
      * weighted 1 : 2.5 */
     .att_bf16 = 305e12},
    {.name = "a100-80g",
     .memory = 80 * GIB,
     .reserve = 4 * GIB,
     .peak_fp32 = 19.5e12,
     .peak_bf16 = 312e12,
     .efficiency = 0.60,
     .mem_bw = 2.04e12,
     .intra_bw = 0.8 * 300e9,
     .inter_bw = 0.8 * 25e9,
     .latency = 15e-6,
     .gpus_per_node = 8,
     /* DGX A100: 1 TiB; two EPYC 7742 with 8 DDR4-3200 channels each
      * (2 x 205 GB/s), 80 %; PCIe 4.0 x16 (32 GB/s each way), 80 % */
     .host_memory = 1024 * GIB,
     .host_bw = 0.8 * 410e9,
     .h2d_bw = 0.8 * 32e9,
     /* FlashAttention-2 on A100: "up to 225 TFLOPs/sec" in GPT training
      * (its README), its backward somewhat lower: unmeasured for dtrain */
     .att_bf16 = 180e12},
};
#define N_BUILTIN ((int)(sizeof builtin / sizeof builtin[0]))

const char *hw_builtin_names(void) { return "h100-sxm|a100-80g|cpu"; }

/* This machine, one single-threaded rank per core (how the multi-rank CPU
 * runs go): RAM shared by the cores, the sgemm probe's peak on one thread,
 * dtrain's measured 68-72 % MFU on gpt2-124m (bench/README.md), MPI's
 * shared-memory all-reduce at about 1 GB/s busbw for large messages. */
static void cpu_profile(hw_profile_t *p, double peak_gflops)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cpu");
    long cores = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    p->gpus_per_node = cores > 0 ? (int)cores : 1;
    p->memory = pages > 0 && psz > 0 ? (double)pages * (double)psz / p->gpus_per_node : 8 * GIB;
    /* the device is the host: the same RAM, copies are memcpy (a read and
     * a write per byte) */
    p->host_memory = p->memory * p->gpus_per_node;
    p->reserve = 0.25 * GIB;
    if (peak_gflops <= 0) {
#ifdef _OPENMP
        int was = omp_get_max_threads();
        omp_set_num_threads(1);
#endif
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
        openblas_set_num_threads(1);
#endif
        peak_gflops = flops_measure_peak_gflops();
#ifdef _OPENMP
        omp_set_num_threads(was);
#endif
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
        openblas_set_num_threads(was);
#endif
    }
    p->peak_fp32 = p->peak_bf16 = peak_gflops * 1e9; /* the CPU backend computes in fp32 */
    p->efficiency = 0.70;
    p->mem_bw = 35e9;
    p->host_bw = 35e9;
    p->h2d_bw = 35e9 / 2;
    p->intra_bw = 1.0e9;
    p->inter_bw = 1.0e9;
    p->latency = 20e-6;
}

/* "80GiB", "450GB", "989e12", "1.5 TB": a number and an optional unit. */
static int parse_quantity(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return -1;
    while (*end == ' ')
        end++;
    static const struct {
        const char *unit;
        double mul;
    } units[] = {
        {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},  {"GB", 1e9},
        {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", GIB}, {"TiB", GIB * 1024.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].unit) == 0) {
            *out = v * units[i].mul;
            return 0;
        }
    return -1;
}

/* The values of a profile file make sense together. 0, or -1 (err). */
static int check_profile(const hw_profile_t *p, const char *path, char *err, size_t errlen)
{
    if (p->memory <= 0 || p->intra_bw <= 0 || p->inter_bw <= 0 || (p->peak_fp32 <= 0 && p->peak_bf16 <= 0) ||
        p->efficiency <= 0 || p->efficiency > 1 || p->reserve >= p->memory) {
        snprintf(err, errlen,
                 "%s: memory, a peak (peak_fp32 or peak_bf16) and both bandwidths must be positive, "
                 "efficiency in (0, 1] and reserve below memory",
                 path);
        return -1;
    }
    return 0;
}

/* A profile file being read: its numeric keys, which of them were seen,
 * and the line being parsed (for messages). */
typedef struct profile_reader {
    hw_profile_t *p;
    const char *path;
    struct {
        const char *key;
        double *field;
        int required;
    } keys[13];
    int nk, lineno, have_gpn;
    int seen[16];
} profile_reader_t;

/* `gpus_per_node = N`: a positive integer. 0, or -1 (err). */
static int parse_gpus_per_node(profile_reader_t *r, const char *val, char *err, size_t errlen)
{
    int rc = 0;
    char *end;
    long v = strtol(val, &end, 10);
    if (end == val || *end || v < 1 || v > 1 << 20) {
        snprintf(err, errlen, "%s:%d: gpus_per_node '%s': expected a positive integer", r->path, r->lineno, val);
        rc = -1;
    }
    r->p->gpus_per_node = (int)v;
    r->have_gpn = 1;
    return rc;
}

/* One line, `key = value` or blank, a # starting a comment; the line is
 * cut up in place. 0, or -1 (err). */
static int parse_line(profile_reader_t *r, char *line, char *err, size_t errlen)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = '\0';
    char *s = trim(line), *eq = strchr(s, '=');
    if (!*s)
        return 0;
    if (!eq) {
        snprintf(err, errlen, "%s:%d: expected `key = value`, got '%s'", r->path, r->lineno, s);
        return -1;
    }
    *eq = '\0';
    char *key = trim(s), *val = trim(eq + 1);
    if (strcmp(key, "name") == 0) {
        snprintf(r->p->name, sizeof r->p->name, "%.63s", val);
        return 0;
    }
    if (strcmp(key, "gpus_per_node") == 0)
        return parse_gpus_per_node(r, val, err, errlen);
    int k = 0;
    while (k < r->nk && strcmp(r->keys[k].key, key) != 0)
        k++;
    if (k == r->nk) {
        snprintf(
            err, errlen,
            "%s:%d: unknown key '%s' (allowed: name, memory, reserve, peak_fp32, peak_bf16, "
            "efficiency, mem_bw, intra_node_bw, inter_node_bw, latency, gpus_per_node, host_memory, host_bw, h2d_bw, "
            "att_bf16)",
            r->path, r->lineno, key);
        return -1;
    }
    if (parse_quantity(val, r->keys[k].field) != 0) {
        snprintf(err, errlen,
                 "%s:%d: %s '%s': expected a non-negative number with an optional unit "
                 "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
                 r->path, r->lineno, key, val);
        return -1;
    }
    r->seen[k] = 1;
    return 0;
}

/* Every required key was given. 0, or -1 (err). */
static int check_required(const profile_reader_t *r, char *err, size_t errlen)
{
    for (int k = 0; k < r->nk; k++)
        if (r->keys[k].required && !r->seen[k]) {
            snprintf(err, errlen, "%s: the key '%s' is missing", r->path, r->keys[k].key);
            return -1;
        }
    if (!r->have_gpn) {
        snprintf(err, errlen, "%s: the key 'gpus_per_node' is missing", r->path);
        return -1;
    }
    return 0;
}

static int load_file(hw_profile_t *p, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--hw '%s': not a built-in profile (%s) and cannot open it as a file: %s", path,
                 hw_builtin_names(), strerror(errno));
        return -1;
    }
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%.63s", path);
    p->efficiency = 0.5;
    profile_reader_t r = {
        .p = p,
        .path = path,
        .keys =
            {
                {"memory", &p->memory, 1},
                {"reserve", &p->reserve, 0},
                {"peak_fp32", &p->peak_fp32, 0},
                {"peak_bf16", &p->peak_bf16, 0},
                {"efficiency", &p->efficiency, 0},
                {"mem_bw", &p->mem_bw, 0},
                {"intra_node_bw", &p->intra_bw, 1},
                {"inter_node_bw", &p->inter_bw, 1},
                {"latency", &p->latency, 0},
                {"host_memory", &p->host_memory, 0},
                {"host_bw", &p->host_bw, 0},
                {"h2d_bw", &p->h2d_bw, 0},
                {"att_bf16", &p->att_bf16, 0},
            },
    };
    r.nk = (int)(sizeof r.keys / sizeof r.keys[0]);
    int rc = 0;
    char line[1024];
    while (rc == 0 && fgets(line, sizeof line, f)) {
        r.lineno++;
        rc = parse_line(&r, line, err, errlen);
    }
    fclose(f);
    if (rc == 0)
        rc = check_required(&r, err, errlen);
    return rc == 0 ? check_profile(p, path, err, errlen) : rc;
}

int hw_profile_load(hw_profile_t *p, const char *name_or_file, double peak_gflops, double mem_gib, char *err,
                    size_t errlen)
{
    const char *name = name_or_file[0] ? name_or_file : "h100-sxm";
    int found = 0;
    for (int i = 0; i < N_BUILTIN && !found; i++)
        if (strcmp(builtin[i].name, name) == 0) {
            *p = builtin[i];
            found = 1;
        }
    if (!found && strcmp(name, "cpu") == 0) {
        cpu_profile(p, peak_gflops);
        found = 1;
    }
    if (!found && load_file(p, name, err, errlen) != 0)
        return -1;
    if (mem_gib > 0) {
        p->memory = mem_gib * GIB;
        if (p->reserve >= p->memory)
            p->reserve = 0;
    }
    return 0;
}
