/* What a run reports: the startup banner, one line per step on rank 0, and
 * the --metrics file (one JSON object per step). */
#ifndef DTRAIN_METRICS_H
#define DTRAIN_METRICS_H

#include <stdio.h>

#include "base/mem.h"
#include "io/tfevents.h"
#include "src/train/straggler.h"

#define METRICS_MC_MAX 8 /* --eval-mc files */

typedef struct step_record {
    int step, steps; /* 1-based step just finished, total */
    double loss;     /* mean training loss of the step's global batch */
    double val_loss; /* NAN when not computed this step */
    double lr, grad_norm;
    double ms, tokens_per_s, mfu; /* mfu as a fraction */
    /* per rank: compute = step time less exposed communication (time
     * blocked in the gradient all-reduce wait and in tensor-parallel
     * collectives) and less the pipeline bubble; max and mean over ranks */
    double compute_ms_max, compute_ms_mean;
    double comm_ms, comm_ms_mean; /* comm_ms is the max */
    double a2a_ms, a2a_ms_mean;   /* --ep: the part of comm in the experts' all-to-alls (max, mean) */
    /* --cp: the part of comm waiting for the ring attention's messages
     * (exposed: after the step's block was computed), and the ring's whole
     * time, attention compute included (max, mean over ranks) */
    double ring_ms, ring_ms_mean, ring_attn_ms, ring_attn_ms_mean;
    /* the ring's time less its exposed waits (the attention a rank
     * computes, max and mean): the CP group's load balance */
    double ring_busy_ms, ring_busy_ms_mean;
    /* fraction of the step a rank spent waiting for a neighbour pipeline
     * stage (warm-up, cool-down, imbalance); 0 without pipelining */
    double bubble_max, bubble_mean;
    /* high-water marks of the accounting allocator, bytes, max over
     * ranks: one per category (base/mem.h order), then the total's */
    long long mem_peak[MEM_N_CATEGORIES + 1];
    /* ms the checkpoints written since the previous record held training
     * up (the boundary before this step: the whole save, or with
     * --ckpt-async the copy to host and any wait for a write); 0: none */
    double ckpt_stall_ms;
    /* seconds left to --steps and to the next checkpoint at the recent
     * steps' pace (metrics_eta); 0: not shown */
    double left_s, ckpt_left_s;
    straggler_report_t straggler; /* --straggler-every; steps 0: none this step */
    /* MoE layers (n_moe of them; 0: a dense model): per layer l of
     * moe_layer[l] the step's load-balancing loss, z-loss, busiest expert's
     * tokens over the mean, and dropped share of the assignments (model
     * layer numbers in moe_index); the step line shows their means */
    int n_moe;
    const int *moe_index;
    const double (*moe_layer)[4];
    const char *skipped;          /* NULL, or why the spike guard skipped the update: "loss_spike", "nonfinite" */
    /* --eval-mc: the files scored after this step (n_mc 0: none): name (the
     * file's base name less its extension), accuracy by the summed loss
     * (acc) and by the mean loss per token (acc_norm), examples */
    int n_mc;
    struct {
        const char *name;
        double acc, acc_norm;
        int examples;
    } mc[METRICS_MC_MAX];
} step_record_t;

/* The recent steps' times, for the time left: the mean of the last
 * METRICS_ETA_WINDOW steps, leaving out the job's first step (warm-up:
 * page faults, library start-up) once there are others. */
#define METRICS_ETA_WINDOW 10
typedef struct step_eta {
    double ms[METRICS_ETA_WINDOW], first_ms;
    int n, next, seen_first;
} step_eta_t;

/* Adds r's step time to e and sets r->left_s (to r->steps) and, with
 * ckpt_every > 0 (--ckpt-dir and --ckpt-every), r->ckpt_left_s: to the next
 * multiple of ckpt_every, or to `end` (this job's last step, which is
 * checkpointed too) when that comes first. */
void metrics_eta(step_eta_t *e, step_record_t *r, int ckpt_every, int end);
/* "45s", "3m10s", "2h05m", "3d04h" */
void metrics_format_duration(char *buf, size_t len, double s);

/* The step line, ending in "| 3m10s left, ckpt in 1m05s" (each part when
 * at least a second), and the straggler line when r reports one. */
void metrics_print_step(FILE *out, const step_record_t *r);
/* The record as one JSON line; the straggler's fields (straggler_rank,
 * straggler_host, straggler_ms, straggler_median_ms, straggler_first_step)
 * when reported, and "skipped" with its reason on a skipped step. f is
 * unbuffered (setvbuf _IONBF): the line is formatted in memory and
 * appended whole or not at all (a failed write is cut back), so a full
 * disk never leaves a torn last line. Returns 0, or -1 (errno set) if the
 * write failed. */
int metrics_write_json(FILE *f, const step_record_t *r);
/* The untrained model's validation line, {"step": 0, "val_loss": V}, a
 * non-finite V as null like every record. 0, or -1 if the write failed. */
int metrics_write_json_val0(FILE *f, double val_loss);
/* The record as one TensorBoard Event at r->step, stamped wall_time
 * (tfevents_now()): train/loss, val/loss (when computed), train/lr,
 * train/grad_norm, perf/tokens_per_s, perf/mfu (a fraction), perf/step_ms,
 * comm/exposed_ms (max over ranks), mem/peak_<category>_bytes (the
 * --metrics names: parameters, gradients, ...) and
 * mem/peak_total_bytes, train/skipped = 1 on a step whose update the
 * spike guard skipped, and eval/NAME/acc and eval/NAME/acc_norm for each
 * --eval-mc file scored. Returns 0, or -1 with one line in err. */
int metrics_write_tfevents(tfevents_t *w, const step_record_t *r, double wall_time, char *err, size_t errlen);
/* "1.23 GiB" style */
void metrics_format_bytes(char *buf, size_t len, double bytes);

#endif
