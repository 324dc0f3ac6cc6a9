// Compiles kernels/quant/rows.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "rows.cu"
