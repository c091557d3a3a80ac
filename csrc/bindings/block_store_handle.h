// Access to the BlockStore inside a torch.classes.mtrains.BlockStore object, for the
// bindings that hand a store to C++ code of their own (step_mover_binding.cpp).
#pragma once

#include <ATen/core/ivalue.h>

#include "common/status.h"
#include "storage/block_store.h"

namespace mtrains {

// Sets `store` to the open BlockStore of `handle` and `keep` to a reference that keeps it
// alive (the store stays valid until `keep` is released, closed or not). InvalidArgument
// when `handle` is not a BlockStore object, is not open, or was opened by another process.
Status BlockStoreOfHandle(const c10::IValue& handle, BlockStore** store, c10::intrusive_ptr<c10::intrusive_ptr_target>* keep);

}  // namespace mtrains
