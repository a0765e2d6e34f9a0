#include <wrapcert/fixtures/causal_lm.h>
#include <wrapcert/io/check_keys.h>
#include <wrapcert/test_support/matchers.h>
#include <wrapcert/test_support/temp_dir.h>
#include <wrapcert/wrapcert.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

namespace wrapcert {
namespace {

using test_support::ThrowsError;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Pair;

KeyInfo info(const std::string& key, std::vector<int64_t> shape = {2}) {
  KeyInfo k;
  k.key = key;
  k.shape = std::move(shape);
  k.dtype = c10::kFloat;
  return k;
}

TEST(CheckKeys, FindsTheTranslationForTheSeedsCheckpoint) {
  const auto config = fixtures::tiny_gemma();
  auto wrapped =
      fixtures::apply_fsdp_v2_recipe(fixtures::make_causal_lm(config, {c10::kMeta}), config);
  const auto expected = key_infos(state_dict(fixtures::make_causal_lm(config, {c10::kMeta})));
  const auto report = check_keys(key_infos(state_dict(wrapped)), expected);
  EXPECT_EQ(report.status, KeyStatus::kFixable) << to_text(report);
  EXPECT_EQ(report.translation.size(), expected.size());
  EXPECT_THAT(report.translation,
              Contains(Pair("_orig_module.model.layers.1._orig_module.mlp.up_proj.weight",
                            "model.layers.1.mlp.up_proj.weight")));
  EXPECT_THAT(report.leftover,
              Contains(Pair("_orig_module.model.norm.weight", "component 0: _orig_module")));
  EXPECT_EQ(check_keys(expected, expected).status, KeyStatus::kClean);
}

TEST(CheckKeys, LeavesAUserChildNamedModuleAlone) {
  const std::vector<KeyInfo> expected{info("a.module.weight"), info("b.weight")};
  const auto report =
      check_keys({info("module.a.module.weight"), info("module.b.weight")}, expected);
  EXPECT_EQ(report.status, KeyStatus::kFixable);
  EXPECT_THAT(report.translation, ElementsAre(Pair("module.a.module.weight", "a.module.weight"),
                                              Pair("module.b.weight", "b.weight")));
}

TEST(CheckKeys, AUserChildNamedModuleIsNotALeftoverComponent) {
  const auto report = check_keys({info("module.head.module.weight")}, {info("head.module.weight")});
  EXPECT_EQ(report.status, KeyStatus::kFixable);
  EXPECT_THAT(report.leftover,
              ElementsAre(Pair("module.head.module.weight", "component 0: module")));
}

TEST(CheckKeys, AListingComparesNamesOnly) {
  CheckKeysOptions names_only;
  names_only.compare_shapes = false;
  const std::vector<KeyInfo> listing{info("a.weight", {}), info("b.weight", {})};
  const auto report = check_keys({info("module.a.weight", {3, 4}), info("module.c.weight")},
                                 listing, Registry::global(), names_only);
  EXPECT_EQ(report.status, KeyStatus::kBroken);
  EXPECT_THAT(report.translation, ElementsAre(Pair("module.a.weight", "a.weight")));
  EXPECT_THAT(report.missing, ElementsAre("b.weight"));
  EXPECT_THAT(report.unexpected, ElementsAre("module.c.weight"));
  EXPECT_THAT(report.mismatched, ::testing::IsEmpty());
  EXPECT_EQ(
      check_keys({info("module.a.weight", {3, 4})}, {listing[0]}, Registry::global(), names_only)
          .status,
      KeyStatus::kFixable);
}

TEST(CheckKeys, AKeyListingIsOneKeyPerLineWithAnythingAfterItIgnored) {
  test_support::TempDir dir;
  const auto path = dir / "gemma.keys";
  std::ofstream(path) << "model.embed_tokens.weight [256000, 2048] bfloat16\n\n"
                      << "model.norm.weight\tx\r\nlm_head.weight\n";
  const auto keys = read_key_listing(path);
  std::vector<std::string> names;
  for (const auto& k : keys) names.push_back(k.key);
  EXPECT_THAT(names,
              ElementsAre("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"));
  EXPECT_THAT([&] { (void)read_key_listing(dir / "none.keys"); },
              ThrowsError(ErrorCode::kInvalidArgument, dir / "none.keys"));
  EXPECT_THAT([&] { (void)read_key_listing(dir.path().string()); },
              ThrowsError(ErrorCode::kInvalidArgument, dir.path().string(),
                          ::testing::HasSubstr("is a directory")));
}

TEST(CheckKeys, AScanReportsWholeWrapperComponentsWhereOnlyAWrapperPutsThem) {
  const auto report = scan_keys(
      {info("_orig_module.model.norm.weight"), info("layers.0._fsdp_wrapped_module.mlp.weight"),
       info("module.head.weight"), info("head.module.weight"), info("x._orig_modules.weight"),
       info("_orig_mod.y.bias"), info("block._checkpoint_wrapped_module.0.weight")});
  EXPECT_EQ(report.status, KeyStatus::kLeftover);
  EXPECT_THAT(report.leftover,
              ElementsAre(Pair("_orig_module.model.norm.weight", "component 0: _orig_module"),
                          Pair("layers.0._fsdp_wrapped_module.mlp.weight",
                               "component 2: _fsdp_wrapped_module"),
                          Pair("module.head.weight", "component 0: module"),
                          Pair("_orig_mod.y.bias", "component 0: _orig_mod"),
                          Pair("block._checkpoint_wrapped_module.0.weight",
                               "component 1: _checkpoint_wrapped_module")));
  EXPECT_EQ(scan_keys({info("head.module.weight"), info("a.b")}).status, KeyStatus::kClean);
}

TEST(CheckKeys, ARunOfWrapperComponentsAtTheStartIsFlaggedWhole) {
  const auto report =
      scan_keys({info("_orig_mod.module.head.weight"), info("_orig_mod.head.module.weight")});
  EXPECT_THAT(report.leftover,
              ElementsAre(Pair("_orig_mod.module.head.weight", "component 0: _orig_mod"),
                          Pair("_orig_mod.module.head.weight", "component 1: module"),
                          Pair("_orig_mod.head.module.weight", "component 0: _orig_mod")));
}

TEST(CheckKeys, AnEmptyListingIsAnInputError) {
  test_support::TempDir dir;
  std::ofstream(dir / "empty.keys") << "\n\n";
  EXPECT_THAT([&] { (void)read_key_listing(dir / "empty.keys"); },
              ThrowsError(ErrorCode::kInvalidArgument, dir / "empty.keys",
                          ::testing::HasSubstr("holds no key")));
}

TEST(CheckKeys, ATiedKeyLeftOutIsTiedNotMissing) {
  const auto storage = torch::arange(6, torch::kFloat);
  StateDict model;
  model.insert("embed.weight", storage.view({2, 3}));
  model.insert("head.weight", storage.view({2, 3}));
  StateDict saved;
  saved.insert("module.embed.weight", storage.view({2, 3}).clone());
  const auto report = check_keys(key_infos(saved), key_infos(model));
  EXPECT_EQ(report.status, KeyStatus::kFixable) << to_text(report);
  EXPECT_THAT(report.missing, ::testing::IsEmpty());
  EXPECT_THAT(report.tied_left_out, ElementsAre(Pair("head.weight", "embed.weight")));
  // Untied, the same key is missing.
  StateDict untied;
  untied.insert("embed.weight", storage.view({2, 3}));
  untied.insert("head.weight", storage.view({2, 3}).clone());
  EXPECT_THAT(check_keys(key_infos(saved), key_infos(untied)).missing, ElementsAre("head.weight"));
}

TEST(CheckKeys, KeysThatCannotLoadAsSavedMakeTheCheckpointBroken) {
  Checkpoint fsdp;
  fsdp.state.insert("_fsdp_wrapped_module.flat_param", torch::zeros({40}));
  auto report = scan_keys(key_infos(fsdp));
  EXPECT_EQ(report.status, KeyStatus::kBroken);
  EXPECT_THAT(report.unloadable, ElementsAre(Pair("_fsdp_wrapped_module.flat_param",
                                                  ::testing::HasSubstr("FULL_STATE_DICT"))));
  Checkpoint zero3;
  zero3.state.insert("embed.weight", torch::zeros({0}));
  zero3.state.insert("steps", torch::zeros({1}));
  EXPECT_EQ(scan_keys(key_infos(zero3)).status,
            KeyStatus::kClean);  // no DeepSpeed: an empty buffer
  zero3.other_entries = {"ds_version", "param_shapes"};
  report = scan_keys(key_infos(zero3));
  EXPECT_EQ(report.status, KeyStatus::kBroken);
  EXPECT_THAT(report.unloadable,
              ElementsAre(Pair("embed.weight", ::testing::HasSubstr("zero_to_fp32.py"))));
}

TEST(CheckKeys, ExtraStateThatIsNoTensorIsAKeyWithoutShape) {
  StateDict state;
  state.insert("w", torch::zeros({2}));
  state.insert("block._extra_state", torch::Tensor());
  const auto infos = key_infos(state);
  EXPECT_FALSE(infos[1].tensor);
  EXPECT_EQ(check_keys(infos, infos).status, KeyStatus::kClean);
  auto as_tensor = infos;
  as_tensor[1].tensor = true;
  EXPECT_THAT(check_keys(infos, as_tensor).mismatched,
              ElementsAre(::testing::HasSubstr("not a tensor")));
}

TEST(CheckKeys, TiesAreOneStorageAtOneOffsetNotOneTensorObject) {
  const auto storage = torch::arange(6, torch::kFloat);
  StateDict state;
  state.insert("embed.weight", storage.view({2, 3}));
  state.insert("head.weight", storage.view({2, 3}));  // another tensor object, same data
  state.insert("tail", storage.narrow(0, 3, 3));      // same storage, another offset: no tie
  const auto infos = key_infos(state);
  EXPECT_EQ(infos[0].tied_to, "");
  EXPECT_EQ(infos[1].tied_to, "embed.weight");
  EXPECT_EQ(infos[2].tied_to, "");
  EXPECT_THAT(check_keys(infos, infos).ties, ElementsAre(Pair("head.weight", "embed.weight")));
}

TEST(CheckKeys, ReportsMissingUnexpectedAndMismatchedKeys) {
  const std::vector<KeyInfo> expected{info("a.weight"), info("b.weight"), info("c.weight")};
  const auto report =
      check_keys({info("module.a.weight", {3}), info("b.weight"), info("zzz.weight")}, expected);
  EXPECT_EQ(report.status, KeyStatus::kBroken);
  EXPECT_THAT(report.missing, ElementsAre("c.weight"));
  EXPECT_THAT(report.unexpected, ElementsAre("zzz.weight"));
  ASSERT_EQ(report.mismatched.size(), 1u);
  EXPECT_THAT(report.mismatched[0], ::testing::HasSubstr("found [3] float32, expected [2]"));
}

TEST(CheckKeys, RefusesATranslationThatIsNotOneToOne) {
  // Both would become `w.weight`: a collapse, not a fix.
  const auto report =
      check_keys({info("module.w.weight"), info("_orig_mod.w.weight")}, {info("w.weight")});
  EXPECT_EQ(report.status, KeyStatus::kBroken);
  EXPECT_EQ(report.unexpected.size(), 1u);
}

}  // namespace
}  // namespace wrapcert
