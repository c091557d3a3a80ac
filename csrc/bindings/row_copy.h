// Row copies between the TBE's cache slots and store rows (csrc/bindings/row_ops.cpp), for
// the bindings that move rows as part of a larger call.
#pragma once

#include <ATen/ATen.h>

namespace mtrains {

// rows[i] = weights[slots[i]] ++ state[slots[i]] (bytes), in `out_dtype`.
at::Tensor PackRows(const at::Tensor& weights, const c10::optional<at::Tensor>& state,
                    const at::Tensor& slots, at::ScalarType out_dtype);

// weights[slots[i]] ++ state[slots[i]] = rows[i] (bytes).
void UnpackRows(const at::Tensor& rows, const at::Tensor& slots, const at::Tensor& weights,
                const c10::optional<at::Tensor>& state);

}  // namespace mtrains
