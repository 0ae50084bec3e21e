/* comm_local.c -- iflow_comm between the threads of one process (comm.h): the processes of a
 * plan as threads sharing memory, for CPU virtual devices and for tests of the several-process
 * forward pass without a launcher.
 *
 * A collective (bcast, allreduce_sum) is two barriers: at the first every rank has posted its
 * buffer, between them each rank reads the others' (and writes only its own result aside), after
 * the second each writes its buffer. A send is synchronous: it posts its buffer in the
 * (from, to) mailbox and waits until the receiver has copied it. */
#include "comm.h"
#include "libcore/base/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const void *buf;
    size_t bytes;
    int full, taken;
} mailbox;

typedef struct {
    int n;
    pthread_barrier_t bar;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const void **posted;   /* [n] each rank's buffer in the current collective */
    size_t *sizes;         /* [n] and its size in bytes */
    mailbox *box;          /* [from * n + to] */
    iflow_comm *comms;     /* [n] */
} shared;

static shared *of(iflow_comm *c) { return c->impl; }

/* Post buf for a collective and wait for every rank's. */
static void post(iflow_comm *c, const void *buf, size_t bytes)
{
    shared *s = of(c);
    s->posted[c->rank] = buf;
    s->sizes[c->rank] = bytes;
    pthread_barrier_wait(&s->bar);
}

static int sizes_differ(iflow_comm *c, size_t bytes, const char *op)
{
    shared *s = of(c);
    for (int r = 0; r < s->n; r++)
        if (s->sizes[r] != bytes)
            return iflow_seterr(IFLOW_EINVAL, "%s of %zu bytes on rank %d, but %zu on rank %d", op, bytes, c->rank,
                                s->sizes[r], r);
    return 0;
}

static int c_bcast(iflow_comm *c, void *buf, size_t bytes, int root)
{
    shared *s = of(c);
    if (root < 0 || root >= s->n)
        return iflow_seterr(IFLOW_EINVAL, "broadcast from rank %d of %d", root, s->n);
    post(c, buf, bytes);
    int rc = sizes_differ(c, bytes, "a broadcast");
    if (rc == 0 && c->rank != root)
        memcpy(buf, s->posted[root], bytes);
    pthread_barrier_wait(&s->bar);
    return rc;
}

/* buf = the sum of every rank's buf, added in rank order (the same bits on every rank). */
static int c_allreduce(iflow_comm *c, float *buf, size_t n)
{
    shared *s = of(c);
    float *sum = malloc(n ? n * sizeof *sum : 1);
    post(c, buf, n * sizeof *buf);
    int rc = sum ? sizes_differ(c, n * sizeof *buf, "an all-reduce") : iflow_seterr(IFLOW_ENOMEM, "out of memory");
    for (int r = 0; r < s->n && rc == 0; r++) {
        const float *x = s->posted[r];
        for (size_t i = 0; i < n; i++)
            sum[i] = r ? sum[i] + x[i] : x[i];
    }
    pthread_barrier_wait(&s->bar);
    if (rc == 0)
        memcpy(buf, sum, n * sizeof *buf);
    free(sum);
    return rc;
}

static int c_send(iflow_comm *c, const void *buf, size_t bytes, int to)
{
    shared *s = of(c);
    if (to < 0 || to >= s->n || to == c->rank)
        return iflow_seterr(IFLOW_EINVAL, "send from rank %d to rank %d of %d", c->rank, to, s->n);
    mailbox *b = &s->box[(size_t)c->rank * s->n + to];
    pthread_mutex_lock(&s->mu);
    *b = (mailbox){.buf = buf, .bytes = bytes, .full = 1};
    pthread_cond_broadcast(&s->cv);
    while (!b->taken)
        pthread_cond_wait(&s->cv, &s->mu);
    int rc = b->bytes == bytes ? 0 : iflow_seterr(IFLOW_EINVAL, "rank %d sent %zu bytes to rank %d, which expected %zu",
                                                  c->rank, bytes, to, b->bytes);
    *b = (mailbox){0};
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int c_recv(iflow_comm *c, void *buf, size_t bytes, int from)
{
    shared *s = of(c);
    if (from < 0 || from >= s->n || from == c->rank)
        return iflow_seterr(IFLOW_EINVAL, "receive on rank %d from rank %d of %d", c->rank, from, s->n);
    mailbox *b = &s->box[(size_t)from * s->n + c->rank];
    pthread_mutex_lock(&s->mu);
    while (!b->full || b->taken)
        pthread_cond_wait(&s->cv, &s->mu);
    int rc = b->bytes == bytes ? 0 : iflow_seterr(IFLOW_EINVAL, "rank %d expected %zu bytes from rank %d, which sent %zu",
                                                  c->rank, bytes, from, b->bytes);
    if (rc == 0)
        memcpy(buf, b->buf, bytes);
    b->bytes = bytes; /* what the sender checks */
    b->taken = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static const iflow_comm_ops local_ops = {c_bcast, c_allreduce, c_send, c_recv};

int iflow_comm_local_open(iflow_comm **comms, int n)
{
    if (n < 1)
        return iflow_seterr(IFLOW_EINVAL, "a communicator of %d ranks", n);
    shared *s = calloc(1, sizeof *s);
    if (!s)
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    s->n = n;
    s->posted = calloc((size_t)n, sizeof *s->posted);
    s->sizes = calloc((size_t)n, sizeof *s->sizes);
    s->box = calloc((size_t)n * n, sizeof *s->box);
    s->comms = calloc((size_t)n, sizeof *s->comms);
    if (!s->posted || !s->sizes || !s->box || !s->comms || pthread_barrier_init(&s->bar, NULL, (unsigned)n) != 0) {
        free(s->posted), free(s->sizes), free(s->box), free(s->comms), free(s);
        return iflow_seterr(IFLOW_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int r = 0; r < n; r++) {
        s->comms[r] = (iflow_comm){.ops = &local_ops, .rank = r, .size = n, .device_buffers = 1, .impl = s};
        comms[r] = &s->comms[r];
    }
    return 0;
}

void iflow_comm_local_close(iflow_comm **comms, int n)
{
    if (n < 1 || !comms[0])
        return;
    shared *s = of(comms[0]);
    pthread_barrier_destroy(&s->bar);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->posted);
    free(s->sizes);
    free(s->box);
    free(s->comms);
    free(s);
    for (int r = 0; r < n; r++)
        comms[r] = NULL;
}
