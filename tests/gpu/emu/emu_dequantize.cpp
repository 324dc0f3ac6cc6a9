// Compiles kernels/quant/dequantize.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "dequantize.cu"
