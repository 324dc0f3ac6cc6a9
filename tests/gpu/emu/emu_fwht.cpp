// Compiles kernels/quant/fwht.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "fwht.cu"
