#include <wrapcert/error.h>
#include <wrapcert/python/bridge.h>
#include <wrapcert/python/detail/worker.h>
#include <wrapcert/test_support/matchers.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

namespace wrapcert::python {
namespace {

using test_support::ThrowsError;
using ::testing::_;
using ::testing::HasSubstr;

/// A worker script in a fresh folder, run by the interpreter wrapcert uses.
class WorkerTest : public ::testing::Test {
 protected:
  Worker worker_of(const std::string& body, double timeout = 10) {
    dir_ = std::filesystem::temp_directory_path() /
           ("wrapcert-worker-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "worker.py") << "import json, sys, os, time\n" << body;
    return Worker({bridge::python(), (dir_ / "worker.py").string(), timeout, {}});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

constexpr const char* kEcho =
    "for line in sys.stdin:\n"
    "    req = json.loads(line)\n"
    "    print(json.dumps({'id': req['id'], 'ok': True, 'echo': req.get('text')}), flush=True)\n";

TEST_F(WorkerTest, AnswersRequestsInOneProcess) {
  auto worker = worker_of(kEcho);
  for (const char* text : {"a", "b", "c"}) {
    const auto reply = worker.call({{"text", text}});
    ASSERT_EQ(reply.fault, Fault::kNone) << reply.message;
    EXPECT_EQ(reply.body["echo"], text);
  }
  EXPECT_EQ(worker.starts(), 1);
}

TEST_F(WorkerTest, ALargeReplyArrivesWhole) {
  auto worker = worker_of(kEcho);
  const std::string big(3 << 20, 'x');  // larger than any pipe buffer
  const auto reply = worker.call({{"text", big}});
  ASSERT_EQ(reply.fault, Fault::kNone) << reply.message;
  EXPECT_EQ(reply.body["echo"].get<std::string>().size(), big.size());
}

TEST_F(WorkerTest, AWorkerThatDiesIsAFaultWithItsLastWordsAndTheNextCallStartsAnother) {
  auto worker = worker_of(
      "for line in sys.stdin:\n"
      "    sys.stderr.write('Traceback: it ends here\\n'); sys.stderr.flush()\n"
      "    os._exit(7)\n");
  const auto reply = worker.call({{"op", "x"}});
  EXPECT_EQ(reply.fault, Fault::kDied);
  EXPECT_THAT(reply.message, HasSubstr("exited with status 7"));
  EXPECT_THAT(reply.stderr_tail, HasSubstr("it ends here"));
  EXPECT_EQ(worker.call({{"op", "x"}}).fault, Fault::kDied);
  EXPECT_EQ(worker.starts(), 2);
}

TEST_F(WorkerTest, GarbageIsAFault) {
  auto worker = worker_of("for line in sys.stdin:\n    print('hello', flush=True)\n");
  const auto reply = worker.call({{"op", "x"}});
  EXPECT_EQ(reply.fault, Fault::kGarbage);
  EXPECT_THAT(reply.message, HasSubstr("'hello'"));
}

TEST_F(WorkerTest, AReplyToAnotherRequestIsAFault) {
  auto worker = worker_of(
      "for line in sys.stdin:\n    print(json.dumps({'id': -1, 'ok': True}), flush=True)\n");
  EXPECT_EQ(worker.call({{"op", "x"}}).fault, Fault::kGarbage);
}

TEST_F(WorkerTest, AHangIsStoppedAtTheLimitWithThePythonStack) {
  auto worker = worker_of(
      "def wait_forever():\n    time.sleep(3600)\n"
      "for line in sys.stdin:\n    wait_forever()\n",
      0.5);
  const auto reply = worker.call({{"op", "x"}});
  EXPECT_EQ(reply.fault, Fault::kHung);
  EXPECT_THAT(reply.message, HasSubstr("no reply within 0.5 s"));
  EXPECT_THAT(reply.stderr_tail, HasSubstr("wait_forever"));  // faulthandler's stack
}

TEST(Worker, AnInterpreterThatDoesNotExistIsAnErrorNamingIt) {
  Worker worker({"/nonexistent/python3", "worker.py", 1, {}});
  EXPECT_THAT(
      [&] {
        worker.call({{"op", "x"}});
      },
      ThrowsError(ErrorCode::kInvalidArgument, _, HasSubstr("/nonexistent/python3")));
}

TEST_F(WorkerTest, TheWorkerGetsItsVariablesOverThisProcesssOwn) {
  auto worker = worker_of(
      "for line in sys.stdin:\n"
      "    req = json.loads(line)\n"
      "    print(json.dumps({'id': req['id'], 'rank': os.environ.get('RANK'),\n"
      "                      'path': os.environ.get('PATH')}), flush=True)\n");
  worker.set_environment("RANK", "1");
  const auto reply = worker.call({{"op", "x"}});
  ASSERT_EQ(reply.fault, Fault::kNone) << reply.message;
  EXPECT_EQ(reply.body["rank"], "1");
  EXPECT_EQ(reply.body["path"], std::getenv("PATH"));
  // A variable set later reaches the next process, not the running one.
  worker.set_environment("RANK", "2");
  EXPECT_EQ(worker.call({{"op", "x"}}).body["rank"], "1");
  worker.restart();
  EXPECT_EQ(worker.call({{"op", "x"}}).body["rank"], "2");
  EXPECT_EQ(worker.starts(), 2);
}

TEST_F(WorkerTest, InterruptStopsACallInProgressAtOnce) {
  auto worker = worker_of("for line in sys.stdin:\n    time.sleep(60)\n", 60);
  auto pending = std::async(std::launch::async, [&] { return worker.call({{"op", "x"}}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto asked = std::chrono::steady_clock::now();
  worker.interrupt();
  const auto reply = pending.get();
  EXPECT_EQ(reply.fault, Fault::kStopped);
  EXPECT_THAT(reply.message, HasSubstr("another rank faulted"));
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(5));
}

}  // namespace
}  // namespace wrapcert::python
