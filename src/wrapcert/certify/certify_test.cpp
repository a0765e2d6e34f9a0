#include <wrapcert/certify/certify.h>
#include <wrapcert/distributed.h>
#include <wrapcert/error.h>
#include <wrapcert/fixtures/certification.h>
#include <wrapcert/test_support/cases.h>
#include <wrapcert/test_support/contract_kinds.h>
#include <wrapcert/wrappers.h>

#include <ATen/Parallel.h>
#include <torch/nn/modules/linear.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include <pugixml.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <csignal>
#include <iostream>
#include <limits>

namespace wrapcert::certify {
namespace {

using ::testing::HasSubstr;
using wrapcert::test_support::cases_to_pass;

/// A correct new kind: its own type and slot, a pass-through.
class RelayImpl : public WrapperImpl {
 public:
  explicit RelayImpl(ModulePtr inner) : WrapperImpl("Relay", "_relayed_module", std::move(inner)) {}
};

/// A faulty one: scales what it forwards, yet claims to be bitwise transparent.
class LoudRelayImpl : public WrapperImpl {
 public:
  explicit LoudRelayImpl(ModulePtr inner)
      : WrapperImpl("LoudRelay", "_relayed_module", std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override { return 2 * call(*inner(), input); }
};

/// Skips its inner module for a single example: a fault only a batch of one shows.
class BatchOfOneSkipperImpl : public WrapperImpl {
 public:
  explicit BatchOfOneSkipperImpl(ModulePtr inner)
      : WrapperImpl("BatchOfOneSkipper", "_relayed_module", std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    return input.size(0) == 1 ? input : call(*inner(), input);
  }
};

/// Its own code throws on forward.
class ThrowingRelayImpl : public WrapperImpl {
 public:
  explicit ThrowingRelayImpl(ModulePtr inner)
      : WrapperImpl("ThrowingRelay", "_relayed_module", std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor&) override { throw std::runtime_error("shard lost"); }
};

/// Kills its process on forward, as a wrapper with a memory error would.
class CrashingRelayImpl : public WrapperImpl {
 public:
  explicit CrashingRelayImpl(ModulePtr inner)
      : WrapperImpl("CrashingRelay", "_relayed_module", std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    std::raise(SIGSEGV);
    return call(*inner(), input);
  }
};

/// Breaks once its process has forwarded more than `g_wear_limit` batches: a wrapper whose fault
/// depends on what ran before it in the same process (a cache that fills, a counter that wraps).
std::atomic<long> g_wear{0};
long g_wear_limit = std::numeric_limits<long>::max();

class WearingRelayImpl : public WrapperImpl {
 public:
  explicit WearingRelayImpl(ModulePtr inner)
      : WrapperImpl("WearingRelay", "_relayed_module", std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    if (++g_wear > g_wear_limit) throw std::runtime_error("worn out");
    return call(*inner(), input);
  }
};

/// Doubles what it forwards unless deterministic algorithms are on, and turns them on when it is
/// destroyed: a fault that a setting left behind by an earlier check would hide.
class LeavesDeterminismOnImpl : public WrapperImpl {
 public:
  explicit LeavesDeterminismOnImpl(ModulePtr inner)
      : WrapperImpl("LeavesDeterminismOn", "_relayed_module", std::move(inner)) {}
  ~LeavesDeterminismOnImpl() override {
    at::globalContext().setDeterministicAlgorithms(true, false);
  }

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    const auto out = call(*inner(), input);
    return at::globalContext().deterministicAlgorithms() ? out : 2 * out;
  }
};

/// Never returns from forward.
class HangingRelayImpl : public WrapperImpl {
 public:
  explicit HangingRelayImpl(ModulePtr inner)
      : WrapperImpl("HangingRelay", "_relayed_module", std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor& input) override {
    while (true) ::pause();
    return call(*inner(), input);
  }
};

Options quick() {
  Options o;
  o.cases = 15;
  o.seed = 11;
  o.models = fixtures::certification_models({"gemma-2b", "tiny-mistral"});
  return o;
}

/// `quick()` for a run that must pass: fewer cases under the sanitizers (test_support/cases.h).
Options quick_pass() {
  auto o = quick();
  o.cases = cases_to_pass(o.cases);
  return o;
}

TEST(Certify, CertifiesACorrectNewKind) {
  const auto report = run(wrapper_kind<RelayImpl>("Relay", "_relayed_module"), quick_pass());
  EXPECT_TRUE(report.passed()) << to_markdown(report);
  size_t relay = 0;
  for (const auto& e : report.entries) {
    if (e.kind == "hardware") {
      EXPECT_EQ(e.status, Status::kSkipped) << "on a host without the device";
      EXPECT_FALSE(e.reason.empty());
      continue;
    }
    EXPECT_EQ(e.kind, "Relay");
    ++relay;
  }
  // Generated: 13 properties once, P4, P13, P14 and P17 in four dtypes; the deep chain;
  // gemma-2b P1-P3; tiny-mistral P4, P13 and P14 in four dtypes.
  EXPECT_EQ(relay, 13u + 4u * 4u + 1u + 3u + 3u * 4u);
  EXPECT_EQ(report.count(Status::kFailed), 0u);
}

TEST(Certify, EachReportSaysWhatAPassExercised) {
  auto o = quick();
  o.models = {};
  o.cases = cases_to_pass(30);
  o.properties = {"P2", "P17"};
  const auto report = run(wrapper_kind<RelayImpl>("Relay", "_relayed_module"), o);
  ASSERT_TRUE(report.passed()) << to_markdown(report);
  const auto text = exercised_text(report, "Relay");
  EXPECT_THAT(text, HasSubstr("dtypes float64, float32, bfloat16, float16; widths "));
  EXPECT_THAT(text, HasSubstr("training and eval mode"));
  EXPECT_THAT(text, ::testing::ContainsRegex("trained [0-9]+ cases \\(P17: 3 optimizer steps, "
                                             "1 no-grad call and 2 mode switches each"));
  EXPECT_THAT(text, HasSubstr("world size 1 (one process: nothing sharded)"));
  EXPECT_THAT(to_markdown(report), HasSubstr("## Relay\n\nExercised: " + text + ".\n"));
  EXPECT_THAT(to_summary(report), HasSubstr("\nExercised:\n- Relay: " + text + "\n"));
  EXPECT_THAT(to_junit(report), HasSubstr("<property name=\"exercised\" value=\"dtypes float64"));
  const auto json = nlohmann::json::parse(to_json(report));
  const auto& relay = json["exercised"]["Relay"];
  EXPECT_EQ(relay["text"], text);
  EXPECT_GT(relay["trained_cases"].get<int>(), 0);
  EXPECT_EQ(relay["optimizer_steps"].get<int>(), 3 * relay["trained_cases"].get<int>());
  EXPECT_GT(relay["widths"].size(), 2u);
  // Rows travel between processes as JSON: what they drew travels with them.
  for (const auto& e : report.entries) {
    if (e.kind != "Relay") continue;
    const auto back = entry_from_json(entry_to_json(e));
    EXPECT_EQ(back.drawn.widths, e.drawn.widths);
    EXPECT_EQ(back.drawn.sgd + back.drawn.adam, e.drawn.sgd + e.drawn.adam);
  }

  // A dimension no case drew is named as never drawn, never left out.
  Report narrow;
  Entry one;
  one.kind = "Narrow";
  one.property = "P1 keys";
  one.target = "generated trees";
  one.exercised = 1;
  one.drawn.widths = {3};
  one.drawn.batches = {1};
  one.drawn.training = 1;
  narrow.entries.push_back(one);
  EXPECT_EQ(exercised_text(narrow, "Narrow"),
            "dtypes none run; widths 3; batches 1; training mode (no eval mode drawn); no "
            "training loop run (P17 not certified here), no frozen parameters drawn, no "
            "mode-dependent leaves drawn, no cloneable LibTorch leaves drawn; world size 1 (one "
            "process: nothing sharded)");
}

TEST(Certify, LeavesTheGlobalRegistryAsItWasSoNoRunDependsOnAnother) {
  const auto before = Registry::global().names();
  auto faulty = quick();
  faulty.properties = {"P4"};  // what rejects it
  const auto loud = run(wrapper_kind<LoudRelayImpl>("LoudRelay", "_relayed_module"), faulty);
  EXPECT_FALSE(loud.passed());
  EXPECT_EQ(Registry::global().names(), before);
  // The correct kind is certified after the faulty one exactly as on its own: the faulty kind
  // is not drawn into its trees.
  const auto relay = run(wrapper_kind<RelayImpl>("Relay", "_relayed_module"), quick_pass());
  EXPECT_TRUE(relay.passed()) << to_markdown(relay);
  EXPECT_EQ(Registry::global().names(), before);
}

TEST(Certify, RunsEachCheckOnOneThreadAndLeavesTheCallersThreadCountAsItWas) {
  // The checks' children run one LibTorch thread (a pool the parent had is not in a child);
  // the caller's own setting comes back when the run ends.
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  auto o = quick_pass();
  o.models = {};
  o.properties = {"P4"};
  o.dtypes = {gen::Dtype::kFloat64};
  const auto report = run(wrapper_kind<RelayImpl>("Relay", "_relayed_module"), o);
  EXPECT_TRUE(report.passed()) << to_markdown(report);
  EXPECT_EQ(at::get_num_threads(), 2);
  at::set_num_threads(before);
}

TEST(Certify, RejectsAFaultyKindWithACounterexample) {
  const auto report = run(wrapper_kind<LoudRelayImpl>("LoudRelay", "_relayed_module"), quick());
  ASSERT_FALSE(report.passed());
  bool generated = false, fixture = false;
  for (const auto& e : report.entries) {
    if (e.status != Status::kFailed) continue;
    // What it computes is wrong: P4 on every target, and training (P17) on generated trees.
    if (e.property == "P17 training") {
      EXPECT_EQ(e.target, "generated trees");
      continue;
    }
    EXPECT_EQ(e.property, "P4 backward");
    if (e.target == "generated trees") {
      generated = true;
      EXPECT_THAT(e.counterexample, HasSubstr("LoudRelay("));
    } else {
      fixture = true;
      EXPECT_THAT(e.reason, HasSubstr("differ"));
    }
  }
  EXPECT_TRUE(generated);
  EXPECT_TRUE(fixture);

  const auto json = nlohmann::json::parse(to_json(report));
  EXPECT_EQ(json["context"]["seed"], 11);
  EXPECT_EQ(json["context"]["options"]["subject"], "reference");
  EXPECT_GE(json["summary"]["failed"].get<int>(), 2);
  EXPECT_THAT(to_junit(report), HasSubstr("<failure message="));
  EXPECT_THAT(to_markdown(report), HasSubstr("**FAILED**"));
  EXPECT_THAT(to_summary(report),
              HasSubstr("| P4 backward | generated trees (float64) | **FAIL** "));
}

TEST(Certify, JUnitHoldsWhatXmlCannotAsReplacementCharacters) {
  // What a worker printed can be anything: a NUL, an escape sequence, bytes that are no UTF-8.
  Report report;
  Entry e;
  e.kind = "Odd<Kind>&\x01";
  e.property = "P1 keys";
  e.target = "generated trees";
  e.status = Status::kFailed;
  e.reason = "the worker said \x1b[31m\"no\"\x1b[0m";
  e.reason.push_back('\0');
  e.counterexample = "caf\xc3\xa9 \xff\xfe \xed\xa0\x80 \xef\xbf\xbe ]]> \xf0\x9f\x99\x82\tend";
  report.entries.push_back(e);
  const auto text = to_junit(report);

  pugi::xml_document doc;
  ASSERT_TRUE(doc.load_string(text.c_str())) << text;
  for (unsigned char c : text) {
    EXPECT_TRUE(c >= 0x20 || c == '\n' || c == '\t' || c == '\r') << "byte " << int(c);
  }
  const auto failure =
      doc.child("testsuites").child("testsuite").child("testcase").child("failure");
  EXPECT_EQ(std::string(doc.child("testsuites").child("testsuite").attribute("name").value()),
            "Odd<Kind>&\xef\xbf\xbd");
  const std::string body = failure.text().get();
  EXPECT_THAT(body, HasSubstr("the worker said \xef\xbf\xbd[31m\"no\"\xef\xbf\xbd[0m"));
  // Kept: é and the emoji. Replaced, a U+FFFD each: two stray bytes, a surrogate's three, U+FFFE.
  EXPECT_THAT(body, HasSubstr("caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd "));
  EXPECT_THAT(body, HasSubstr("]]> \xf0\x9f\x99\x82\tend"));
  EXPECT_THAT(body, HasSubstr("\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd ]]>"));
}

TEST(Certify, ShowsTheLegacySubjectFailing) {
  auto o = quick();
  o.kinds = {"SpmdFullyShardedDataParallel"};
  o.subject = BuiltinUnwrap::kLegacy;
  o.properties = {"P1"};  // the keys it leaves wrapped
  const auto report = run(o);
  EXPECT_FALSE(report.passed());
  EXPECT_TRUE(std::any_of(report.entries.begin(), report.entries.end(), [](const Entry& e) {
    return e.property == "P1 keys" && e.status == Status::kFailed;
  })) << to_markdown(report);
  o.properties.clear();
  o.subject = BuiltinUnwrap::kReference;
  o.cases = cases_to_pass(o.cases);
  EXPECT_TRUE(run(o).passed());
}

TEST(Certify, AWrapperThatCrashesIsAFailedEntryWithAReplayNotADeadRun) {
  auto o = quick();
  o.models = fixtures::certification_models({"tiny-mistral"});
  o.properties = {"P4"};  // every property that runs the model crashes alike
  const auto report = run(wrapper_kind<CrashingRelayImpl>("CrashingRelay", "_relayed_module"), o);
  ASSERT_FALSE(report.passed());
  bool crashed = false;
  for (const auto& e : report.entries) {
    if (e.status != Status::kFailed) continue;
    // A kind registered through the API: the API call replays it, the CLI cannot.
    EXPECT_THAT(e.replay, HasSubstr("certify::run(<the kind CrashingRelay>) with seed 11"));
    if (e.property == "P4 backward" && e.target == "tiny-mistral" && e.dtype == "float64") {
      crashed = true;
      EXPECT_THAT(e.reason, HasSubstr("crashed: signal"));  // 11, or 6 where ASan aborts
    }
  }
  EXPECT_TRUE(crashed) << to_markdown(report);
  EXPECT_THAT(to_json(report), HasSubstr("\"replay\": \"certify::run(<the kind CrashingRelay>)"));
}

TEST(Certify, AFaultOnlyABatchOfOneShowsIsFoundOnGeneratedTreesNamingAKey) {
  auto o = quick();
  o.models = {};
  const auto report =
      run(wrapper_kind<BatchOfOneSkipperImpl>("BatchOfOneSkipper", "_relayed_module"), o);
  bool found = false;
  for (const auto& e : report.entries) {
    if (e.property != "P4 backward" || e.target != "generated trees") continue;
    found = true;
    EXPECT_EQ(e.status, Status::kFailed);
    EXPECT_THAT(e.reason, HasSubstr("batch of 1)"));
    EXPECT_FALSE(e.key.empty()) << e.reason;
    EXPECT_THAT(e.counterexample, HasSubstr("BatchOfOneSkipper("));
  }
  EXPECT_TRUE(found);
}

// A child process runs checks one after another while they pass; a check that fails after
// others ran in its process runs again in a process of its own, and that run gives its row.
TEST(Certify, ARowDoesNotDependOnWhatRanBeforeItInItsProcess) {
  const auto kind = wrapper_kind<WearingRelayImpl>("WearingRelay", "_relayed_module");
  auto o = quick_pass();
  o.models = {};
  o.share_cases = false;  // every row a check of its own
  // The most batches one check forwards, and all of them, counted row by row in this process.
  o.isolate = false;
  long most = 0, first = 0;
  g_wear = 0;
  const auto counted = run(kind, o, [&](const Entry&, bool done) {
    if (done) most = std::max(most, g_wear - first);
    first = g_wear;
  });
  ASSERT_TRUE(counted.passed()) << to_markdown(counted);
  ASSERT_GT(g_wear.load(), 2 * most) << "the rows together must wear it out";
  g_wear_limit = most;  // no check alone reaches it; the checks one after another do
  g_wear = 0;
  const auto in_one_process = run(kind, o);
  EXPECT_FALSE(in_one_process.passed()) << "the kind must depend on what ran before";
  o.isolate = true;
  g_wear = 0;
  const auto report = run(kind, o);
  g_wear_limit = std::numeric_limits<long>::max();
  EXPECT_TRUE(report.passed()) << to_markdown(report);
  EXPECT_EQ(report.entries.size(), counted.entries.size());
}

// A check that leaves a process-wide setting changed ends its child: the next check does not
// run with it (here it would hide a fault every check shows in a process of its own).
TEST(Certify, AChildStopsAfterACheckThatLeavesASettingChanged) {
  ASSERT_FALSE(at::globalContext().deterministicAlgorithms());
  auto o = quick();
  o.models = {};
  o.properties = {"P1", "P4"};  // P1 builds and drops models first, then P4 runs them
  o.dtypes = {gen::Dtype::kFloat64};
  const auto report =
      run(wrapper_kind<LeavesDeterminismOnImpl>("LeavesDeterminismOn", "_relayed_module"), o);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms()) << "the checks ran in children";
  bool backward = false;
  for (const auto& e : report.entries) {
    if (e.property != "P4 backward") continue;
    backward = true;
    EXPECT_EQ(e.status, Status::kFailed) << to_markdown(report);
  }
  EXPECT_TRUE(backward) << to_markdown(report);
}

TEST(Certify, AWrapperThatHangsIsStoppedAtTheLimit) {
  auto o = quick();
  o.models = fixtures::certification_models({"tiny-mistral"});
  o.timeout_seconds = 2;
  // Every row that runs the model waits out the limit: one dtype keeps them few.
  o.dtypes = {gen::Dtype::kFloat64};
  const auto report = run(wrapper_kind<HangingRelayImpl>("HangingRelay", "_relayed_module"), o);
  bool hung = false, shown = false;
  for (const auto& e : report.entries) {
    if (e.property == "P4 backward" && e.target == "tiny-mistral" && e.dtype == "float64") {
      hung = true;
      EXPECT_EQ(e.status, Status::kFailed);
      EXPECT_THAT(e.reason, HasSubstr("did not finish within 2 s"));
      EXPECT_LT(e.seconds, 30.0);
    }
    if (e.property == "P4 backward" && e.target == "generated trees") {
      // The case that was running when it was stopped is shown.
      shown = true;
      EXPECT_EQ(e.status, Status::kFailed);
      EXPECT_THAT(e.reason, HasSubstr("stopped as hung on the case shown"));
      EXPECT_THAT(e.counterexample, HasSubstr("HangingRelay("));
    }
  }
  EXPECT_TRUE(hung);
  EXPECT_TRUE(shown) << to_markdown(report);
}

TEST(Certify, CertifiesAnUnwrapFunctionOfYourOwn) {
  auto o = quick();
  o.kinds = {"DistributedDataParallel", "CheckpointWrapper"};
  o.models = fixtures::certification_models({"gemma-2b"});
  const auto reference = props::subject(BuiltinUnwrap::kReference);
  o.custom_subject = [reference](const ModulePtr& wrapped) { return reference(wrapped); };
  o.custom_subject_name = "my_unwrap";
  const int cases = o.cases;
  o.cases = cases_to_pass(cases);
  EXPECT_TRUE(run(o).passed());
  o.cases = cases;
  // One that loses the last key of what it would save: P1 must reject it (what the other
  // properties make of a subject that drops keys, the rejection suite shows).
  o.properties = {"P1"};
  o.custom_subject = [reference](const ModulePtr& wrapped) {
    auto u = reference(wrapped);
    StateDict kept;
    for (size_t i = 0; i + 1 < u.state.size(); ++i)
      kept.insert(u.state[i].key(), u.state[i].value());
    u.state = std::move(kept);
    return u;
  };
  const auto report = run(o);
  ASSERT_FALSE(report.passed());
  bool keys = false;
  for (const auto& e : report.entries) {
    if (e.property == "P1 keys" && e.status == Status::kFailed) keys = true;
    if (e.status == Status::kFailed) {
      EXPECT_THAT(e.replay, HasSubstr("the subject 'my_unwrap'"));
    }
  }
  EXPECT_TRUE(keys) << to_markdown(report);
  EXPECT_THAT(to_markdown(report), HasSubstr("(my_unwrap unwrap)"));
}

TEST(Certify, BlamesTheWrapperWhoseCodeThrewNotTheSubject) {
  auto o = quick();
  o.models = fixtures::certification_models({"tiny-mistral"});
  o.properties = {"P4"};  // the rows read here
  const auto report = run(wrapper_kind<ThrowingRelayImpl>("ThrowingRelay", "_relayed_module"), o);
  size_t blamed = 0;
  for (const auto& e : report.entries) {
    if (e.property != "P4 backward") continue;
    if (e.target != "generated trees" && e.dtype == "float16") continue;  // no CPU kernels
    EXPECT_EQ(e.status, Status::kFailed);
    EXPECT_THAT(e.reason, HasSubstr("the wrapper ThrowingRelay threw: shard lost")) << e.target;
    ++blamed;
  }
  EXPECT_EQ(blamed, 4u + 3u);  // generated trees and the fixture, in each dtype
  auto broken = wrapper_kind<RelayImpl>("BrokenMake", "_relayed_module");
  broken.make = [](ModulePtr) -> ModulePtr { throw std::runtime_error("cannot shard"); };
  o.models = fixtures::certification_models({"gemma-2b"});
  o.properties = {"P1"};
  const auto make = run(broken, o);
  bool generated = false, fixture = false;
  for (const auto& e : make.entries) {
    if (e.property != "P1 keys") continue;
    if (e.target == "generated trees") {
      generated = true;
      EXPECT_THAT(
          e.reason,
          HasSubstr("the wrapper kind BrokenMake (building a wrapper) threw: cannot shard"));
    } else {
      fixture = true;
      EXPECT_THAT(
          e.reason,
          HasSubstr("the wrapper kind BrokenMake (wrapping the fixture) threw: cannot shard"));
    }
  }
  EXPECT_TRUE(generated);
  EXPECT_TRUE(fixture);
}

/// Every row but its time and replay line, as a report prints it.
std::vector<std::string> rows(const Report& report) {
  std::vector<std::string> out;
  for (const auto& e : report.entries) {
    out.push_back(e.kind + " | " + e.property + " | " + target_label(e) + " | " +
                  to_string(e.status) + " | " + std::to_string(e.cases) + " cases | " + e.coverage +
                  " | " + e.reason + " | " + e.key + " | " + e.counterexample);
  }
  return out;
}

TEST(Certify, PropertiesThatShareTheirCasesGiveTheRowsEachGivesAlone) {
  // Sharing a case among the properties that draw the same trees changes no row: not for a
  // correct kind, not where a structural property (P15) or one run in each dtype (P14) rejects
  // a kind, not for a subject that fails several properties at once.
  struct Run {
    WrapperKind kind;
    BuiltinUnwrap subject;
    std::string rejected_by;  ///< a row that fails alone ("" for none)
  };
  const Run runs[] = {
      {wrapper_kind<RelayImpl>("Relay", "_relayed_module"), BuiltinUnwrap::kReference, ""},
      {wrapcert::test_support::second_registration_kind(), BuiltinUnwrap::kReference,
       "P15 owned state"},
      {wrapcert::test_support::copying_release_kind(), BuiltinUnwrap::kReference, "P14 release"},
      {wrapper_kind<RelayImpl>("Relay", "_relayed_module"), BuiltinUnwrap::kDuckTyped,
       "P5 non-mutation"},
  };
  // The properties that share: those that never do (P7, P9, P17) run alike either way.
  std::vector<std::string> sharing;
  for (const auto& p : props::generated_properties()) {
    if (p.shares_cases) sharing.push_back(p.name);
  }
  ASSERT_GT(sharing.size(), 10u);
  for (const auto& r : runs) {
    auto o = quick();
    o.models.clear();
    o.dtypes = {gen::Dtype::kFloat32};  // each dtype's group is the same code
    o.properties = sharing;
    o.cases = r.rejected_by.empty() ? cases_to_pass(30) : 30;
    o.subject = r.subject;
    o.share_cases = false;
    const auto alone = run(r.kind, o);
    size_t rejected = 0;
    for (const auto& e : alone.entries) {
      rejected += e.property == r.rejected_by && e.status == Status::kFailed;
    }
    EXPECT_EQ(alone.passed(), r.rejected_by.empty()) << to_markdown(alone);
    if (!r.rejected_by.empty()) {
      EXPECT_GT(rejected, 0u) << to_markdown(alone);
    }
    o.share_cases = true;
    const auto shared = run(r.kind, o);
    EXPECT_EQ(rows(shared), rows(alone)) << r.kind.name << ", " << to_string(r.subject);
  }
}

/// A kind and the one property (on generated trees) that must reject it; "" for a correct kind.
struct ContractCase {
  WrapperKind (*kind)();
  std::string rejected_by;
};

void PrintTo(const ContractCase& c, std::ostream* os) {
  *os << c.kind().name << (c.rejected_by.empty() ? " (correct)" : " (" + c.rejected_by + ")");
}

class CertifyContracts : public ::testing::TestWithParam<ContractCase> {};

TEST_P(CertifyContracts, EachDeclaredContractIsCheckedByThePropertyNamedForIt) {
  const auto& c = GetParam();
  const auto kind = c.kind();
  auto o = quick();
  o.models = fixtures::certification_models({"gemma-2b", "tiny-mistral"});
  o.cases = c.rejected_by.empty() ? cases_to_pass(30) : 30;
  // A faulty kind: the property named for its contract alone. Run with the properties it shares
  // its cases with, it gives the same rows (Certify.PropertiesThatShareTheirCasesGiveTheRows...).
  if (!c.rejected_by.empty()) o.properties = {c.rejected_by};
  const auto report = run(kind, o);
  std::vector<std::string> failed;
  for (const auto& e : report.entries) {
    if (e.status == Status::kFailed) {
      failed.push_back(e.property + " [" + e.target + "]");
      std::cout << kind.name << ": " << e.property << " [" << e.target << "]: " << e.reason << "\n";
    }
  }
  if (c.rejected_by.empty()) {
    EXPECT_TRUE(report.passed()) << to_markdown(report);
    return;
  }
  EXPECT_THAT(failed, ::testing::Contains(c.rejected_by + " [generated trees]"))
      << to_markdown(report);
  for (const auto& e : report.entries) {
    if (e.property == c.rejected_by && e.target == "generated trees") {
      EXPECT_FALSE(e.key.empty()) << e.reason;
      EXPECT_THAT(e.counterexample, HasSubstr(kind.name + "(")) << e.reason;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, CertifyContracts,
    ::testing::Values(
        ContractCase{wrapcert::test_support::step_counter_kind, ""},
        ContractCase{wrapcert::test_support::aliased_relay_kind, ""},
        ContractCase{wrapcert::test_support::flat_shard_kind, ""},
        ContractCase{wrapcert::test_support::copying_release_kind, "P14 release"},
        ContractCase{wrapcert::test_support::emptying_release_kind, "P14 release"},
        ContractCase{wrapcert::test_support::swapped_flat_release_kind, "P14 release"},
        ContractCase{wrapcert::test_support::second_registration_kind, "P15 owned state"},
        ContractCase{wrapcert::test_support::misdirected_alias_kind, "P16 aliases"},
        ContractCase{wrapcert::test_support::modal_relay_kind, ""},
        ContractCase{wrapcert::test_support::input_stats_kind, ""},
        ContractCase{wrapcert::test_support::forwarding_train_kind, ""},
        ContractCase{wrapcert::test_support::exact_no_grad_kind, ""},
        ContractCase{wrapcert::test_support::colliding_state_kind, "P15 owned state"}),
    [](const auto& info) { return info.param.kind().name; });

/// A fault that only running the model shows, and where: the row (`Kind[mode]`, property,
/// dtype) that must reject it on every seed, and what its reason or counterexample must say.
struct RunningFault {
  WrapperKind (*kind)();
  std::string certified;  ///< the kind, or the faulty `Kind[mode]`
  std::string property;
  std::string dtype;  ///< the one dtype that shows it; "" for all
  std::string says;   ///< in the reason or the counterexample
};

void PrintTo(const RunningFault& f, std::ostream* os) {
  *os << f.certified << " (" << f.property << (f.dtype.empty() ? "" : ", " + f.dtype) << ")";
}

class CertifyRunningFaults : public ::testing::TestWithParam<RunningFault> {};

TEST_P(CertifyRunningFaults, AreRejectedByTheNamedPropertyOnEverySeedOfASweep) {
  const auto& f = GetParam();
  for (const uint64_t seed : {1, 2, 3, 4, 5}) {
    Options o;
    o.seed = seed;
    o.cases = 40;
    o.properties = {f.property};
    const auto report = run(f.kind(), o);
    size_t rows = 0;
    for (const auto& e : report.entries) {
      if (e.kind != f.certified || e.property != f.property || e.target != "generated trees") {
        continue;
      }
      ++rows;
      const bool shows = f.dtype.empty() || e.dtype == f.dtype;
      if (!shows) {
        EXPECT_EQ(e.status, Status::kPassed)
            << "seed " << seed << ": " << target_label(e) << ": " << e.reason;
        continue;
      }
      EXPECT_EQ(e.status, Status::kFailed) << "seed " << seed << ": " << target_label(e);
      EXPECT_THAT(e.reason + "\n" + e.counterexample, HasSubstr(f.says))
          << "seed " << seed << ": " << target_label(e);
      if (seed == 1) {  // what exposed it, for the log: the row, its time, the shrunk case
        std::cout << f.certified << " [" << e.property << ", " << target_label(e) << "] "
                  << e.seconds << " s: " << e.reason << "\n  "
                  << e.counterexample.substr(0, e.counterexample.find('\n')) << "\n";
      }
      EXPECT_THAT(e.replay, HasSubstr("properties {\"P"));  // an API kind: replayed by the API
    }
    EXPECT_GT(rows, 0u) << "no row for " << f.certified << "\n" << to_markdown(report);
    if (f.certified != f.kind().name) {
      // The kind's own make is correct: only the mode is rejected.
      for (const auto& e : report.entries) {
        if (e.kind == f.kind().name) {
          EXPECT_EQ(e.status, Status::kPassed) << e.reason;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, CertifyRunningFaults,
    ::testing::Values(RunningFault{wrapcert::test_support::swapped_flat_forward_kind,
                                   "SwappedFlatForward", "P4 backward", "", "differs"},
                      RunningFault{wrapcert::test_support::detached_flat_views_kind,
                                   "DetachedFlatViews", "P4 backward", "",
                                   "no gradient through the wrappers reaches"},
                      RunningFault{wrapcert::test_support::float32_rounding_kind, "Float32Rounding",
                                   "P4 backward", "float32", "built in float32"},
                      RunningFault{wrapcert::test_support::eval_no_grad_kind, "EvalNoGrad",
                                   "P4 backward", "", "run in eval mode"},
                      RunningFault{wrapcert::test_support::modal_fault_kind, "ModalFault[fused]",
                                   "P4 backward", "", "differs"},
                      RunningFault{wrapcert::test_support::cached_output_kind, "CachedOutput",
                                   "P4 backward", "", "the backward of the wrapped model threw"},
                      RunningFault{wrapcert::test_support::colliding_state_kind, "CollidingState",
                                   "P15 owned state", "", "two entries under one key"},
                      // What training varies (P17 and the dimensions the trees draw).
                      RunningFault{wrapcert::test_support::unfreezing_kind, "Unfreezing",
                                   "P2 identity", "", "requires_grad is True, the model's False"},
                      RunningFault{wrapcert::test_support::clone_keeping_kind, "CloneKeeping",
                                   "P2 identity", "", "not the model's own tensor"},
                      RunningFault{wrapcert::test_support::large_batch_fault_kind,
                                   "LargeBatchFault", "P4 backward", "", "on a batch of 3"},
                      RunningFault{wrapcert::test_support::stuck_in_training_kind,
                                   "StuckInTraining", "P17 training", "", "in eval mode"},
                      RunningFault{wrapcert::test_support::no_grad_scale_kind, "NoGradScale",
                                   "P17 training", "", "a call under torch.no_grad()"},
                      RunningFault{wrapcert::test_support::stale_gather_kind, "StaleGather",
                                   "P17 training", "", "differs"},
                      RunningFault{wrapcert::test_support::optimizer_breaking_kind,
                                   "OptimizerBreaking", "P17 training", "",
                                   "the optimizer step over the wrapped model's parameters threw"}),
    [](const auto& info) {
      std::string name = info.param.certified;
      for (auto& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

/// Cannot run at all: every case holding it is skipped, so a check "passes" on the others.
class NeverRunsImpl : public WrapperImpl {
 public:
  explicit NeverRunsImpl(ModulePtr inner)
      : WrapperImpl("NeverRuns", "_relayed_module", std::move(inner)) {}

 protected:
  torch::Tensor run(const torch::Tensor&) override {
    throw Error(ErrorCode::kWrapperState, "", "holds its parameters elsewhere");
  }
};

TEST(Certify, ARowThatNeverRanTheKindIsNotExercisedNeverAPass) {
  Options o;
  o.seed = 3;
  o.cases = 30;
  o.properties = {"P4", "P5"};
  const auto report = run(wrapper_kind<NeverRunsImpl>("NeverRuns", "_relayed_module"), o);
  size_t rows = 0;
  for (const auto& e : report.entries) {
    if (e.kind != "NeverRuns") continue;
    ++rows;
    EXPECT_EQ(e.status, Status::kFailed) << target_label(e);
    EXPECT_EQ(e.exercised, 0);
    EXPECT_THAT(e.reason, HasSubstr("not exercised"));
  }
  EXPECT_EQ(rows, 4u + 1u);  // P4 in four dtypes, P5
  EXPECT_THAT(to_summary(report), HasSubstr("**FAIL** 0"));
}

TEST(Certify, ACachedOutputInsideCheckpointWrapperIsRejectedNotAHang) {
  // CheckpointWrapper(CachedOutput(Linear)): the cached tensor was once the checkpoint node's
  // own output, and the recomputation waited on itself. Run in a child with a limit: a hang
  // fails this test instead of stopping it.
  const ScopedRegistration cached(wrapcert::test_support::cached_output_kind());
  gen::TreeSpec spec;
  spec.root.children.push_back({"fc", gen::NodeSpec::leaf_of(gen::Leaf::kLinear)});
  spec.root.children.back().second.wrappers = {"CachedOutput", "CheckpointWrapper"};
  std::cout.flush();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const auto v = props::backward(spec, props::subject(BuiltinUnwrap::kReference));
    ::_exit(v.passed ? 1 : 0);
  }
  int status = 0;
  bool done = false;
  for (int i = 0; i < 600 && !done; ++i) {  // 60 s
    done = ::waitpid(pid, &status, WNOHANG) == pid;
    if (!done) ::usleep(100000);
  }
  if (!done) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  ASSERT_TRUE(done) << "P4 hung on CheckpointWrapper(CachedOutput(Linear))";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "P4 passed a wrapper that returns a stale output";
}

TEST(Certify, BlamesAReleaseThatMakesACycleOnTheRelease) {
  auto kind = wrapper_kind<RelayImpl>("CyclicRelease", "_relayed_module");
  kind.release = [](torch::nn::Module& wrapper) {
    auto inner = dynamic_cast<WrapperImpl&>(wrapper).inner();
    inner->register_module("_back", wrapper.shared_from_this());  // the wrapper below itself
    return inner;
  };
  Options o;
  o.seed = 2;
  o.cases = 20;
  o.properties = {"P14"};
  o.dtypes = {gen::Dtype::kFloat64};
  const auto report = run(kind, o);
  size_t rows = 0;
  for (const auto& e : report.entries) {
    if (e.kind != "CyclicRelease") continue;
    ++rows;
    EXPECT_EQ(e.status, Status::kFailed);
    EXPECT_THAT(e.reason, HasSubstr("the release of the wrapper kinds (CyclicRelease"));
    EXPECT_THAT(e.reason, ::testing::Not(HasSubstr("the subject")));
  }
  EXPECT_EQ(rows, 1u);
}

TEST(Certify, RunsTheBuiltInFlatParameterMode) {
  auto o = quick();
  o.models = {};
  EXPECT_THAT(Registry::global().names_with_modes(),
              ::testing::Contains("FullyShardedDataParallel[flat]"));
  o.kinds = {"FullyShardedDataParallel[flat]"};
  o.cases = cases_to_pass(40);
  const auto report = run(o);
  EXPECT_TRUE(report.passed()) << to_markdown(report);
  size_t checked = 0;
  for (const auto& e : report.entries) {
    if (e.kind != "FullyShardedDataParallel[flat]") continue;
    ++checked;
    // Its wrapped forward is certified like any kind's: gradients reach the flat parameter.
    EXPECT_EQ(e.status, Status::kPassed) << e.property << ": " << e.reason;
    if (e.property != "P9 no false positives" && e.target == "generated trees") {
      EXPECT_GT(e.exercised, 0) << e.property;
    }
  }
  EXPECT_EQ(checked, 13u + 4u * 4u + 1u);
  // The replay of a failure names the mode so that a shell does not read it as a glob.
  o.subject = BuiltinUnwrap::kLegacy;
  o.cases = 15;
  const auto legacy = run(o);
  ASSERT_FALSE(legacy.passed());
  for (const auto& e : legacy.entries) {
    if (e.status != Status::kFailed) continue;
    EXPECT_THAT(e.replay,
                HasSubstr("wrapcert certify --wrappers 'FullyShardedDataParallel[flat]' --subject "
                          "legacy --seed 11"));
    EXPECT_THAT(e.replay, HasSubstr("--properties " + e.property.substr(0, e.property.find(' '))));
  }
}

TEST(Certify, ChecksInChildProcessesDoNotWaitOnTheParentsProcessGroup) {
  // DDP used here first: its Gloo group's threads live in this process only. A child that
  // all-reduced through it waited forever.
  auto ddp =
      std::make_shared<DistributedDataParallelImpl>(std::make_shared<torch::nn::LinearImpl>(3, 3));
  call(*ddp, torch::ones({2, 3})).sum().backward();
  auto o = quick_pass();
  o.kinds = {"DistributedDataParallel"};
  o.models = fixtures::certification_models({"tiny-mistral"});
  o.timeout_seconds = 60;
  const auto report = run(o);
  EXPECT_TRUE(report.passed()) << to_markdown(report);
}

TEST(Certify, RejectsUnknownNamesAndBadOptions) {
  auto o = quick();
  o.kinds = {"FSDP3"};
  EXPECT_THROW((void)run(o), Error);
  o.kinds = {"FullyShardedDataParallel[sharded3]"};  // no such mode
  EXPECT_THROW((void)run(o), Error);
  o.kinds = {"FullyShardedDataParallel[sharded]"};  // certified across ranks only
  EXPECT_THAT([&] { (void)run(o); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("only across ranks")));
  EXPECT_THROW((void)fixtures::certification_models({"llama-7b"}), Error);
  o = quick();
  o.models = {Model{"built-by-nothing", nullptr, {}, false, c10::kFloat}};
  EXPECT_THROW((void)run(o), Error);
  o = quick();
  o.cases = 0;
  EXPECT_THROW((void)run(o), Error);
  o = quick();
  o.timeout_seconds = 0;
  EXPECT_THROW((void)run(o), Error);
}

}  // namespace
}  // namespace wrapcert::certify
