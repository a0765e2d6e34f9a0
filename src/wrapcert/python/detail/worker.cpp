#include <wrapcert/error.h>
#include <wrapcert/python/detail/worker.h>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <sstream>
#include <vector>

extern char** environ;

namespace wrapcert::python {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kTailBytes = 16 * 1024;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

/// Reads what is there without blocking; false at end of file.
bool read_some(int fd, std::string& into) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return true;  // EAGAIN: nothing more for now
  }
}

void keep_tail(std::string& tail) {
  if (tail.size() > kTailBytes) tail.erase(0, tail.size() - kTailBytes);
}

/// The status of a preloaded worker whose keeper ended without saying how it ended.
constexpr int kUnknownStatus = -1;

std::string how_it_ended(int status) {
  if (status == kUnknownStatus) return "ended (its preloaded interpreter gave no status)";
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended";
}

}  // namespace

const char* to_string(Fault fault) {
  switch (fault) {
    case Fault::kNone:
      return "none";
    case Fault::kDied:
      return "died";
    case Fault::kHung:
      return "hung";
    case Fault::kGarbage:
      return "garbage";
    case Fault::kStopped:
      return "stopped";
  }
  return "?";
}

Worker::Worker(WorkerOptions options) : options_(std::move(options)) {}

Worker::~Worker() {
  if (pid_ < 0) return;
  const std::string bye = "{\"op\": \"exit\"}\n";
  (void)::send(in_, bye.data(), bye.size(), MSG_NOSIGNAL);
  close_fd(in_);  // end of input ends the worker's loop as well
  for (int i = 0; i < 100; ++i) {
    if (reap(false)) {
      pid_ = -1;
      break;
    }
    ::usleep(20 * 1000);
  }
  stop(false);
}

bool Worker::start_preloaded(const std::vector<std::string>& variables, const int (&fds)[3]) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (options_.preload.size() >= sizeof address.sun_path) return false;
  std::memcpy(address.sun_path, options_.preload.c_str(), options_.preload.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return false;
  }
  nlohmann::json env = nlohmann::json::object();
  for (const auto& v : variables) {
    const auto eq = v.find('=');
    if (eq != std::string::npos) env[v.substr(0, eq)] = v.substr(eq + 1);
  }
  char cwd[4096];
  const std::string line = nlohmann::json{{"interpreter", options_.interpreter},
                                          {"argv", {options_.script}},
                                          {"env", std::move(env)},
                                          {"cwd", ::getcwd(cwd, sizeof cwd) ? cwd : "/"},
                                          {"faulthandler", true}}
                               .dump() +
                           "\n";
  // The request, with the three descriptors on its first byte.
  char control[CMSG_SPACE(sizeof fds)] = {};
  iovec data{const_cast<char*>(line.data()), line.size()};
  msghdr message{};
  message.msg_iov = &data;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof control;
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof fds);
  std::memcpy(CMSG_DATA(header), fds, sizeof fds);
  ssize_t sent = ::sendmsg(fd, &message, MSG_NOSIGNAL);
  while (sent >= 0 && static_cast<size_t>(sent) < line.size()) {
    const ssize_t n = ::send(fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    sent = n < 0 ? n : sent + n;
  }
  // Its answer: the worker's pid, or why it refused (within 10 s: it forks and answers).
  std::string answer;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (sent >= 0 && answer.find('\n') == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  const auto newline = answer.find('\n');
  const auto reply = newline == std::string::npos
                         ? nlohmann::json()
                         : nlohmann::json::parse(answer.substr(0, newline), nullptr, false);
  if (!reply.is_object() || !reply.contains("pid") || !reply["pid"].is_number_integer()) {
    ::close(fd);
    return false;
  }
  pid_ = reply["pid"].get<pid_t>();
  control_ = fd;
  control_buffer_ = answer.substr(newline + 1);
  ::fcntl(control_, F_SETFL, ::fcntl(control_, F_GETFL) | O_NONBLOCK);
  ++preloaded_starts_;
  return true;
}

bool Worker::reap(bool block) {
  if (control_ < 0) return ::waitpid(pid_, &status_, block ? 0 : WNOHANG) == pid_;
  for (;;) {
    const auto newline = control_buffer_.find('\n');
    if (newline != std::string::npos) {
      const auto message =
          nlohmann::json::parse(control_buffer_.substr(0, newline), nullptr, false);
      control_buffer_.erase(0, newline + 1);
      if (message.is_object() && message.contains("status") &&
          message["status"].is_number_integer()) {
        status_ = message["status"].get<int>();
        close_fd(control_);
        return true;
      }
      continue;
    }
    pollfd p{control_, POLLIN, 0};
    if (::poll(&p, 1, block ? -1 : 0) <= 0) return false;
    if (!read_some(control_, control_buffer_) && control_buffer_.find('\n') == std::string::npos) {
      status_ = kUnknownStatus;  // the keeper is gone (it takes the worker with it)
      close_fd(control_);
      return true;
    }
  }
}

void Worker::signal(int sig) {
  if (control_ < 0) {
    ::kill(pid_, sig);
    return;
  }
  // The keeper signals it while it is not reaped: never a pid that another process reuses.
  const std::string line = "{\"signal\": " + std::to_string(sig) + "}\n";
  (void)::send(control_, line.data(), line.size(), MSG_NOSIGNAL);
}

void Worker::start() {
  int sv[2], out[2], err[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 ||
      ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw Error(ErrorCode::kInvalidArgument, "",
                std::string("cannot make pipes for the Python worker: ") + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  std::vector<std::string> args = {options_.interpreter, "-X", "faulthandler", options_.script};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> variables;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    if (!options_.environment.count(entry.substr(0, entry.find('=')))) variables.push_back(entry);
  }
  for (const auto& [name, value] : options_.environment) variables.push_back(name + "=" + value);
  int rc = 0;
  if (options_.preload.empty() || !start_preloaded(variables, {sv[1], out[1], err[1]})) {
    std::vector<char*> envp;
    for (auto& v : variables) envp.push_back(v.data());
    envp.push_back(nullptr);
    rc = ::posix_spawnp(&pid_, options_.interpreter.c_str(), &actions, nullptr, argv.data(),
                        envp.data());
  }
  posix_spawn_file_actions_destroy(&actions);
  ::close(sv[1]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(sv[0]);
    ::close(out[0]);
    ::close(err[0]);
    pid_ = -1;
    throw Error(ErrorCode::kInvalidArgument, "",
                "cannot start the Python worker '" + options_.interpreter + "': " +
                    std::strerror(rc) + " (set WRAPCERT_PYTHON to an interpreter with PyTorch)");
  }
  in_ = sv[0];
  out_ = out[0];
  err_ = err[0];
  ::fcntl(out_, F_SETFL, ::fcntl(out_, F_GETFL) | O_NONBLOCK);
  ::fcntl(err_, F_SETFL, ::fcntl(err_, F_GETFL) | O_NONBLOCK);
  out_buffer_.clear();
  ++starts_;
}

void Worker::drain_stderr(int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (err_ >= 0) {
    pollfd p{err_, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    if (!read_some(err_, err_tail_)) break;
    keep_tail(err_tail_);
  }
}

void Worker::stop(bool abort_first) {
  if (pid_ > 0) {
    bool reaped = false;
    if (abort_first) {
      signal(SIGABRT);  // faulthandler prints every thread's Python stack, then it dies
      const auto deadline = Clock::now() + std::chrono::seconds(3);
      while (!reaped && Clock::now() < deadline) {
        drain_stderr(50);
        reaped = reap(false);
      }
    } else {
      reaped = reap(false);
    }
    if (!reaped) {
      signal(SIGKILL);
      reap(true);
    }
  }
  pid_ = -1;
  close_fd(control_);
  close_fd(in_);
  close_fd(out_);
  close_fd(err_);
}

std::optional<Reply> Worker::await_ready() {
  const auto limit =
      std::chrono::milliseconds(static_cast<int64_t>(options_.start_timeout_seconds * 1e3));
  const auto deadline = Clock::now() + limit;
  auto fault = [&](Fault f, const std::string& message) {
    Reply reply;
    reply.fault = f;
    reply.message = message;
    reply.stderr_tail = err_tail_;
    return reply;
  };
  for (;;) {
    const auto newline = out_buffer_.find('\n');
    if (newline != std::string::npos) {
      const auto body = nlohmann::json::parse(out_buffer_.substr(0, newline), nullptr, false);
      out_buffer_.erase(0, newline + 1);
      if (body.is_object() && body.value("ready", false)) return std::nullopt;
      continue;  // whatever it said before it was ready is not a reply
    }
    if (interrupted_.exchange(false)) {
      stop(false);
      return fault(Fault::kStopped, "the Python worker was stopped: another rank faulted");
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      stop(true);
      std::ostringstream text;
      text << "the Python worker did not start within " << options_.start_timeout_seconds
           << " s (the limit on starting; the time limit of a case runs from its start)";
      return fault(Fault::kHung, text.str());
    }
    pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 100)));
    if (ready < 0 && errno != EINTR) break;
    if (fds[1].revents) {
      if (!read_some(err_, err_tail_)) close_fd(err_);
      keep_tail(err_tail_);
    }
    if (fds[0].revents && !read_some(out_, out_buffer_) &&
        out_buffer_.find('\n') == std::string::npos) {
      break;
    }
  }
  drain_stderr(2000);
  bool reaped = false;
  for (int i = 0; i < 200 && !reaped; ++i) {
    reaped = reap(false);
    if (!reaped) ::usleep(10 * 1000);
  }
  if (reaped) pid_ = -1;
  stop(false);  // kills it where it did not end
  return fault(Fault::kDied, "the Python worker " + how_it_ended(status_) + " before it started");
}

Reply Worker::call(nlohmann::json request) {
  if (pid_ < 0) {
    start();
    if (options_.start_timeout_seconds > 0) {
      if (auto failed = await_ready()) return *failed;
    }
  }
  const long id = next_id_++;
  request["id"] = id;
  const std::string line = request.dump() + "\n";
  err_tail_.clear();
  Reply reply;
  auto fault = [&](Fault f, const std::string& message) {
    reply.fault = f;
    reply.message = message;
    reply.stderr_tail = err_tail_;
    return reply;
  };
  auto died = [&]() {
    drain_stderr(2000);
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    bool reaped = false;
    while (!reaped && Clock::now() < deadline) {
      reaped = reap(false);
      if (!reaped) ::usleep(10 * 1000);
    }
    if (reaped) pid_ = -1;
    stop(false);
    return fault(Fault::kDied, "the Python worker " + how_it_ended(status_));
  };

  for (size_t sent = 0; sent < line.size();) {
    const ssize_t n = ::send(in_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return died();
    sent += static_cast<size_t>(n);
  }

  const auto deadline = Clock::now() + std::chrono::milliseconds(
                                           static_cast<int64_t>(options_.timeout_seconds * 1e3));
  for (;;) {
    const auto newline = out_buffer_.find('\n');
    if (newline != std::string::npos) {
      const std::string text = out_buffer_.substr(0, newline);
      out_buffer_.erase(0, newline + 1);
      auto body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (body.is_discarded() || !body.is_object() || !body.contains("id") || body["id"] != id) {
        drain_stderr(100);
        stop(false);
        return fault(Fault::kGarbage,
                     "the Python worker replied with something that is not its "
                     "reply: '" +
                         text.substr(0, 200) + "'");
      }
      drain_stderr(0);
      reply.body = std::move(body);
      reply.stderr_tail = err_tail_;
      return reply;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (interrupted_.exchange(false)) {
      stop(false);
      return fault(Fault::kStopped, "the Python worker was stopped: another rank faulted");
    }
    if (left <= 0) {
      stop(true);
      std::ostringstream limit;
      limit << options_.timeout_seconds;
      return fault(Fault::kHung, "the Python worker gave no reply within " + limit.str() + " s");
    }
    pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left, 100)));
    if (ready < 0 && errno != EINTR) return died();
    if (fds[1].revents) {
      if (!read_some(err_, err_tail_)) close_fd(err_);
      keep_tail(err_tail_);
    }
    if (fds[0].revents) {
      if (!read_some(out_, out_buffer_) && out_buffer_.find('\n') == std::string::npos) {
        return died();
      }
    }
  }
}

}  // namespace wrapcert::python
