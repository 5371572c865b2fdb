/* io/tfevents: the writer's bytes against golden records, a file for the
 * independent readers, and its failures. Driven by test_tfevents.sh, one
 * mode per run:
 *
 *   golden DIR    CRC-32C check value; a header and a one-scalar record
 *                 byte for byte as written by hand from the format
 *                 (left in DIR for protoc); the file name; ".1" when ".0"
 *                 exists; missing parents made
 *   write DIR     a run of events (NaN, infinities, 0, a 200-byte and a
 *                 UTF-8 tag, 2-byte summary lengths, steps 0, 2^40, -5);
 *                 prints the file's path; DIR/expected.txt lists every
 *                 field as "step<TAB>wall_time<TAB>tag<TAB>value"
 *   metrics DIR   two step records through metrics_write_tfevents (one
 *                 with a validation loss), expected.txt with the tags the
 *                 trainer promises spelt out here; prints the path
 *   json DIR      metrics_write_json of a finite step record and of one
 *                 with a nan loss, an infinite gradient norm and a -inf
 *                 validation loss into DIR/m.jsonl (the shell test parses
 *                 it as strict JSON: non-finite values are null)
 *   fsize DIR     writes until a 4 KiB file size limit stops it: the error
 *                 on stderr, exit 1
 *   open DIR      open only; the error on stderr, exit 1
 *
 * Prints "ok ..." / "FAIL ..." lines and "N failure(s)"; exit 0 when none. */
#define _POSIX_C_SOURCE 200809L /* setrlimit */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "io/crc32c.h"
#include "io/tfevents.h"
#include "src/train/metrics.h"

#define ERRLEN 1024
#define WALL0 1700000000.0

static int fails;

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    fails += !ok;
}

static size_t unhex(const char *hex, unsigned char *out)
{
    size_t n = 0;
    for (const char *p = hex; p[0] && p[1]; p += 2) {
        while (*p == ' ' || *p == '|')
            p++;
        unsigned b;
        if (sscanf(p, "%2x", &b) != 1)
            break;
        out[n++] = (unsigned char)b;
    }
    return n;
}

static long read_file(const char *path, unsigned char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return (long)n;
}

/* Golden records, encoded by hand from the format (io/tfevents.c): wall_time
 * 1700000000.0 and file_version; wall_time 1700000000.5, step 100, train/loss 2.5. */
static const char *GOLD_HEADER = "1800000000000000 a37f4b22 0900000040fc54d941 1a0d627261696e2e4576656e743a32 eced8f9d";
static const char *GOLD_SCALAR = "2000000000000000 29eda950 | 09 00002040fc54d941 | 10 64 | 2a 13 | 0a 11 | "
                                 "0a 0a 747261696e2f6c6f7373 | 15 00002040 | 9c94672d";

static int golden(const char *dir)
{
    crc32c_t c;
    crc32c_init(&c, 1);
    check(crc32c_update(&c, 0, "123456789", 9) == 0xE3069283u, "crc32c(\"123456789\") = 0xE3069283");

    double now = tfevents_now(), t = (double)time(NULL);
    check(now > t - 2 && now < t + 2, "tfevents_now() is the time of day");

    char err[ERRLEN], sub[2048], want[4096];
    snprintf(sub, sizeof sub, "%s/a/b//c", dir); /* missing parents, a doubled '/' */
    tfevents_t *w;
    if (tfevents_open(sub, "host", 4242, WALL0, &w, err, sizeof err) != 0) {
        check(0, err);
        return 1;
    }
    snprintf(want, sizeof want, "%s/events.out.tfevents.1700000000.host.4242.0", sub);
    check(strcmp(tfevents_path(w), want) == 0, "file name events.out.tfevents.<10-digit secs>.<host>.<pid>.0");
    tfevents_scalar_t v = {"train/loss", 2.5};
    int rc = tfevents_scalars(w, 100, WALL0 + 0.5, &v, 1, err, sizeof err);
    rc = rc != 0 ? rc : tfevents_close(w, err, sizeof err);
    check(rc == 0, rc == 0 ? "header and one scalar written" : err);

    unsigned char gold[256], got[256];
    size_t nh = unhex(GOLD_HEADER, gold), ns = unhex(GOLD_SCALAR, gold + nh);
    long n = read_file(want, got, sizeof got);
    check(nh == 40 && ns == 12 + 32 + 4, "golden records parsed (40 + 48 bytes)");
    check(n == (long)(nh + ns), "file length = header record + scalar record");
    check(n >= (long)nh && memcmp(got, gold, nh) == 0, "header record byte for byte");
    check(n == (long)(nh + ns) && memcmp(got + nh, gold + nh, ns) == 0, "scalar record byte for byte");

    /* the same second, host and pid again: a new file, the first kept */
    if (tfevents_open(sub, "host", 4242, WALL0, &w, err, sizeof err) != 0) {
        check(0, err);
        return 1;
    }
    snprintf(want, sizeof want, "%s/events.out.tfevents.1700000000.host.4242.1", sub);
    check(strcmp(tfevents_path(w), want) == 0, "existing .0: the next file is .1");
    check(tfevents_close(w, err, sizeof err) == 0, "closed");
    return 0;
}

/* Writes one event and its expected fields. */
static void put(tfevents_t *w, FILE *exp, long long step, double wall, const tfevents_scalar_t *v, int n)
{
    char err[ERRLEN];
    if (tfevents_scalars(w, step, wall, v, n, err, sizeof err) != 0)
        check(0, err);
    for (int i = 0; i < n; i++)
        fprintf(exp, "%lld\t%.17g\t%s\t%.17g\n", step, wall, v[i].tag, v[i].value);
}

static int write_run(const char *dir)
{
    char err[ERRLEN], path[4096], longtag[201];
    tfevents_t *w;
    if (tfevents_open(dir, "roundtrip", 1, WALL0, &w, err, sizeof err) != 0) {
        check(0, err);
        return 1;
    }
    snprintf(path, sizeof path, "%s/expected.txt", dir);
    FILE *exp = fopen(path, "w");
    if (!exp) {
        check(0, "cannot create expected.txt");
        return 1;
    }
    fprintf(exp, "0\t%.17g\tfile_version\tbrain.Event:2\n", WALL0);
    memset(longtag, 'x', 200);
    memcpy(longtag, "long/", 5);
    longtag[200] = '\0';
    for (int s = 0; s < 25; s++) {
        tfevents_scalar_t v[16] = {
            {"train/loss", s == 8 ? INFINITY : 11.0 - 0.375 * s},
            {"train/lr", 6e-4 * (s + 1) / 25},
            {"train/grad_norm", s == 7 ? NAN : 1.5 + s},
            {"perf/tokens_per_s", 12345.5 * (s + 1)},
            {"perf/mfu", 0.01 * s},
            {"mem/peak_params_bytes", 1048576.0 * (s + 1)},
            {"comm/exposed_ms", s == 9 ? -INFINITY : 0.0},
        };
        int n = 7;
        if (s % 5 == 0)
            v[n++] = (tfevents_scalar_t){"val/loss", 10.5 - 0.25 * s};
        if (s == 13) {
            v[n++] = (tfevents_scalar_t){longtag, 13.0};
            v[n++] = (tfevents_scalar_t){"\xc3\xbc/\xce\xa9", -2.0}; /* UTF-8 u-umlaut, Omega */
        }
        put(w, exp, s, WALL0 + 0.25 * s, v, n);
    }
    tfevents_scalar_t last = {"train/loss", 1.0};
    put(w, exp, 1LL << 40, WALL0 + 100, &last, 1);
    put(w, exp, -5, WALL0 + 101, &last, 1);
    printf("%s\n", tfevents_path(w));
    int rc = tfevents_close(w, err, sizeof err);
    check(rc == 0, rc == 0 ? "closed" : err);
    check(fclose(exp) == 0, "expected.txt written");
    return 0;
}

/* metrics_write_tfevents's tags, spelt out (the trainer's contract) */
static int metrics(const char *dir)
{
    static const char *const tags[] = {"train/loss",
                                       "val/loss",
                                       "train/lr",
                                       "train/grad_norm",
                                       "perf/tokens_per_s",
                                       "perf/mfu",
                                       "perf/step_ms",
                                       "comm/exposed_ms",
                                       "mem/peak_parameters_bytes",
                                       "mem/peak_gradients_bytes",
                                       "mem/peak_optimizer_bytes",
                                       "mem/peak_activations_bytes",
                                       "mem/peak_communication_bytes",
                                       "mem/peak_workspace_bytes",
                                       "mem/peak_total_bytes"};
    step_record_t r = {.step = 42,
                       .steps = 100,
                       .loss = 3.25,
                       .val_loss = 3.5,
                       .lr = 3e-4,
                       .grad_norm = 0.75,
                       .ms = 120.5,
                       .tokens_per_s = 8192,
                       .mfu = 0.4,
                       .comm_ms = 12.25,
                       .mem_peak = {1 << 20, 1 << 21, 1 << 22, 3 << 20, 5 << 10, 7 << 10, (15 << 20) + (12 << 10)}};
    char err[ERRLEN], path[4096];
    tfevents_t *w;
    snprintf(path, sizeof path, "%s/expected.txt", dir);
    FILE *exp = NULL;
    if (tfevents_open(dir, "metrics", 1, WALL0, &w, err, sizeof err) != 0 || !(exp = fopen(path, "w"))) {
        check(0, exp ? err : "cannot create expected.txt");
        return 1;
    }
    fprintf(exp, "0\t%.17g\tfile_version\tbrain.Event:2\n", WALL0);
    for (int pass = 0; pass < 2; pass++) {
        double vals[] = {r.loss, r.val_loss, r.lr, r.grad_norm, r.tokens_per_s, r.mfu, r.ms, r.comm_ms};
        double wall = WALL0 + r.step;
        if (metrics_write_tfevents(w, &r, wall, err, sizeof err) != 0)
            check(0, err);
        for (int i = 0; i < (int)(sizeof tags / sizeof *tags); i++)
            if (i != 1 || !isnan(r.val_loss))
                fprintf(exp, "%d\t%.17g\t%s\t%.17g\n", r.step, wall, tags[i],
                        i < 8 ? vals[i] : (double)r.mem_peak[i - 8]);
        r.step = 43;
        r.val_loss = NAN; /* no validation this step: no val/loss */
        r.loss = 3.125;
    }
    printf("%s\n", tfevents_path(w));
    int rc = tfevents_close(w, err, sizeof err);
    check(rc == 0, rc == 0 ? "closed" : err);
    check(fclose(exp) == 0, "expected.txt written");
    return 0;
}

/* --metrics lines with and without non-finite values (test_tfevents.sh
 * reads them). */
static int json(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        check(0, "cannot create m.jsonl");
        return 1;
    }
    step_record_t r = {
        .step = 7, .loss = 3.25, .val_loss = NAN, .lr = 3e-4, .grad_norm = 0.75, .ms = 120.5, .mfu = 0.4};
    check(metrics_write_json(f, &r) == 0, "finite record written");
    r.step = 8;
    r.loss = NAN;
    r.grad_norm = INFINITY;
    r.val_loss = -INFINITY;
    check(metrics_write_json(f, &r) == 0, "non-finite record written");
    check(fclose(f) == 0, "m.jsonl closed");
    return 0;
}

/* A 4 KiB file size limit: writes fail with EFBIG (SIGXFSZ ignored). */
static int fsize(const char *dir)
{
    char err[ERRLEN];
    tfevents_t *w;
    if (tfevents_open(dir, "host", 7, WALL0, &w, err, sizeof err) != 0) {
        check(0, err);
        return 1;
    }
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {4096, 4096};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) {
        check(0, "setrlimit RLIMIT_FSIZE");
        return 1;
    }
    tfevents_scalar_t v = {"train/loss", 2.5};
    int step = 1;
    while (step < 10000 && tfevents_scalars(w, step, WALL0 + step, &v, 1, err, sizeof err) == 0)
        step++;
    check(step > 50 && step < 10000, "writes stop at the limit");
    fprintf(stderr, "%s\n", err);
    char again[ERRLEN];
    check(tfevents_scalars(w, step + 1, WALL0, &v, 1, again, sizeof again) != 0 && strstr(again, "earlier write"),
          "a write after the failure refused");
    tfevents_close(w, NULL, 0);
    return 1;
}

static int open_only(const char *dir)
{
    char err[ERRLEN];
    tfevents_t *w;
    if (tfevents_open(dir, "host", 7, WALL0, &w, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    tfevents_close(w, NULL, 0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s golden|write|metrics|json|fsize|open DIR\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1], *dir = argv[2];
    int rc = strcmp(mode, "golden") == 0    ? golden(dir)
             : strcmp(mode, "write") == 0   ? write_run(dir)
             : strcmp(mode, "metrics") == 0 ? metrics(dir)
             : strcmp(mode, "json") == 0    ? json(dir)
             : strcmp(mode, "fsize") == 0   ? fsize(dir)
             : strcmp(mode, "open") == 0    ? open_only(dir)
                                            : 2;
    if (rc == 2)
        fprintf(stderr, "unknown mode '%s'\n", mode);
    if (strcmp(mode, "open") != 0)
        printf("%d failure(s)\n", fails);
    return rc ? rc : fails != 0;
}
