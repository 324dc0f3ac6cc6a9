// quant/src/cpu/int_baseline.cpp — CpuKernel::Baseline: the fused integer kernels (int_fused.h) compiled
// for the baseline ISA (x86-64: SSE2).
#include "int_fused.h"

namespace latentq::cpu {

uint32_t int_quantize_baseline(const IntJob& job) { return int_quantize_body<false>(job); }
void int_dequantize_baseline(const DecJob& job) { int_dequantize_body(job); }
uint32_t minmax_span_baseline(const float* x, int64_t n, float& mn, float& mx) { return minmax_span(x, n, mn, mx); }

}  // namespace latentq::cpu
