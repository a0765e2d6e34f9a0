#include "serve.h"

#include <wrapcert/certify/hardware.h>
#include <wrapcert/certify/launch.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace wrapcert::cli {
namespace {

using nlohmann::json;

/// The variables LibTorch, its libraries, the C library or the sanitizers read once, when the
/// process starts: a request whose values differ from the server's runs in a new process.
bool read_at_start(const std::string& name) {
  static const char* const kPrefixes[] = {"OMP_",    "GOMP_", "KMP_",    "MKL_",   "OPENBLAS_",
                                          "BLIS_",   "LD_",   "MALLOC_", "TORCH_", "PYTORCH_",
                                          "LC_",     "ASAN_", "UBSAN_",  "LSAN_",  "DNNL_",
                                          "ONEDNN_", "CUDA_", "GLOG_",   "GFLAGS_"};
  for (const char* p : kPrefixes) {
    if (name.rfind(p, 0) == 0) return true;
  }
  return name == "GLIBC_TUNABLES" || name == "LANG" || name == "LANGUAGE";
}

/// Why this server must not run `request` ("" where it may).
std::string refusal(const json& request, const std::map<std::string, std::string>& start_env) {
  std::error_code ec;
  const auto self = std::filesystem::canonical("/proc/self/exe", ec);
  const auto program = std::filesystem::canonical(request.value("program", ""), ec);
  if (ec || program != self) return "the program is not this one (" + self.string() + ")";
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : request.at("env").items()) env.emplace(k, v.get<std::string>());
  using Env = std::map<std::string, std::string>;
  for (const Env* side : std::array<const Env*, 2>{&env, &start_env}) {
    for (const auto& entry : *side) {
      const auto& k = entry.first;
      if (!read_at_start(k)) continue;
      const auto a = env.find(k);
      const auto b = start_env.find(k);
      if (a == env.end() || b == start_env.end() || a->second != b->second) {
        return "the variable " + k + " differs from the server's";
      }
    }
  }
  // Limits (`ulimit`): the server's are what a forked child has.
  for (const auto& [name, limit] : request.at("rlimits").items()) {
    const int resource = std::stoi(name);
    rlimit mine{};
    if (getrlimit(resource, &mine) != 0) return "the limit " + name + " cannot be read";
    const auto cur = limit.at(0).get<long long>();
    const auto max = limit.at(1).get<long long>();
    const auto as_ll = [](rlim_t v) { return v == RLIM_INFINITY ? -1LL : (long long)v; };
    if (as_ll(mine.rlim_cur) != cur || as_ll(mine.rlim_max) != max) {
      return "the limit " + name + " differs from the server's";
    }
  }
  return "";
}

void send_line(int fd, const json& message) {
  const std::string line = message.dump() + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::send(fd, line.data() + done, line.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

/// The most descriptors a request carries (the kernel's limit for one message is 253).
constexpr size_t kMaxDescriptors = 253;

void close_all(const std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
}

/// The request's line and its descriptors: stdin, stdout and stderr, then those its "fds" names
/// (the caller's other open descriptors); false where the client sent less.
bool receive(int conn, json& request, std::vector<int>& fds) {
  std::string data;
  char buffer[65536];
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxDescriptors * sizeof(int))];
  iovec iov{buffer, sizeof buffer};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const size_t at = fds.size();
      fds.resize(at + count);
      std::memcpy(fds.data() + at, CMSG_DATA(c), count * sizeof(int));
    }
  }
  if (fds.size() < 3 || (msg.msg_flags & MSG_CTRUNC) != 0) {
    close_all(fds);
    return false;
  }
  data.append(buffer, static_cast<size_t>(n));
  while (data.find('\n') == std::string::npos) {
    const ssize_t more = ::recv(conn, buffer, sizeof buffer, 0);
    if (more <= 0 || data.size() > (64u << 20)) {
      close_all(fds);
      return false;
    }
    data.append(buffer, static_cast<size_t>(more));
  }
  try {
    request = json::parse(data.substr(0, data.find('\n')));
    (void)request.at("argv").get<std::vector<std::string>>();
    (void)request.at("cwd").get<std::string>();
    (void)request.at("env");
    (void)request.at("rlimits");
    const auto others = request.value("fds", std::vector<int>{});
    if (others.size() + 3 == fds.size() &&
        std::all_of(others.begin(), others.end(), [](int target) { return target > 2; })) {
      return true;
    }
    close_all(fds);
    return false;
  } catch (const json::exception&) {
    close_all(fds);
    return false;
  }
}

/// The descriptors open in this process.
std::vector<int> open_descriptors() {
  std::vector<int> listed;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    listed.push_back(std::atoi(it->path().filename().c_str()));
  }
  std::vector<int> open;  // the listing's own descriptor is closed by now
  for (int fd : listed) {
    if (::fcntl(fd, F_GETFD) != -1) open.push_back(fd);
  }
  return open;
}

/// Why the caller's descriptors cannot have their numbers in a child of this keeper ("" where
/// they can): a number this process uses for something else. The descriptors the server was
/// started with (`inherited`: a shell's, ctest's) are not the server's to use: the child gives
/// their numbers to the caller's.
std::string descriptor_clash(const json& request, const std::vector<int>& fds, int conn,
                             const std::vector<int>& inherited) {
  const auto others = request.value("fds", std::vector<int>{});
  const auto in = [](const std::vector<int>& v, int fd) {
    return std::find(v.begin(), v.end(), fd) != v.end();
  };
  for (int fd : open_descriptors()) {
    if (fd < 3 || fd == conn || in(fds, fd) || in(inherited, fd)) continue;
    if (in(others, fd)) {
      return "the caller's descriptor " + std::to_string(fd) + " is one the server uses";
    }
  }
  return "";
}

/// In the forked child: the client's streams and descriptors (none of those the server was
/// started with), folder, signal dispositions, mask, umask and environment, then the command
/// line. Never returns.
[[noreturn]] void become(const json& request, const std::vector<int>& fds,
                         const std::vector<int>& inherited, CommandLine run) {
  // Each descriptor to its number in the caller: first above every number in play, so that
  // none is closed before it is moved.
  std::vector<int> targets{0, 1, 2};
  for (int fd : request.value("fds", std::vector<int>{})) targets.push_back(fd);
  const int base = std::max(*std::max_element(targets.begin(), targets.end()),
                            *std::max_element(fds.begin(), fds.end())) +
                   1;
  std::vector<int> moved;
  for (int fd : fds) {
    moved.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, base));
    if (moved.back() < 0) ::_exit(71);
  }
  close_all(fds);
  for (size_t i = 0; i < targets.size(); ++i) {
    if (::dup2(moved[i], targets[i]) < 0) ::_exit(71);  // without close-on-exec, as inherited
  }
  close_all(moved);
  for (int fd : inherited) {
    if (std::find(targets.begin(), targets.end(), fd) == targets.end()) ::close(fd);
  }
  if (::chdir(request.at("cwd").get<std::string>().c_str()) != 0) {
    std::fprintf(stderr, "wrapcert: cannot enter the caller's folder: %s\n", std::strerror(errno));
    ::_exit(71);
  }
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
  for (const auto& sig : request.value("ignored", json::array())) ::signal(sig.get<int>(), SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  for (const auto& sig : request.value("blocked", json::array())) sigaddset(&mask, sig.get<int>());
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
  if (request.contains("umask")) ::umask(request.at("umask").get<mode_t>());  // else the server's
  ::clearenv();
  for (const auto& [k, v] : request.at("env").items()) {
    ::setenv(k.c_str(), v.get<std::string>().c_str(), 1);
  }
  std::vector<std::string> args{request.at("program").get<std::string>()};
  for (const auto& a : request.at("argv")) args.push_back(a.get<std::string>());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int code = run(static_cast<int>(args.size()), argv.data());
  std::cout.flush();
  std::cerr.flush();
  std::exit(code);
}

/// The keeper, a child of the server: starts the command line in a child of its own, relays
/// signals to it, kills it when the client goes, and sends its wait status.
[[noreturn]] void keep(int conn, const json& request, const std::vector<int>& fds,
                       const std::vector<int>& inherited, const std::string& reason,
                       CommandLine run) {
  ::signal(SIGCHLD, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  const std::string why = reason.empty() ? descriptor_clash(request, fds, conn, inherited) : reason;
  if (!why.empty()) {
    send_line(conn, {{"refused", why}});
    ::_exit(0);
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    send_line(conn, {{"refused", std::string("fork: ") + std::strerror(errno)}});
    ::_exit(0);
  }
  if (pid == 0) {
    ::close(conn);
    become(request, fds, inherited, run);
  }
  close_all(fds);
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  send_line(conn, {{"pid", pid}});
  std::string buffer;
  while (pidfd >= 0) {
    pollfd p[2] = {{pidfd, POLLIN, 0}, {conn, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[0].revents) break;
    char chunk[4096];
    const ssize_t n = ::recv(conn, chunk, sizeof chunk, 0);
    if (n <= 0) {  // the client is gone: so is what it started
      ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
      ::waitpid(pid, nullptr, 0);
      ::_exit(0);
    }
    buffer.append(chunk, static_cast<size_t>(n));
    for (auto nl = buffer.find('\n'); nl != std::string::npos; nl = buffer.find('\n')) {
      const auto line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      try {
        const int sig = json::parse(line).at("signal").get<int>();
        ::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0);
      } catch (const json::exception&) {
      }
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  send_line(conn, {{"status", status}});
  ::_exit(0);
}

volatile sig_atomic_t stopping = 0;

}  // namespace

int serve_forks(const std::string& path, CommandLine run) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    std::cerr << "wrapcert serve-forks: '" << path << "' exists; give a new path\n";
    return 64;
  }
  const auto start_env = hardware::process_environment();
  std::vector<int> inherited;  // what the server was started with, not what it opens
  for (int fd : open_descriptors()) {
    if (fd > 2) inherited.push_back(fd);
  }
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (listener < 0 || path.size() >= sizeof addr.sun_path) {
    std::cerr << "wrapcert serve-forks: cannot listen on '" << path << "'\n";
    return 71;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 64) != 0) {
    std::cerr << "wrapcert serve-forks: cannot listen on '" << path << "': " << std::strerror(errno)
              << "\n";
    return 71;
  }
  ::signal(SIGCHLD, SIG_IGN);  // keepers are reaped by the kernel
  struct sigaction stop {};
  stop.sa_handler = [](int) { stopping = 1; };
  ::sigaction(SIGTERM, &stop, nullptr);  // no SA_RESTART: accept() returns
  ::sigaction(SIGINT, &stop, nullptr);
  while (!stopping) {
    const int conn = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    const timeval limit{10, 0};  // a client that sends no whole request does not stop the server
    ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    json request;
    std::vector<int> fds;
    if (!receive(conn, request, fds)) {
      send_line(conn, {{"refused", "a bad request"}});
      ::close(conn);
      continue;
    }
    const timeval none{0, 0};
    ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    std::string reason = certify::threads_of_this_process() == 1 ? "" : "the server runs threads";
    if (reason.empty()) {
      try {
        reason = refusal(request, start_env);
      } catch (const std::exception& e) {
        reason = std::string("a bad request: ") + e.what();
      }
    }
    const pid_t keeper = ::fork();
    if (keeper == 0) {
      ::close(listener);
      keep(conn, request, fds, inherited, reason, run);
    }
    close_all(fds);
    ::close(conn);
  }
  ::close(listener);
  ::unlink(path.c_str());
  return 0;
}

}  // namespace wrapcert::cli
