// tests/gpu/emu/cuda_runtime.h — host emulator stand-in for <cuda_runtime.h> (see cuda_emu.h).
#pragma once
#include "cuda_emu.h"
#include "cuda_runtime_api.h"
