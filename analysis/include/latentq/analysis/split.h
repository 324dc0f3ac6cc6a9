// latentq/analysis/split.h — the fit / held-out token split is defined in latentq/split.h (quant/), where the
// fitted quantizers (Lloyd-Max codebooks) use it too; the probes include it from here.
#pragma once

#include "latentq/split.h"
