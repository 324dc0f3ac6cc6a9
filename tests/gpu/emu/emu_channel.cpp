// Compiles kernels/quant/channel.cu as C++ against the host emulator (LQ_EMULATE, see cuda_emu.h).
#include "channel.cu"
