// latentq/attention/attention.h — the absorbed MLA attention check for one layer: everything of
// latentq_attention in one include.
//   latentq/attention/types.h         dims, queries, results, key ranges, the mixed cache, the device layout
//   latentq/attention/engine.h        AbsorbedAttention (the CPU engine, the device seam AttentionDevice), the
//                                     unabsorbed reference
//   latentq/attention/metrics.h       attention_error, AttentionReference, kl_row
//   latentq/attention/decode_order.h  decode_order_attention (sink and residual window in bf16)
//   latentq/attention/fold.h          fold_check, require_fold_exact
//   latentq/attention/device_seam.h   AttentionDeviceFactory
//   latentq/attention/v4.h            V4Attention: DeepSeek-V4's window, compressed entries, CSA selection, sinks
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <Eigen/Dense>

#include "latentq/attention/decode_order.h"
#include "latentq/attention/device_seam.h"
#include "latentq/attention/engine.h"
#include "latentq/attention/fold.h"
#include "latentq/attention/metrics.h"
#include "latentq/attention/types.h"
#include "latentq/attention/v4.h"
#include "latentq/decode_order.h"
#include "latentq/spec.h"
#include "latentq/transform.h"
