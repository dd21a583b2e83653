# mpi_env.sh — sourced before mpirun on a small machine: Open MPI as root, more ranks than cores, no
# cross-memory attach (unavailable in many containers), and one thread per rank (OpenBLAS's and OpenMP's)
# for programs that do not choose their own (set OPENBLAS_NUM_THREADS / OMP_NUM_THREADS yourself to
# override). moe-train and bench_moe_layer set theirs from --threads (default: this rank's share of the CPUs).
if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
