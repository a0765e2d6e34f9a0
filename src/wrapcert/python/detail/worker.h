#pragma once
/// A persistent Python process that answers JSON requests, one per line (the protocol is in
/// docs/python.md). Whatever the code it runs does (raise, crash, hang, print), a call returns:
/// a fault is a `Reply`, and the next call starts a fresh worker.
///
///   wrapcert::python::Worker worker({"/usr/bin/python3", "tools/python/wrapcert_worker.py"});
///   auto reply = worker.call({{"op", "hello"}});
///   if (reply.fault == wrapcert::python::Fault::kNone) std::cout << reply.body["torch"];

#include <nlohmann/json.hpp>

#include <sys/types.h>
#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace wrapcert::python {

struct WorkerOptions {
  std::string interpreter;       ///< the Python to run
  std::string script;            ///< wrapcert_worker.py
  double timeout_seconds = 120;  ///< per call; the worker is stopped as hung after it
  /// Variables set for the worker over this process's own (a rank's RANK, WORLD_SIZE, ...).
  std::map<std::string, std::string> environment;
  /// Above 0: a started worker first announces itself with a line `{"ready": true, ...}` (the
  /// interpreter up, its imports done), within this many seconds, and a call's own limit runs
  /// from there; a worker that does not is a fault that says it did not start.
  double start_timeout_seconds = 0;
  /// A preloaded interpreter's socket (tools/python/wrapcert_preload.py; WRAPCERT_PYTHON_PRELOAD
  /// in certify-python): the worker is started there, forked from an interpreter that has
  /// imported torch, where it accepts; else, and where it refuses (another interpreter, other
  /// start-up variables), as a new process.
  std::string preload = "";
};

enum class Fault {
  kNone,     ///< a reply (which may say the code under test raised: body["ok"] is false)
  kDied,     ///< the worker exited or was killed by a signal before replying
  kHung,     ///< no reply within the time limit; the worker was stopped
  kGarbage,  ///< the reply was not one JSON object with the request's id
  kStopped,  ///< `interrupt()` stopped it before it replied (another rank faulted)
};
const char* to_string(Fault fault);

struct Reply {
  Fault fault = Fault::kNone;
  nlohmann::json body;      ///< the reply, when there was one
  std::string message;      ///< for a fault: what happened, in one line
  std::string stderr_tail;  ///< the worker's last stderr output (a Python traceback)
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Sends `request` (an "id" is added) and waits for its reply.
  Reply call(nlohmann::json request);
  /// How many processes were started so far (1 after the first call, more after faults).
  int starts() const { return starts_; }
  /// How many of them a preloaded interpreter started.
  int preloaded_starts() const { return preloaded_starts_; }
  /// Makes a `call` in progress on another thread stop the worker and return `kStopped`
  /// within 100 ms (or the next call, when none is in progress). Safe from any thread.
  void interrupt() { interrupted_ = true; }
  /// Sets a variable for the worker's next start; the running one keeps what it started with.
  void set_environment(const std::string& name, const std::string& value) {
    options_.environment[name] = value;
  }
  /// Stops the process now, if one runs, and forgets an `interrupt()`; the next call starts a
  /// fresh one.
  void restart() {
    interrupted_ = false;
    stop(false);
  }

 private:
  void start();
  /// Asks the preloaded interpreter to start the worker on these descriptors (stdin, stdout,
  /// stderr); false where it is not there or refuses.
  bool start_preloaded(const std::vector<std::string>& variables, const int (&fds)[3]);
  /// Whether the process ended (its wait status in `status_`); with `block`, waits for it.
  bool reap(bool block);
  void signal(int sig);
  /// Waits for the ready line (see `WorkerOptions::start_timeout_seconds`); a fault if none.
  std::optional<Reply> await_ready();
  /// Stops the process (SIGABRT first, so Python's faulthandler prints where it was).
  void stop(bool abort_first);
  void drain_stderr(int timeout_ms);

  WorkerOptions options_;
  pid_t pid_ = -1;
  int in_ = -1;   // the worker's stdin (a socket: a dead reader is an error, not SIGPIPE)
  int out_ = -1;  // its replies
  int err_ = -1;  // its stderr
  std::string out_buffer_;
  std::string err_tail_;
  int control_ = -1;  // a preloaded worker's keeper: its wait status, and signals for it
  std::string control_buffer_;
  int status_ = 0;  // how it ended, after stop()
  long next_id_ = 1;
  int starts_ = 0;
  int preloaded_starts_ = 0;
  std::atomic<bool> interrupted_{false};
};

}  // namespace wrapcert::python
