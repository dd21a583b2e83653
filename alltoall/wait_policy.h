/* wait_policy.h — how a rank waits for its peers in the MPI transport's polling loops (comm_mpi.c), as OpenMP's
 * OMP_WAIT_POLICY, chosen by the environment variable MOE_WAIT_POLICY:
 *   active (the default): poll, yielding the CPU between polls. The fastest when each rank has a core, and also when
 *     only this job's ranks share the cores (a yield hands the core to the rank beside it);
 *   passive: after a short spin, sleep between polls, for a run that shares its cores with other programs: a
 *     sleeping rank is run again as soon as it wakes, while a yielding one may wait out another program's whole
 *     time slice at every exchange. The run gains what the other programs lose (scripts/test.sh's lanes do not use
 *     it: the compile on their critical path lost more than their runs gained; the GPU rehearsal's verify runs, after
 *     its build, do: scripts/gpu_check.sh --rehearse). Open MPI yields inside every MPI call that finds nothing to do
 *     when a job has more ranks than cores (mpi_yield_when_idle), and then passive gains nothing.
 * Measured on 2 cores, 2026-11-28 (docs/BENCHMARKS.md, "Ranks that share cores"): with the cores busy, a 2-rank
 * training run 41-45 s active against 19 s passive; on free cores passive makes 2-rank exchanges of 1 MiB and more
 * 1.5-3x slower (Open MPI moves a message's fragments only inside MPI calls) and 4 or 8 ranks on 2 cores 8-15%
 * slower a step. */
#ifndef MOE_ALLTOALL_WAIT_POLICY_H
#define MOE_ALLTOALL_WAIT_POLICY_H

#include "core/types.h"

typedef enum { MOE_WAIT_ACTIVE, MOE_WAIT_PASSIVE } moe_wait_policy;

/* The policy for a MOE_WAIT_POLICY value (NULL or empty: active); MOE_ERR_INVALID_ARG with a message naming the
 * variable for any other value. */
moe_status moe_wait_policy_resolve(const char *setting, moe_wait_policy *out);
/* moe_wait_policy_resolve of this process's environment. */
moe_status moe_wait_policy_here(moe_wait_policy *out);
/* Between two polls of a wait that began waited_s seconds ago: the first polls go straight on (a message that is
 * already on its way), then active yields the CPU, and passive sleeps once the wait has lasted 200 us. */
void moe_wait_pause(moe_wait_policy p, long polls, double waited_s);

#endif
