#pragma once
/// A rapidcheck listener that listens to nothing: the default one would also report each
/// failure again at process exit, and certification reports its own.

#include <rapidcheck/detail/TestListener.h>

namespace wrapcert::detail {

class QuietListener : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

}  // namespace wrapcert::detail
