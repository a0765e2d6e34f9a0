#pragma once
/// When two entries of a saved state dict are one tensor. PyTorch's `state_dict()` gives every
/// entry a tensor object of its own, so a tied weight is not one object twice: it is one
/// storage, seen at the same offset with the same shape, strides and dtype.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace wrapcert::detail {

using SavedIdentity =
    std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int>;

inline SavedIdentity saved_identity(const at::Tensor& t) {
  return {t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.sizes().vec(),
          t.strides().vec(), static_cast<int>(t.scalar_type())};
}

}  // namespace wrapcert::detail
