/* dtrain: train GPT-2 and Llama style transformers. */
#include <stdio.h>

#include "launch.h"
#include "options.h"
#include "train.h"

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
    if (launch_any_failed(&env, "dtrain", env.world_size != 1,
                          "this version trains on one rank; run it without mpirun, or with -np 1 "
                          "(tensor, pipeline and data parallelism are not implemented yet)"))
        launch_exit(&env, 2);

    trainer_t tr;
    int failed = trainer_setup(&tr, &opt, &env, err, sizeof err) != 0;
    if (launch_any_failed(&env, "dtrain", failed, err)) {
        trainer_teardown(&tr);
        launch_exit(&env, 2);
    }
    if (env.world_rank == 0)
        trainer_banner(&tr, stdout);
    failed = trainer_run(&tr, err, sizeof err) != 0;
    int status = launch_any_failed(&env, "dtrain", failed, err) ? 1 : 0;
    trainer_teardown(&tr);
    launch_exit(&env, status);
    return status;
}
