/* nccl.h of the CPU emulation: NCCL's types, for kernels/cuda/nccl.cu to compile. There is no
 * emulated NCCL: nccl.cu's dlopen() of libnccl.so.2 finds none (unless IFLOW_NCCL names one)
 * and its callers report NCCL missing. See tests/cuda-emu/cuda_emu.h. */
#ifndef IFLOW_EMU_NCCL_H
#define IFLOW_EMU_NCCL_H
#include "../cuda_emu.h"

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef struct emu_nccl_comm *ncclComm_t;
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
               ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
               ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
#endif
