/*
 * comm_mpi.h -- the programs' side of running one model as several processes: MPI (Debian's
 * Open MPI) behind libcore's iflow_comm (libcore/engine/comm.h).
 *
 *   mpirun -np N iflow-run -m MODEL --plan PLAN -p PROMPT     (PLAN with N devices)
 *
 * comm_mpi_open() starts MPI when this process was launched by mpirun with more than one
 * process (it looks at Open MPI's and PMI's environment), and returns NULL otherwise, so a
 * plain run never touches MPI. Failures exit through die().
 */
#ifndef IFLOW_CMD_COMM_MPI_H
#define IFLOW_CMD_COMM_MPI_H

#include "cmd/opt.h"
#include "libcore/engine/comm.h"

iflow_comm *comm_mpi_open(const iflow_tool *t);
void comm_mpi_close(iflow_comm *c);

#endif
