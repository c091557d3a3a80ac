// torch.classes.mtrains.IdIndex: a virtual table's id -> row index (kernel/id_index.h),
// shared with the step mover's VirtualTierRows (step_mover_binding.cpp).
#pragma once

#include <ATen/ATen.h>
#include <torch/custom_class.h>

#include <memory>
#include <string>
#include <tuple>

#include "kernel/id_index.h"

namespace mtrains {

class IdIndexHandle : public torch::CustomClassHolder {
 public:
  using StatusTuple = std::tuple<int64_t, int64_t, std::string>;

  IdIndexHandle(int64_t capacity, bool counts, bool times);
  const std::shared_ptr<IdIndex>& index() const { return index_; }

  // The methods of torch.classes.mtrains.IdIndex (id_index_binding.cpp says what each does).
  std::tuple<StatusTuple, at::Tensor, at::Tensor> map(const at::Tensor& ids, bool create, int64_t now);
  int64_t count_missing(const at::Tensor& ids);
  at::Tensor find(const at::Tensor& ids);
  std::tuple<at::Tensor, at::Tensor> evict(double decay_rate, double count_threshold, int64_t ttl_seconds,
                                           int64_t now, const at::Tensor& keep_rows);
  at::Tensor remove(const at::Tensor& ids);
  std::tuple<at::Tensor, at::Tensor> entries();
  std::tuple<at::Tensor, at::Tensor> metadata(const at::Tensor& rows);
  StatusTuple assign(const at::Tensor& ids, const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& times);
  c10::Dict<std::string, int64_t> stats();

 private:
  std::shared_ptr<IdIndex> index_;
};

}  // namespace mtrains
