// Compiles kernels/quant/tensor.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "tensor.cu"
