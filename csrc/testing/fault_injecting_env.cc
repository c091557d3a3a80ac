#include "testing/fault_injecting_env.h"

namespace mtrains {

Status FaultInjectingEnv::Arm(const std::string& table_path, DeviceRole role, FaultKind kind,
                              uint64_t after, uint64_t count, int sys_errno) {
  std::shared_ptr<FaultPlan> plan;
  {
    MutexLock lock(&mu_);
    const auto it = plans_.find({table_path, role});
    if (it != plans_.end()) plan = it->second;
  }
  if (plan == nullptr)
    return Status::InvalidArgument("no " + std::string(role == DeviceRole::kMeta ? "map" : "log") +
                                   " device of " + table_path +
                                   " was opened through the fault-injecting environment");
  plan->Arm(kind, after, count, sys_errno);
  return Status::Ok();
}

FileDeviceOpenResult FaultInjectingEnv::OpenDevice(const std::string& table_path, DeviceRole role,
                                                   const FileDeviceOptions& options) {
  FileDeviceOpenResult r = base_->OpenDevice(table_path, role, options);
  if (!r.status.ok()) return r;
  auto plan = std::make_shared<FaultPlan>();
  r.device = std::make_unique<FaultInjectingDevice>(std::move(r.device), plan);
  MutexLock lock(&mu_);
  plans_[{table_path, role}] = std::move(plan);
  return r;
}

}  // namespace mtrains
