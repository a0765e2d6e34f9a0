// A plugin whose entry point registers nothing, for the tests of `wrapcert certify --plugin`
// (the tool must refuse it, saying so). The entry point is the one WRAPCERT_PLUGIN defines
// (wrapcert/plugin.h); it takes the registry by reference, for which a declaration of the class
// is enough, so this file compiles without LibTorch's headers (in a fraction of a second rather
// than the ten seconds a plugin including them takes). Should the entry point change and this
// copy not, the tool would refuse the library for another reason, which the test tells apart.
namespace wrapcert {
class Registry;
}  // namespace wrapcert

extern "C" __attribute__((visibility("default"))) void wrapcert_register_kinds(
    ::wrapcert::Registry& /*registry*/) {}
