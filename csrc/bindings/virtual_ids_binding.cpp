// TorchScript binding of VirtualIds (torch.classes.mtrains.VirtualIds): a kernel's virtual
// tables between their id-keyed caches and their id indexes (kernel/virtual_ids.h), handed
// to the kernel's StepEngine, which resolves every step's cache misses through it.
#include <ATen/ATen.h>
#include <torch/custom_class.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

#include "bindings/engine_parts.h"
#include "bindings/id_index_handle.h"
#include "kernel/virtual_ids.h"

namespace mtrains {
namespace {

class VirtualIdsHandle : public torch::CustomClassHolder {
 public:
  // norm_eviction: the address of the L2-norm pass (NormEviction::evict; 0: none).
  VirtualIdsHandle(const c10::IValue& index, int64_t norm_eviction) {
    NormEviction norm;
    norm.evict = reinterpret_cast<decltype(norm.evict)>(static_cast<intptr_t>(norm_eviction));
    ids_ = std::make_unique<VirtualIds>(KernelCacheIndexOfHandle(index, &keep_index_), norm);
  }

  VirtualIds* ids() const { return ids_.get(); }

  void add(int64_t table, const std::string& name, const c10::intrusive_ptr<IdIndexHandle>& index,
           int64_t trigger_ids, double decay_rate, double count_threshold, int64_t ttl_seconds, bool by_norm,
           bool wall_clock) {
    TORCH_CHECK_VALUE(table >= 0 && trigger_ids >= 0 && ttl_seconds >= 0,
                      "table, trigger_ids and ttl_seconds must be >= 0");
    VirtualTable t;
    t.table = size_t(table);
    t.name = name;
    t.index = index->index();
    t.trigger_ids = uint64_t(trigger_ids);
    t.rule.decay_rate = decay_rate;
    t.rule.count_threshold = count_threshold;
    t.rule.ttl_seconds = uint64_t(ttl_seconds);
    t.by_norm = by_norm;
    t.wall_clock = wall_clock;
    try {
      ids_->Add(std::move(t));
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
    keep_ids_.push_back(index);
  }

  void set_now(int64_t table, int64_t now) { Checked([&] { ids_->SetNow(size_t(table), now); }); }
  int64_t next_pass_at(int64_t table) {
    int64_t v = 0;
    Checked([&] { v = int64_t(ids_->NextPassAt(size_t(table))); });
    return v;
  }
  // (ids found by the cache, ids looked up in the index)
  std::tuple<int64_t, int64_t> lookups(int64_t table) {
    std::pair<uint64_t, uint64_t> v;
    Checked([&] { v = ids_->Lookups(size_t(table)); });
    return {int64_t(v.first), int64_t(v.second)};
  }
  void restored(int64_t table, int64_t replay, int64_t next_pass_at) {
    TORCH_CHECK_VALUE(replay >= 0, "replay must be >= 0");
    Checked([&] { ids_->Restored(size_t(table), uint64_t(replay), next_pass_at); });
  }

 private:
  template <typename F>
  void Checked(F&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  }

  c10::intrusive_ptr<c10::intrusive_ptr_target> keep_index_;
  std::vector<c10::intrusive_ptr<IdIndexHandle>> keep_ids_;
  std::unique_ptr<VirtualIds> ids_;
};

}  // namespace

VirtualIds* VirtualIdsOfHandle(const c10::IValue& handle, c10::intrusive_ptr<c10::intrusive_ptr_target>* keep) {
  if (handle.isNone()) return nullptr;
  TORCH_CHECK_VALUE(
      handle.isObject() && handle.type() == c10::getCustomClassType<c10::intrusive_ptr<VirtualIdsHandle>>(),
      "expected a torch.classes.mtrains.VirtualIds or None, got ", handle.type()->str());
  auto h = handle.toCustomClass<VirtualIdsHandle>();
  *keep = h;
  return h->ids();
}

}  // namespace mtrains

TORCH_LIBRARY_FRAGMENT(mtrains, m) {
  using mtrains::VirtualIdsHandle;
  m.class_<VirtualIdsHandle>("VirtualIds")
      .def(torch::init<c10::IValue, int64_t>(),
           "(KernelCacheIndex, address of the L2-norm pass (0: none)): a kernel's virtual tables.")
      .def("add", &VirtualIdsHandle::add,
           "(table, name, IdIndex, trigger_ids, decay_rate, count_threshold, ttl_seconds, by_norm, wall_clock): "
           "adds a virtual table, before the first step.")
      .def("set_now", &VirtualIdsHandle::set_now, "(table, seconds): the next steps' now (no wall clock).")
      .def("next_pass_at", &VirtualIdsHandle::next_pass_at, "(table) -> live ids of its next eviction pass.")
      .def("lookups", &VirtualIdsHandle::lookups,
           "(table) -> (ids the cache found, ids looked up in the id index), since the start.")
      .def("restored", &VirtualIdsHandle::restored,
           "(table, replay, next_pass_at (-1: as after a pass now)): after a restore, no step pending.");
}
