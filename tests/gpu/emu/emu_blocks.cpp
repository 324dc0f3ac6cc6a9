// Compiles kernels/quant/blocks.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "blocks.cu"
