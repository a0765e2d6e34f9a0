#include <wrapcert/error.h>
#include <wrapcert/python/bridge.h>
#include <wrapcert/python/certify_python.h>
#include <wrapcert/python/detail/worker.h>
#include <wrapcert/test_support/matchers.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

extern char** environ;

namespace wrapcert::python {
namespace {

using test_support::ThrowsError;
using ::testing::_;
using ::testing::HasSubstr;

/// A worker script in a fresh folder, run by the interpreter wrapcert uses.
class WorkerTest : public ::testing::Test {
 protected:
  /// The script, in this test's folder.
  std::string script_of(const std::string& body) {
    dir_ = std::filesystem::temp_directory_path() /
           ("wrapcert-worker-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "worker.py") << "import json, sys, os, time\n" << body;
    return (dir_ / "worker.py").string();
  }
  Worker worker_of(const std::string& body, double timeout = 10) {
    return Worker({bridge::python(), script_of(body), timeout, {}});
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

constexpr const char* kEcho =
    "for line in sys.stdin:\n"
    "    req = json.loads(line)\n"
    "    print(json.dumps({'id': req['id'], 'ok': True, 'echo': req.get('text')}), flush=True)\n";

/// A worker that says where it ends, then exits with status 7.
constexpr const char* kDiesWithLastWords =
    "for line in sys.stdin:\n"
    "    sys.stderr.write('Traceback: it ends here\\n'); sys.stderr.flush()\n"
    "    os._exit(7)\n";

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
  auto worker = worker_of(kDiesWithLastWords);
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

/// The same worker scripts, started by a preloaded interpreter (tools/python/wrapcert_preload.py)
/// that this suite starts once.
class PreloadedWorker : public WorkerTest {
 protected:
  static void SetUpTestSuite() {
    folder_ = std::filesystem::temp_directory_path() /
              ("wrapcert-preload-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(folder_);
    socket_ = (folder_ / "preload.sock").string();
    const auto script = (std::filesystem::path(worker_dir({})) / "wrapcert_preload.py").string();
    std::vector<std::string> args = {bridge::python(), script, "serve", socket_};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(::posix_spawn(&server_, args[0].c_str(), nullptr, nullptr, argv.data(), environ), 0);
    for (int i = 0; i < 600 && !std::filesystem::exists(socket_); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(std::filesystem::exists(socket_)) << "the preloaded interpreter did not start";
  }
  static void TearDownTestSuite() {
    if (server_ > 0) {
      ::kill(server_, SIGTERM);
      ::waitpid(server_, nullptr, 0);
    }
    std::filesystem::remove_all(folder_);
  }
  Worker preloaded(const std::string& body, double timeout = 10) {
    return Worker({bridge::python(), script_of(body), timeout, {}, 0, socket_});
  }
  static inline std::filesystem::path folder_;
  static inline std::string socket_;
  static inline pid_t server_ = -1;
};

TEST_F(PreloadedWorker, AnswersRequestsInOneProcessForkedThere) {
  auto worker = preloaded(kEcho);
  for (const char* text : {"a", "b"}) {
    const auto reply = worker.call({{"text", text}});
    ASSERT_EQ(reply.fault, Fault::kNone) << reply.message;
    EXPECT_EQ(reply.body["echo"], text);
  }
  EXPECT_EQ(worker.starts(), 1);
  EXPECT_EQ(worker.preloaded_starts(), 1);
}

TEST_F(PreloadedWorker, StartsAsANewInterpreterWould) {
  auto worker = preloaded(
      "import random, tempfile\n"
      "import numpy as np\n"
      "for line in sys.stdin:\n"
      "    req = json.loads(line)\n"
      "    print(json.dumps({'id': req['id'], 'name': __name__, 'argv': sys.argv,\n"
      "                      'path': sys.path[:2], 'rank': os.environ.get('RANK'),\n"
      "                      'tmp': tempfile.gettempdir(), 'cwd': os.getcwd(),\n"
      "                      'torch': 'torch' in sys.modules,\n"
      "                      'random': random.getrandbits(64),\n"
      "                      'numpy': int(np.random.randint(2**62))}), flush=True)\n");
  worker.set_environment("RANK", "3");
  worker.set_environment("PYTHONPATH", "/wrapcert/a:/wrapcert/b");
  worker.set_environment("TMPDIR", dir_.string());
  const auto first = worker.call({{"op", "x"}});
  ASSERT_EQ(first.fault, Fault::kNone) << first.message;
  EXPECT_EQ(worker.preloaded_starts(), 1);
  EXPECT_EQ(first.body["name"], "__main__");
  EXPECT_EQ(first.body["argv"], nlohmann::json({(dir_ / "worker.py").string()}));
  EXPECT_EQ(first.body["path"],
            nlohmann::json({std::filesystem::canonical(dir_).string(), "/wrapcert/a"}));
  EXPECT_EQ(first.body["rank"], "3");
  EXPECT_EQ(first.body["tmp"], dir_.string());
  EXPECT_EQ(first.body["cwd"], std::filesystem::current_path().string());
  EXPECT_EQ(first.body["torch"], true);  // what the interpreter preloaded
  // Each process its own random seed, as each new interpreter has.
  worker.restart();
  const auto second = worker.call({{"op", "x"}});
  EXPECT_EQ(worker.preloaded_starts(), 2);
  EXPECT_NE(second.body["random"], first.body["random"]);
  EXPECT_NE(second.body["numpy"], first.body["numpy"]);  // numpy came preloaded with torch
}

TEST_F(PreloadedWorker, AStartUpVariableItDidNotStartWithGetsANewInterpreter) {
  auto worker = preloaded(
      "for line in sys.stdin:\n"
      "    req = json.loads(line)\n"
      "    print(json.dumps({'id': req['id'], 'seed': os.environ.get('PYTHONHASHSEED'),\n"
      "                      'hash': hash('wrapcert')}), flush=True)\n");
  worker.set_environment("PYTHONHASHSEED", "123");
  const auto reply = worker.call({{"op", "x"}});
  ASSERT_EQ(reply.fault, Fault::kNone) << reply.message;
  EXPECT_EQ(reply.body["seed"], "123");
  EXPECT_EQ(worker.starts(), 1);
  EXPECT_EQ(worker.preloaded_starts(), 0);  // refused: the hash seed is fixed at start-up
  worker.restart();
  EXPECT_EQ(worker.call({{"op", "x"}}).body["hash"], reply.body["hash"]);
}

TEST_F(PreloadedWorker, NoServerThereGetsANewInterpreter) {
  Worker elsewhere(
      {bridge::python(), script_of(kEcho), 10, {}, 0, (dir_ / "no-such.sock").string()});
  EXPECT_EQ(elsewhere.call({{"text", "a"}}).body["echo"], "a");
  EXPECT_EQ(elsewhere.preloaded_starts(), 0);
}

TEST_F(PreloadedWorker, ItsEndIsAFaultWithItsLastWords) {
  auto worker = preloaded(kDiesWithLastWords);
  const auto reply = worker.call({{"op", "x"}});
  EXPECT_EQ(reply.fault, Fault::kDied);
  EXPECT_THAT(reply.message, HasSubstr("exited with status 7"));
  EXPECT_THAT(reply.stderr_tail, HasSubstr("it ends here"));
  auto crashing =
      preloaded("import signal\nfor line in sys.stdin:\n    os.kill(os.getpid(), 11)\n");
  EXPECT_THAT(crashing.call({{"op", "x"}}).message, HasSubstr("killed by signal 11"));
  EXPECT_EQ(crashing.preloaded_starts(), 1);
}

TEST_F(PreloadedWorker, AHangIsStoppedAtTheLimitWithThePythonStack) {
  auto worker = preloaded(
      "def wait_forever():\n    time.sleep(3600)\n"
      "for line in sys.stdin:\n    wait_forever()\n",
      0.5);
  const auto reply = worker.call({{"op", "x"}});
  EXPECT_EQ(reply.fault, Fault::kHung);
  EXPECT_THAT(reply.stderr_tail, HasSubstr("wait_forever"));  // faulthandler's stack
  EXPECT_THAT(reply.message, HasSubstr("no reply within 0.5 s"));
}

TEST_F(PreloadedWorker, AWorkerLeftHangingEndsWithTheWorkerObject) {
  pid_t pid = -1;
  {
    auto worker = preloaded(
        "for line in sys.stdin:\n"
        "    req = json.loads(line)\n"
        "    print(json.dumps({'id': req['id'], 'pid': os.getpid()}), flush=True)\n"
        "    time.sleep(3600)\n");
    pid = worker.call({{"op", "x"}}).body.value("pid", -1);
    ASSERT_GT(pid, 0);
    ASSERT_EQ(::kill(pid, 0), 0);
  }
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = ::kill(pid, 0) != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(gone) << "pid " << pid << " still runs";
}

}  // namespace
}  // namespace wrapcert::python
