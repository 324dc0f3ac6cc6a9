// Compiles kernels/quant/lloyd_max.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "lloyd_max.cu"
