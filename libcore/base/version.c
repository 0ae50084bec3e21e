/* version.c -- the library's version and its free(); see include/iflow.h. */
#include "include/iflow.h"

#include <stdlib.h>

unsigned iflow_version_number(void)
{
    return IFLOW_VERSION_NUMBER;
}

const char *iflow_version_string(void)
{
    return IFLOW_VERSION_STRING;
}

void iflow_free(void *p)
{
    free(p);
}
