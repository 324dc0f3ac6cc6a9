// Compiles kernels/quant/turboquant.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "turboquant.cu"
