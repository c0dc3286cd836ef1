# shellcheck shell=bash
# Sourced by the scripts: OpenMPI as root, one BLAS thread per rank (ranks share the cores), and
# oversubscription so that np can exceed the core count on a laptop or CI machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# shellcheck disable=SC2034  # for the scripts that source this file
MPIRUN=(mpirun --oversubscribe --bind-to none)
