// Compiles kernels/quant/quantize_cuda.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "quantize_cuda.cu"
