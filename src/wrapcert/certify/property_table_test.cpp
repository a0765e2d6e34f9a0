#include <wrapcert/certify/properties.h>
#include <wrapcert/certify/property_table.h>
#include <wrapcert/certify/ranks.h>
#include <wrapcert/error.h>
#include <wrapcert/python/certify_python.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace wrapcert {
namespace {

using ::testing::Contains;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(PropertyTable, TheSingleProcessRunTakesEveryPropertyFromIt) {
  const auto& table = props::property_table();
  const auto& run = props::generated_properties();
  ASSERT_EQ(run.size(), table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    SCOPED_TRACE(table[i].name);
    EXPECT_EQ(run[i].name, table[i].name);
    EXPECT_EQ(run[i].checks, table[i].checks);
    EXPECT_EQ(run[i].numeric, table[i].numeric);
    EXPECT_EQ(run[i].trains, table[i].trains);
    EXPECT_THAT(table[i].compares, Not(IsEmpty()));
    EXPECT_THAT(table[i].draws, Not(IsEmpty()));
    EXPECT_EQ(table[i].name.rfind(table[i].id + " ", 0), 0u) << "a name starts with its id";
  }
}

TEST(PropertyTable, TheRanksRunHasARowForEachPropertyItSaysRunsThereAndNoOther) {
  std::set<std::string> want;
  for (const auto& p : props::property_table()) {
    SCOPED_TRACE(p.name);
    if (p.ranks.empty()) {
      EXPECT_THAT(p.not_across_ranks, Not(IsEmpty())) << "a property not run across ranks says why";
    } else {
      EXPECT_THAT(p.not_across_ranks, IsEmpty());
      EXPECT_EQ(p.ranks, p.name + " across ranks");
      want.insert(p.ranks);
    }
  }
  const auto& rows = certify::rank_properties();
  EXPECT_EQ(std::set<std::string>(rows.begin(), rows.end()), want);
}

TEST(PropertyTable, CertifyPythonHasARowForEachPropertyItSaysRunsThereAndNoOther) {
  python::Options options;
  options.wrappers = {"DataParallel"};
  const auto rows = python::row_names(options);
  ASSERT_GE(rows.size(), 2u);
  EXPECT_EQ(rows[0], "layout");
  EXPECT_EQ(rows[1], "C++ agreement");
  std::vector<std::string> want = {"layout", "C++ agreement"};
  for (const auto& p : props::property_table()) {
    SCOPED_TRACE(p.name);
    if (p.python.empty()) {
      EXPECT_THAT(p.not_in_python, Not(IsEmpty())) << "a property not run in Python says why";
      EXPECT_THAT(rows, Not(Contains(p.name)));
    } else {
      EXPECT_THAT(p.not_in_python, IsEmpty());
      want.push_back(p.python);
    }
  }
  EXPECT_EQ(rows, want);
}

TEST(PropertyTable, TheTrainingStepsAreWhatTheReportsSay) {
  int train = 0, no_grad = 0, switches = 0;
  for (const auto& s : props::training_steps(4)) {
    train += s.what == props::TrainingStep::What::kTrain;
    no_grad += s.what == props::TrainingStep::What::kNoGrad;
    switches += s.what == props::TrainingStep::What::kSwitchMode;
    EXPECT_TRUE(s.batch == 1 || s.batch == 4);
  }
  EXPECT_EQ(train, props::kTrainingOptimizerSteps);
  EXPECT_EQ(no_grad, props::kTrainingNoGradCalls);
  EXPECT_EQ(switches, props::kTrainingModeSwitches);
  EXPECT_EQ(switches % 2, 0) << "the loop ends in the mode it began in";
}

TEST(PropertyTable, AnUnknownPropertyIsAnErrorNamingIt) {
  EXPECT_EQ(props::property_info("P4").name, "P4 backward");
  EXPECT_EQ(props::property_info("P17 training").id, "P17");
  try {
    (void)props::property_info("keys");  // neither an id nor a name
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.key_path(), "keys");
  }
}

}  // namespace
}  // namespace wrapcert
