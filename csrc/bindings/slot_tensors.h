// A table's TBE weights and optimizer state as the step mover sees them (kernel/slot_rows.h).
#pragma once

#include <ATen/ATen.h>

#include "kernel/slot_rows.h"

namespace mtrains {

// weights: [slots, dim]; state: empty (no optimizer state) or a row per slot.
inline SlotRows SlotsOf(const at::Tensor& weights, const at::Tensor& state) {
  TORCH_CHECK_VALUE(weights.device().is_cpu() && weights.dim() == 2 && weights.is_contiguous(),
                    "weights must be a contiguous 2-D CPU tensor");
  SlotRows s;
  s.weights = static_cast<uint8_t*>(weights.data_ptr());
  s.weight_bytes = size_t(weights.size(1)) * weights.element_size();
  s.slots = weights.size(0);
  if (state.numel()) {
    TORCH_CHECK_VALUE(state.device().is_cpu() && state.is_contiguous() && state.dim() >= 1 &&
                          state.size(0) == weights.size(0),
                      "state must be a contiguous CPU tensor with a row per slot");
    s.state = static_cast<uint8_t*>(state.data_ptr());
    s.state_bytes = size_t(state.numel() / state.size(0)) * state.element_size();
  }
  return s;
}

}  // namespace mtrains
