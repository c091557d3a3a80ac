// The C++ objects behind a kernel's TorchScript handles (torch.classes.mtrains.KernelCacheIndex,
// StepMover and VirtualIds), for the step engine's binding, which drives them.
#pragma once

#include <ATen/core/ivalue.h>

#include "cache/kernel_cache_index.h"
#include "kernel/step_mover.h"
#include "kernel/virtual_ids.h"

namespace mtrains {

// The object `handle` holds (TORCH_CHECK_VALUE naming the expected class otherwise), and in
// `keep` a reference that keeps it alive.
KernelCacheIndex* KernelCacheIndexOfHandle(const c10::IValue& handle,
                                           c10::intrusive_ptr<c10::intrusive_ptr_target>* keep);
StepMover* StepMoverOfHandle(const c10::IValue& handle, c10::intrusive_ptr<c10::intrusive_ptr_target>* keep);
// Null for None.
VirtualIds* VirtualIdsOfHandle(const c10::IValue& handle, c10::intrusive_ptr<c10::intrusive_ptr_target>* keep);

}  // namespace mtrains
