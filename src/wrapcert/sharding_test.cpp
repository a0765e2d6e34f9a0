#include <wrapcert/error.h>
#include <wrapcert/gen/build.h>
#include <wrapcert/process_group.h>
#include <wrapcert/sharding.h>
#include <wrapcert/state_dict.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

namespace wrapcert {
namespace {

using ::testing::HasSubstr;

TEST(RowShard, GivesEachRankCeilRowsAndTheLastRanksThePadding) {
  const auto first = RowShard::of(5, 0, 2);
  const auto second = RowShard::of(5, 1, 2);
  EXPECT_EQ(first.chunk, 3);
  EXPECT_EQ(first.begin(), 0);
  EXPECT_EQ(first.end(), 3);
  EXPECT_EQ(second.begin(), 3);
  EXPECT_EQ(second.end(), 5);  // two real rows, one of padding
  const auto empty = RowShard::of(1, 3, 4);
  EXPECT_EQ(empty.begin(), empty.end());  // nothing left for rank 3
  EXPECT_THROW(RowShard::of(4, 2, 2), Error);
}

TEST(RowShard, TakeRowsPadsWithZeros) {
  const auto full = torch::arange(1, 7, torch::kDouble).reshape({3, 2});
  const auto local = take_rows(full, RowShard::of(3, 1, 2));
  EXPECT_TRUE(local.equal(torch::tensor({{5.0, 6.0}, {0.0, 0.0}}, torch::kDouble)));
  EXPECT_FALSE(local.requires_grad());
}

using Env = std::map<std::string, std::optional<std::string>>;

/// Sets environment variables for a scope, putting back what was there.
class ScopedEnv {
 public:
  explicit ScopedEnv(const Env& values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      set(name, value);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) set(name, value);
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

const Env kNoRanks{{"RANK", std::nullopt},
                   {"WORLD_SIZE", std::nullopt},
                   {"LOCAL_RANK", std::nullopt},
                   {"MASTER_ADDR", std::nullopt},
                   {"MASTER_PORT", std::nullopt},
                   {"SLURM_PROCID", std::nullopt},
                   {"SLURM_NTASKS", std::nullopt},
                   {"SLURM_LOCALID", std::nullopt},
                   {"WRAPCERT_STORE_SERVED", std::nullopt},
                   {"TORCHELASTIC_USE_AGENT_STORE", std::nullopt},
                   {"TORCHELASTIC_RESTART_COUNT", std::nullopt}};

TEST(Rendezvous, ReadsTheVariablesTorchrunSets) {
  const ScopedEnv clean(kNoRanks);
  const ScopedEnv env(Env{{"RANK", "3"},
                          {"WORLD_SIZE", "4"},
                          {"LOCAL_RANK", "1"},
                          {"MASTER_ADDR", "node7"},
                          {"MASTER_PORT", "29611"}});
  const auto r = Rendezvous::from_env();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->master_addr, "node7");
  EXPECT_EQ(r->master_port, 29611);
  EXPECT_FALSE(r->store_served);
}

TEST(Rendezvous, ReadsSlurmsVariablesWhenTorchrunsAreAbsent) {
  const ScopedEnv clean(kNoRanks);
  const ScopedEnv env(Env{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  const auto r = Rendezvous::from_env();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, 2);
}

TEST(Rendezvous, UsesTheAgentsStoreUnderTheAttemptPrefix) {
  const ScopedEnv clean(kNoRanks);
  const ScopedEnv env(Env{{"RANK", "0"},
                          {"WORLD_SIZE", "2"},
                          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                          {"TORCHELASTIC_RESTART_COUNT", "2"}});
  const auto r = Rendezvous::from_env();
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->store_served);
  EXPECT_EQ(r->store_prefix, "/worker/attempt_2");
}

TEST(Rendezvous, IsNoneWithoutARankAndAWorldSize) {
  const ScopedEnv clean(kNoRanks);
  EXPECT_FALSE(Rendezvous::from_env().has_value());
}

TEST(Rendezvous, NamesTheVariableThatIsWrong) {
  const ScopedEnv clean(kNoRanks);
  {
    const ScopedEnv env(Env{{"RANK", "one"}, {"WORLD_SIZE", "2"}});
    try {
      (void)Rendezvous::from_env();
      FAIL() << "RANK=one was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.key_path(), "RANK");
      EXPECT_THAT(e.what(), HasSubstr("not a whole number"));
    }
  }
  {
    const ScopedEnv env(Env{{"RANK", "1"}});
    try {
      (void)Rendezvous::from_env();
      FAIL() << "RANK without WORLD_SIZE was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.key_path(), "WORLD_SIZE");
    }
  }
  {
    const ScopedEnv env(Env{{"RANK", "2"}, {"WORLD_SIZE", "2"}});
    EXPECT_THROW((void)Rendezvous::from_env(), Error);
  }
  {
    const ScopedEnv env(Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
    EXPECT_THROW((void)Rendezvous::from_env(), Error);
  }
}

/// A tree of a Linear and a LayerNorm, wrapped in `kind` at the root and around the LayerNorm.
gen::TreeSpec two_units(const std::string& kind) {
  gen::TreeSpec spec;
  spec.root.children.push_back({"fc", gen::NodeSpec::leaf_of(gen::Leaf::kLinear)});
  spec.root.children.push_back({"norm", gen::NodeSpec::leaf_of(gen::Leaf::kLayerNorm)});
  spec.root.children.back().second.wrappers = {kind};
  spec.root.wrappers = {kind};
  return spec;
}

class ShardedKinds : public ::testing::TestWithParam<const char*> {};

// On one rank the sharded modes shard nothing away: the whole of every tensor is this rank's,
// the forward and the gradients are the model's, and release gives the very tensors back.
TEST_P(ShardedKinds, OnOneRankComputeAsTheModelAndReleaseItsTensors) {
  const auto spec = two_units(GetParam());
  const auto built = gen::build(spec);
  const auto plain = gen::build(spec, {std::nullopt, 0, /*wrap=*/false});
  const auto x = gen::sample_input(spec, torch::kDouble, 3, 2);
  const auto got = call(*built.root, x);
  const auto want = call(*plain.root, x);
  EXPECT_TRUE(got.equal(want));

  std::map<std::string, int64_t> covered;
  for (const auto& w : built.wrappers) {
    auto* sharded = dynamic_cast<ShardedModule*>(w.get());
    ASSERT_NE(sharded, nullptr);
    for (const auto& s : sharded->local_shards()) {
      EXPECT_EQ(s.offset, 0) << s.key;
      covered[s.key] += s.values.numel();
    }
    for (const auto& [key, tensor] : sharded->full_state_dict(0)) {
      EXPECT_GT(tensor.numel(), 0) << key;
    }
  }
  int64_t total = 0;
  for (const auto& [key, n] : covered) total += n;
  int64_t model_total = 0;
  for (const auto& item : built.original) model_total += item.value().numel();
  EXPECT_EQ(total, model_total);

  for (auto it = built.wrappers.rbegin(); it != built.wrappers.rend(); ++it) {
    const auto* kind = Registry::global().find(**it);
    ASSERT_NE(kind, nullptr);
    ASSERT_TRUE(kind->release);
    (void)kind->release(**it);
  }
  const auto params = built.root->named_parameters(/*recurse=*/true);
  for (const auto& item : built.original) {
    bool found = false;
    for (const auto& p : params) found = found || p.value().is_same(item.value());
    EXPECT_TRUE(found) << item.key() << " is not the model's own tensor after release";
  }
}

INSTANTIATE_TEST_SUITE_P(Builtin, ShardedKinds,
                         ::testing::Values("FullyShardedDataParallel[sharded]",
                                           "SpmdFullyShardedDataParallel[sharded]"));

TEST(ShardedModes, AreLeftOutOfSingleProcessCertificationAndListedAcrossRanks) {
  const auto single = Registry::global().names_with_modes();
  const auto across = Registry::global().names_across_ranks();
  for (const char* name : {"FullyShardedDataParallel[sharded]", "FullyShardedDataParallel[mixed]",
                           "SpmdFullyShardedDataParallel[sharded]"}) {
    EXPECT_THAT(single, ::testing::Not(::testing::Contains(name)));
    EXPECT_THAT(across, ::testing::Contains(name));
  }
  EXPECT_THAT(across, ::testing::Contains("DistributedDataParallel"));
  EXPECT_THAT(across, ::testing::Not(::testing::Contains("DataParallel")));
}

}  // namespace
}  // namespace wrapcert
