// Wrapper kinds in a shared library, for the tests of `wrapcert certify --plugin`: a correct
// pass-through and a faulty one (it doubles what it forwards).
#include <wrapcert/plugin.h>
#include <wrapcert/wrappers.h>

namespace {

class PluginRelayImpl : public wrapcert::WrapperImpl {
 public:
  explicit PluginRelayImpl(wrapcert::ModulePtr inner)
      : WrapperImpl("PluginRelay", "_relayed_module", std::move(inner)) {}
};

class PluginLoudRelayImpl : public wrapcert::WrapperImpl {
 public:
  explicit PluginLoudRelayImpl(wrapcert::ModulePtr inner)
      : WrapperImpl("PluginLoudRelay", "_relayed_module", std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    return 2 * wrapcert::call(*inner(), input);
  }
};

}  // namespace

WRAPCERT_PLUGIN(registry) {
  registry.add(wrapcert::wrapper_kind<PluginRelayImpl>("PluginRelay", "_relayed_module"));
  registry.add(wrapcert::wrapper_kind<PluginLoudRelayImpl>("PluginLoudRelay", "_relayed_module"));
}
