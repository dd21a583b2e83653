/* startup_watchdog.h — moe-train's start-up, from before MPI_Init to the end of the placement, runs outside every
 * exchange watchdog: a rank that never arrives in MPI_Init (stopped, or on an unreachable node) would hold the others
 * there forever. An alarm ends the process with a message instead (mpirun then ends the job). Its limit is
 * --startup-timeout, or with 0 (the default) --exchange-timeout's and at least 60 s: an exchange limit tight enough for
 * a step is no measure of an MPI_Init on busy or many nodes (a CI run's 2 loaded cores took over 2 s). */
#ifndef MOE_TRAIN_STARTUP_WATCHDOG_H
#define MOE_TRAIN_STARTUP_WATCHDOG_H

/* Before MPI_Init: the limit from argv's --startup-timeout / --exchange-timeout (a --config file is read later) */
void moe_startup_watchdog_start(int argc, char **argv);
/* Once the options are parsed (a --config file's values included): the limit they give, counted from the start */
void moe_startup_watchdog_rearm(float startup_timeout_s, float exchange_timeout_s);
/* The start-up is over: from here on the exchanges' own watchdog covers every wait */
void moe_startup_watchdog_stop(void);

#endif
