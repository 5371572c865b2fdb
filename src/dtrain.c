/* dtrain: train GPT-2 and Llama style transformers. */
#include <stdio.h>

#include "mpi/grid.h"
#include "mpi/launch.h"
#include "src/backend/backend.h"
#include "src/plan/plan.h"
#include "src/train/options.h"
#include "src/train/train.h"

/* --selftest: every rank tests its own GPU; rank 0 prints its
 * comparisons. Ends the process. */
static void selftest(const launch_env_t *env, char *err, size_t errlen)
{
    FILE *out = env->world_rank == 0 ? stdout : fopen("/dev/null", "w");
    int rc = out ? backend_selftest(env->local_rank, out, err, errlen) : -1;
    if (!out)
        snprintf(err, errlen, "--selftest: cannot open /dev/null");
    if (out && out != stdout)
        fclose(out);
    fflush(stdout);
    if (launch_any_failed(env, "dtrain", rc < 0, err))
        launch_exit(env, 2);
    snprintf(err, errlen, "--selftest: %d comparison(s) outside their bounds", rc);
    launch_exit(env, launch_any_failed(env, "dtrain", rc > 0, err) ? 1 : 0);
}

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);

    run_options_t opt;
    char err[1024] = "";
    options_status_t st = options_parse(&opt, argc, argv, env.world_rank == 0, err, sizeof err);
    if (st == OPTIONS_EXIT_OK)
        launch_exit(&env, 0);
    /* every rank parses the same arguments, so all agree without talking */
    if (st == OPTIONS_ERROR) {
        if (env.world_rank == 0)
            fprintf(stderr, "dtrain: error: %s\n", err);
        launch_exit(&env, 2);
    }

    /* --plan: a prediction, no training and no grid; every rank computes
     * the same plan (rank 0 prints it) so all exit alike */
    if (opt.plan) {
        int failed = plan_run(&opt, env.world_size, env.world_rank == 0, stdout, err, sizeof err) != 0;
        launch_exit(&env, launch_any_failed(&env, "dtrain", failed, err) ? 2 : 0);
    }

    if (opt.selftest)
        selftest(&env, err, sizeof err);

    /* from here on SIGUSR1/SIGTERM stop the run at a step boundary, with a
     * checkpoint, instead of killing it */
    int failed = launch_catch_stop_signals() != 0;
    if (launch_any_failed(&env, "dtrain", failed,
                          "cannot install the SIGUSR1/SIGTERM handlers or ignore SIGPIPE: sigaction failed"))
        launch_exit(&env, 1);

    /* --cp N: the grid's DP axis holds dp x cp ranks (grid.h), the CP
     * groups carved out of it by trainer_setup */
    const int cp = opt.cp > 1 ? opt.cp : 1;
    if (cp > 1 && (opt.tp < 1 || opt.pp < 1 || env.world_size % (opt.tp * opt.pp * cp) != 0)) {
        if (env.world_rank == 0)
            fprintf(stderr,
                    "dtrain: error: world size %d is not divisible by --tp %d x --cp %d x --pp %d = %d: launch "
                    "a multiple of %d ranks\n",
                    env.world_size, opt.tp, cp, opt.pp, opt.tp * cp * opt.pp, opt.tp * cp * opt.pp);
        launch_exit(&env, 2);
    }
    grid_t grid;
    char gerr[COMM_ERR_MAX] = "";
    failed = grid_create(&grid, opt.tp, opt.pp, opt.dp * cp, gerr, sizeof gerr) != STATUS_OK;
    if (launch_any_failed(&env, "dtrain", failed, gerr))
        launch_exit(&env, 2);

    /* the run, resolved once for this grid: every component takes its
     * part of it; the same options give the same verdict on every rank */
    static run_config_t run; /* static: the stage split makes it 16 KiB */
    failed = options_resolve(&opt, grid.tp_size, grid.pp_size, grid.dp_size / cp, &run, err, sizeof err) != 0;
    if (launch_any_failed(&env, "dtrain", failed, err)) {
        grid_destroy(&grid);
        launch_exit(&env, 2);
    }
    trainer_t tr;
    failed = trainer_setup(&tr, &run, &env, &grid, err, sizeof err) != 0;
    if (launch_any_failed(&env, "dtrain", failed, err)) {
        backend_comm_abort(&tr.backend);
        trainer_teardown(&tr);
        grid_destroy(&grid);
        launch_exit(&env, 2);
    }
    trainer_banner(&tr, stdout);
    /* every replica starts from the identical model (init is a pure
     * function of the seed); verify it before spending compute */
    failed = launch_any_failed(&env, "dtrain", trainer_check_replicas(&tr, 0, err, sizeof err) != 0, err);
    if (!failed) {
        failed = trainer_run(&tr, err, sizeof err) != 0;
        failed = launch_any_failed(&env, "dtrain", failed, err);
    }
    /* a failed step may have left collectives in flight on peers that gave up */
    if (failed)
        backend_comm_abort(&tr.backend);
    trainer_teardown(&tr);
    grid_destroy(&grid);
    launch_exit(&env, failed ? 1 : 0);
    return failed ? 1 : 0;
}
