/* cuda_bf16.h of the CPU emulation: see tests/cuda-emu/cuda_emu.h */
#include "../cuda_emu.h"
