// Compiles kernels/attention/fused_decode.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "fused_decode.cu"
