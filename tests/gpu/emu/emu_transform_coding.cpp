// Compiles kernels/quant/transform_coding.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "transform_coding.cu"
