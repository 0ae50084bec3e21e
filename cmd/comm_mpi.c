/* comm_mpi.c -- iflow_comm over MPI. See comm_mpi.h. */
#include "cmd/comm_mpi.h"
#include "libcore/base/error.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>

/* An MPI failure as a libiflow error naming the call. */
static int mpi_fail(const char *call, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return iflow_seterr(IFLOW_EIO, "%s failed: %.*s", call, len, msg);
}

static int too_big(size_t bytes)
{
    return bytes > INT_MAX ? iflow_seterr(IFLOW_ERANGE, "a message of %zu bytes is too large for MPI", bytes) : 0;
}

static int c_bcast(iflow_comm *c, void *buf, size_t bytes, int root)
{
    int rc = too_big(bytes);
    if (rc == 0 && (rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD)) != MPI_SUCCESS)
        return mpi_fail("MPI_Bcast", rc);
    return rc;
}

static int c_allreduce(iflow_comm *c, float *buf, size_t n)
{
    int rc = too_big(n * sizeof(float));
    if (rc == 0 && (rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)) != MPI_SUCCESS)
        return mpi_fail("MPI_Allreduce", rc);
    return rc;
}

static int c_send(iflow_comm *c, const void *buf, size_t bytes, int to)
{
    int rc = too_big(bytes);
    if (rc == 0 && (rc = MPI_Send(buf, (int)bytes, MPI_BYTE, to, 0, MPI_COMM_WORLD)) != MPI_SUCCESS)
        return mpi_fail("MPI_Send", rc);
    return rc;
}

static int c_recv(iflow_comm *c, void *buf, size_t bytes, int from)
{
    int rc = too_big(bytes);
    if (rc == 0 && (rc = MPI_Recv(buf, (int)bytes, MPI_BYTE, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
        return mpi_fail("MPI_Recv", rc);
    return rc;
}

static const iflow_comm_ops mpi_ops = {c_bcast, c_allreduce, c_send, c_recv};

/* Launched by mpirun (Open MPI, or a PMI launcher) with more than one process. */
static int launched_by_mpirun(void)
{
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (!n)
        n = getenv("PMI_SIZE");
    return n && atoi(n) > 1;
}

iflow_comm *comm_mpi_open(const iflow_tool *t)
{
    if (!launched_by_mpirun())
        return NULL;
    int rc = MPI_Init(NULL, NULL);
    if (rc != MPI_SUCCESS) {
        mpi_fail("MPI_Init", rc);
        die(t, NULL);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    iflow_comm *c = calloc(1, sizeof *c);
    if (!c)
        die(t, "out of memory");
    c->ops = &mpi_ops;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    return c;
}

void comm_mpi_close(iflow_comm *c)
{
    if (!c)
        return;
    MPI_Finalize();
    free(c);
}
