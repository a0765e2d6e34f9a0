#include <wrapcert/certify/launch.h>
#include <wrapcert/certify/ranks.h>
#include <wrapcert/error.h>
#include <wrapcert/io/detail/scratch.h>
#include <wrapcert/process_group.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

namespace wrapcert::certify {
namespace {

using Clock = std::chrono::steady_clock;

const char* const kEntryKey = "wrapcert/entry/";
const char* const kDoneKey = "wrapcert/done";

/// The last `lines` lines of a file.
std::string tail(const std::filesystem::path& file, size_t lines = 8) {
  std::ifstream in(file);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += "  | " + all[i] + "\n";
  }
  return out.empty() ? "  | (nothing)\n" : out;
}

std::string how_it_ended(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return std::string("was killed by signal ") + std::to_string(sig) +
           (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  std::filesystem::path log;
  std::filesystem::path collectives;  // a line per collective entered: "<op>(<size>)\t<where>"
  std::string progress;               // "<collectives> <where>"
  Clock::time_point changed;
};

/// Where the ranks' collectives first differ: the same position in each rank's sequence holding
/// different collectives (a rank that skipped one, or called one the others did not). A rank that
/// stopped early (hung or ended) is not a difference: it is the rank the others wait for.
struct Divergence {
  size_t index = 0;  // 0-based position in the sequences
  std::vector<std::pair<std::string, std::vector<int>>>
      groups;                      // collective, its ranks; largest first
  std::vector<std::string> where;  // each rank's mark at that collective
};

std::optional<Divergence> diverged(const std::vector<Rank>& ranks) {
  // The files side by side, a line of each at a time: memory for one line a rank, however long
  // the run.
  std::vector<std::ifstream> files;
  files.reserve(ranks.size());
  for (const auto& rank : ranks) files.emplace_back(rank.collectives);
  std::vector<std::pair<std::string, std::string>> at(ranks.size());  // op, where
  for (size_t i = 0;; ++i) {
    std::map<std::string, std::vector<int>> by;
    for (size_t r = 0; r < files.size(); ++r) {
      std::string line;
      // A rank that stopped has no line here; nor has one whose last line was being written
      // when it ended (no newline yet).
      if (!files[r] || !std::getline(files[r], line) || files[r].eof()) {
        files[r].setstate(std::ios::failbit);
        at[r] = {};
        continue;
      }
      const auto tab = line.find('\t');
      at[r] = {line.substr(0, tab),
               tab == std::string::npos ? std::string() : line.substr(tab + 1)};
      by[at[r].first].push_back(static_cast<int>(r));
    }
    if (by.empty()) return std::nullopt;  // every sequence ended, the same
    if (by.size() < 2) continue;
    Divergence d;
    d.index = i;
    for (auto& [op, who] : by) d.groups.emplace_back(op, who);
    std::stable_sort(d.groups.begin(), d.groups.end(), [](const auto& a, const auto& b) {
      return a.second.size() > b.second.size();
    });
    for (const auto& [op, where] : at) d.where.push_back(where);
    return d;
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

int64_t collectives_of(const std::string& progress) {
  return progress.empty() ? -1 : std::atoll(progress.c_str());
}

std::string where_of(const std::string& progress) {
  const auto space = progress.find(' ');
  return space == std::string::npos ? std::string() : progress.substr(space + 1);
}

}  // namespace

size_t threads_of_this_process() {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return ec || n == 0 ? 2 : n;
}

Report run_rank(Options options, const Rendezvous& rendezvous, const Listener& listener) {
  auto group = ProcessGroup::join(rendezvous);
  // One seed for every rank: rank 0's, drawn when none was given.
  if (options.seed == 0 && group->rank() == 0) options.seed = std::random_device{}() | 1u;
  const auto seeds = group->all_gather_text(std::to_string(options.seed));
  for (size_t r = 1; r < seeds.size(); ++r) {
    if (seeds[r] != "0" && seeds[r] != seeds[0]) {
      throw Error(ErrorCode::kInvalidArgument, "seed",
                  "rank " + std::to_string(r) + " was started with seed " + seeds[r] +
                      ", rank 0 with " + seeds[0]);
    }
  }
  options.seed = std::stoull(seeds[0]);
  int published = 0;
  auto publish = [&](const Entry& entry, bool done) {
    if (listener) listener(entry, done);
    if (done && group->rank() == 0) {
      group->publish(kEntryKey + std::to_string(published++), entry_to_json(entry));
    }
  };
  auto report = run_ranks(options, group, publish);
  if (group->rank() == 0) group->publish(kDoneKey, std::to_string(published));
  (void)group->all_gather_text("end");  // no rank ends before the end is published
  return report;
}

Report launch_ranks(const Options& options, const World& world, const Listener& listener) {
  if (world.size < 1) throw Error(ErrorCode::kInvalidArgument, "world_size", "must be at least 1");
  if (world.command.empty()) throw Error(ErrorCode::kInvalidArgument, "", "no rank command");
  // Forked ranks start before the store does (its server is a thread, and a fork copies only
  // the thread that forks): each waits for the store's port on a pipe of its own.
  const bool forking = world.here && threads_of_this_process() == 1;
  std::optional<StoreServer> store;
  if (!forking) store.emplace(0);
  std::vector<int> port_pipes;  // the write ends, one a forked rank
  // The ranks' logs, in $TMPDIR (or /tmp); removed when the run ends, however it ends.
  const detail::ScratchFolder logs("wrapcert-ranks");
  const std::filesystem::path dir = logs.path();
  Report report;
  report.options = options;
  std::vector<Rank> ranks(static_cast<size_t>(world.size));
  std::vector<char*> argv;
  for (const auto& word : world.command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  for (int r = 0; r < world.size; ++r) {
    auto& rank = ranks[static_cast<size_t>(r)];
    rank.log = dir / ("rank-" + std::to_string(r) + ".log");
    rank.collectives = dir / ("rank-" + std::to_string(r) + ".collectives");
    const int fd = ::open(rank.log.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw Error(ErrorCode::kInvalidArgument, "", "cannot open " + rank.log.string());
    const int seq_fd =
        ::open(rank.collectives.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (seq_fd < 0) {
      ::close(fd);
      throw Error(ErrorCode::kInvalidArgument, "", "cannot open " + rank.collectives.string());
    }
    int port[2] = {-1, -1};
    if (forking && ::pipe2(port, O_CLOEXEC) != 0) {
      ::close(fd);
      ::close(seq_fd);
      throw Error(ErrorCode::kInvalidArgument, "", "cannot make a pipe for a rank");
    }
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);  // nothing buffered here is written again by a forked rank
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::fcntl(seq_fd, F_SETFD, 0);  // this rank's own file, kept open across exec
      ::setenv("WRAPCERT_COLLECTIVES_FD", std::to_string(seq_fd).c_str(), 1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world.size).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("WRAPCERT_STORE_SERVED", "1", 1);
      if (!forking) {
        ::setenv("MASTER_PORT", std::to_string(store->port()).c_str(), 1);
        ::execv(argv[0], argv.data());
        std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
        ::_exit(127);
      }
      for (const int other : port_pipes) ::close(other);  // the launcher's alone: EOF if it dies
      ::close(port[1]);
      std::string text;
      char c = 0;
      while (::read(port[0], &c, 1) == 1 && c != '\n') text += c;
      ::close(port[0]);
      if (c != '\n') ::_exit(127);  // the launcher ended before its store started
      ::setenv("MASTER_PORT", text.c_str(), 1);
      int code = 2;
      try {
        code = world.here();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
      }
      std::cout.flush();
      std::cerr.flush();
      std::fflush(nullptr);
      ::_exit(code);
    }
    if (forking) {
      ::close(port[0]);
      port_pipes.push_back(port[1]);
    }
    ::close(fd);
    ::close(seq_fd);
    rank.pid = pid;
    rank.running = pid > 0;
    rank.changed = Clock::now();
  }
  if (forking) {
    std::optional<Error> failed;
    try {
      store.emplace(0);
    } catch (const Error& e) {
      failed = e;
    }
    const std::string line = store ? std::to_string(store->port()) + "\n" : std::string();
    for (const int w : port_pipes) {
      if (!line.empty()) (void)!::write(w, line.data(), line.size());
      ::close(w);  // no port: the ranks end (127) and are reaped below
    }
    if (failed) {
      for (auto& rank : ranks) {
        if (rank.pid > 0) ::waitpid(rank.pid, nullptr, 0);
      }
      throw *failed;
    }
  }
  size_t received = 0;
  // The entries rank 0 reported since the last call, to the report and the listener.
  auto take_entries = [&] {
    const size_t before = received;
    while (auto text = store->get(kEntryKey + std::to_string(received))) {
      auto entry = entry_from_json(*text);
      if (listener) {
        listener(entry, false);
        listener(entry, true);
      }
      report.entries.push_back(std::move(entry));
      ++received;
    }
    return received > before;
  };
  std::optional<int> done;
  auto last_progress = Clock::now();
  std::string failure;
  std::string stalled;  // how a hang showed, without naming a rank
  int culprit = -1;
  std::vector<int> abnormal;  // ranks that ended before the end, in the order seen
  while (true) {
    if (take_entries()) last_progress = Clock::now();
    if (!done) {
      if (const auto d = store->get(kDoneKey)) done = std::atoi(d->c_str());
    }
    // Where each rank is.
    for (int r = 0; r < world.size; ++r) {
      auto& rank = ranks[static_cast<size_t>(r)];
      if (const auto p = store->get("wrapcert/progress/" + std::to_string(r));
          p && *p != rank.progress) {
        rank.progress = *p;
        rank.changed = last_progress = Clock::now();
      }
    }
    // Who ended: normally (0, or 1 for failed checks) once rank 0 reported the end, else
    // abnormally.
    bool all_ended = true;
    for (int r = 0; r < world.size; ++r) {
      auto& rank = ranks[static_cast<size_t>(r)];
      if (!rank.running) continue;
      int status = 0;
      if (::waitpid(rank.pid, &status, WNOHANG) == rank.pid) {
        rank.running = false;
        rank.status = status;
        const bool clean =
            WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 1);
        if (!clean || !done) abnormal.push_back(r);
      } else {
        all_ended = false;
      }
    }
    if (!abnormal.empty() && failure.empty()) {
      // A killed rank is named before one that exited because its peer went away.
      culprit = abnormal.front();
      for (const int r : abnormal) {
        if (WIFSIGNALED(ranks[static_cast<size_t>(r)].status)) {
          culprit = r;
          break;
        }
      }
      failure = "rank " + std::to_string(culprit) + " " +
                how_it_ended(ranks[static_cast<size_t>(culprit)].status) + " before the run ended";
    }
    if (all_ended) break;
    if (!failure.empty()) {
      // Give the other ranks a moment to end on their own (a peer's death reaches them), then
      // stop them.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      break;
    }
    if (Clock::now() - last_progress > std::chrono::seconds(world.timeout_seconds)) {
      // The hung rank is the one the others wait for: the fewest collectives entered.
      int64_t fewest = INT64_MAX;
      for (int r = 0; r < world.size; ++r) {
        const auto n = collectives_of(ranks[static_cast<size_t>(r)].progress);
        if (ranks[static_cast<size_t>(r)].running && n < fewest) {
          fewest = n;
          culprit = r;
        }
      }
      const auto& hung = ranks[static_cast<size_t>(culprit)];
      stalled = "no rank made progress for " + std::to_string(world.timeout_seconds) + " s";
      failure = "rank " + std::to_string(culprit) + " hung: " + stalled +
                (where_of(hung.progress).empty()
                     ? std::string()
                     : " (it was at " + where_of(hung.progress) + ", the others waiting for it)");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Stop whatever still runs: SIGTERM, then SIGKILL; reap everything.
  for (auto& rank : ranks) {
    if (rank.running) ::kill(rank.pid, SIGTERM);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  for (auto& rank : ranks) {
    while (rank.running) {
      int status = 0;
      if (::waitpid(rank.pid, &status, WNOHANG) == rank.pid) {
        rank.running = false;
        rank.status = status;
      } else if (Clock::now() > deadline) {
        ::kill(rank.pid, SIGKILL);
        ::waitpid(rank.pid, &status, 0);
        rank.running = false;
        rank.status = status;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  (void)take_entries();  // what rank 0 reported after the last look
  if (failure.empty() && !done) {
    culprit = 0;
    failure = "rank 0 ended without reporting the end of the run";
  }
  // Ranks that entered different collectives at the same point: whatever ended the run (a rank
  // aborted by Gloo on a message of another size, a hang, or nothing), the cause is the rank whose
  // collectives differ from the others'. A clean run's ranks enter the same ones.
  std::string divergence_key;
  if (const auto d = diverged(ranks)) {
    const auto& [majority_op, majority] = d->groups.front();
    const bool unique = d->groups.size() > 1 && d->groups[1].second.size() < majority.size();
    std::string text;
    for (size_t g = unique ? 1 : 0; g < d->groups.size(); ++g) {
      const auto& [op, who] = d->groups[g];
      text += (text.empty() ? "" : "; ") + rank_list(who) + " entered " + op +
              (d->where[static_cast<size_t>(who.front())].empty()
                   ? std::string()
                   : " (at " + d->where[static_cast<size_t>(who.front())] + ")");
    }
    const std::string cause =
        "the ranks' collectives differ at their collective " + std::to_string(d->index + 1) + ": " +
        text +
        (unique ? std::string(", where ") + rank_list(majority) + " entered " + majority_op
                : std::string(" (no majority: any of them may be the one that differs)"));
    std::vector<int> odd;
    for (size_t g = unique ? 1 : 0; g < d->groups.size(); ++g) {
      odd.insert(odd.end(), d->groups[g].second.begin(), d->groups[g].second.end());
    }
    std::sort(odd.begin(), odd.end());
    culprit = odd.front();
    divergence_key = rank_list(odd);
    failure = failure.empty() ? cause : cause + "; then " + (stalled.empty() ? failure : stalled);
  }
  if (!failure.empty()) {
    Entry entry;
    entry.kind = options.kinds.size() == 1 ? options.kinds[0] : "ranks";
    entry.property = "ranks";
    entry.target = "world size " + std::to_string(world.size);
    entry.status = Status::kFailed;
    const auto& rank = ranks[static_cast<size_t>(std::max(culprit, 0))];
    entry.reason = failure + "; its last output:\n" + tail(rank.log);
    for (int r = 0; r < world.size; ++r) {
      if (r == culprit) continue;
      const auto& other = ranks[static_cast<size_t>(r)];
      entry.reason += "rank " + std::to_string(r) + " " + how_it_ended(other.status) +
                      "; its last output:\n" + tail(other.log, 3);
    }
    entry.key = divergence_key.empty() ? "rank " + std::to_string(culprit) : divergence_key;
    // The launcher's own command line runs it again (a rank's is the same, with torchrun's
    // variables).
    entry.replay = world.replay;
    if (listener) {
      listener(entry, false);
      listener(entry, true);
    }
    report.entries.push_back(std::move(entry));
  }
  return report;
}

}  // namespace wrapcert::certify
