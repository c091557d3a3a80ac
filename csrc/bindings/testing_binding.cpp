// The testing part of the extension: device faults for Python tests
// (torchrec_mtrains/testing/device_faults.py). Stores opened after use_fault_injecting_env
// live on a FaultInjectingEnv over the default one; production never turns it on.
#include <torch/library.h>

#include <cerrno>
#include <string>
#include <tuple>

#include "bindings/store_env.h"
#include "testing/fault_injecting_env.h"

namespace mtrains {
namespace {

FaultInjectingEnv* FaultEnv() {
  static FaultInjectingEnv* const env = new FaultInjectingEnv(Env::Default());  // never deleted
  return env;
}

void UseFaultInjectingEnv(bool enabled) { SetBindingStoreEnv(enabled ? FaultEnv() : nullptr); }

std::tuple<int64_t, int64_t, std::string> ArmDeviceFault(const std::string& path, const std::string& kind,
                                                         int64_t after, int64_t count, int64_t sys_errno,
                                                         bool on_map) {
  FaultKind k;
  if (kind == "read_error") k = FaultKind::kReadError;
  else if (kind == "write_error") k = FaultKind::kWriteError;
  else if (kind == "sync_error") k = FaultKind::kSyncError;
  else if (kind == "corrupt_read") k = FaultKind::kCorruptRead;
  else TORCH_CHECK_VALUE(false, "unknown fault kind '", kind, "'");
  TORCH_CHECK_VALUE(after >= 0 && count >= 0, "after and count must be >= 0");
  const Status st = FaultEnv()->Arm(path, on_map ? DeviceRole::kMeta : DeviceRole::kLog, k, after,
                                    count, static_cast<int>(sys_errno));
  return {static_cast<int64_t>(st.code()), st.sys_errno(), st.message()};
}

}  // namespace
}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  m.def("use_fault_injecting_env", &mtrains::UseFaultInjectingEnv);
  m.def("arm_device_fault", &mtrains::ArmDeviceFault);
}
