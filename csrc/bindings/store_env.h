// The Env the bindings open every BlockStore through: Env::Default() unless a test installed
// another (testing_binding.cpp). Stores keep the Env they were opened with.
#pragma once

#include "storage/env.h"

namespace mtrains {

Env* BindingStoreEnv();
// `env` (not owned) must live as long as any store opened through it; null: the default.
void SetBindingStoreEnv(Env* env);

}  // namespace mtrains
