// Compiles kernels/attention/attention.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "attention.cu"
