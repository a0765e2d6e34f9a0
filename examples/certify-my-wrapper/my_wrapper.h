#pragma once
// The author's wrappers: a sharding wrapper that keeps the inner module under `_sharded_module`,
// and a variant with a bug: it keeps a cache buffer of its own that its descriptor does not
// declare (`owned_state`), so its checkpoints would carry a key the model does not have.

#include <wrapcert/wrappers.h>

namespace my {

class ShardedImpl : public wrapcert::WrapperImpl {
 public:
  explicit ShardedImpl(wrapcert::ModulePtr inner)
      : WrapperImpl("Sharded", "_sharded_module", std::move(inner)) {}
};

class LeakyShardedImpl : public wrapcert::WrapperImpl {
 public:
  explicit LeakyShardedImpl(wrapcert::ModulePtr inner)
      : WrapperImpl("LeakySharded", "_sharded_module", std::move(inner)) {
    register_buffer("shard_cache", torch::zeros({1}));
  }
};

inline wrapcert::WrapperKind sharded_kind() {
  return wrapcert::wrapper_kind<ShardedImpl>("Sharded", "_sharded_module");
}

inline wrapcert::WrapperKind leaky_sharded_kind() {
  return wrapcert::wrapper_kind<LeakyShardedImpl>("LeakySharded", "_sharded_module");
}

}  // namespace my
