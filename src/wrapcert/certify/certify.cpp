#include <wrapcert/certify/certify.h>
#include <wrapcert/certify/detail/quiet_check.h>
#include <wrapcert/certify/hardware.h>
#include <wrapcert/certify/properties.h>
#include <wrapcert/detail/blame.h>
#include <wrapcert/error.h>
#include <wrapcert/gen/generators.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/wrap.h>
#include <wrapcert/wrappers.h>

#include <ATen/Parallel.h>
#include <fcntl.h>
#include <poll.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/TestListener.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <set>

namespace wrapcert::certify {
namespace {

using props::Verdict;
using Clock = std::chrono::steady_clock;

constexpr const char* kGenerated = "generated trees";
constexpr const char* kDeepChain = "10,000-deep chain";

/// Who threw (as noted while the model ran or was built, else the unwrap subject) and the
/// message's first line: LibTorch appends a backtrace, a report wants the message.
std::string first_line(const std::string& text) {
  const auto who = detail::take_blame();
  return (who.empty() ? std::string("the subject or the fixture") : who) +
         " threw: " + text.substr(0, text.find('\n'));
}

Entry new_entry(const std::string& kind, const std::string& property, const std::string& target) {
  Entry entry;
  entry.kind = kind;
  entry.property = property;
  entry.target = target;
  return entry;
}

Entry run_generated(const std::string& kind, const props::GeneratedProperty& property,
                    const props::UnwrapSubject& subject, const props::Translator& translator,
                    const Options& options) {
  Entry entry = new_entry(kind, property.name, kGenerated);
  const auto start = Clock::now();
  gen::GenOptions g;
  // The certified kind is drawn as often as all built-in kinds together; other kinds the
  // process registered (a plugin's siblings) are not drawn.
  g.kinds = Registry::with_builtins().names();
  const size_t others = g.kinds.size();
  for (size_t i = 0; i < others; ++i) g.kinds.push_back(kind);
  property.adjust(g);
  const auto trees = gen::trees(g);
  auto shrunk = std::make_shared<gen::TreeSpec>();
  auto verdict = std::make_shared<Verdict>();
  auto runs = std::make_shared<int>(0);
  const auto result = detail::check_quietly(
      kind + "." + property.name, options.seed, options.cases, options.max_size, [&] {
        const auto spec = *trees;
        const auto v = property.check(spec, subject, translator);
        ++*runs;
        if (!v.passed) {
          *shrunk = spec;  // shrinking accepts smaller failures in turn: the last is the minimum
          *verdict = v;
        }
        RC_PRE(!v.skipped);
        RC_ASSERT(v.passed);
      });
  entry.cases = *runs;
  rc::detail::FailureResult failure;
  rc::detail::GaveUpResult gave_up;
  if (result.match(failure)) {
    entry.status = Status::kFailed;
    entry.reason = verdict->reason.empty() ? failure.description : verdict->reason;
    entry.key = verdict->key;
    entry.counterexample = gen::describe(*shrunk, verdict->key);
  } else if (result.match(gave_up)) {
    entry.status = Status::kSkipped;
    entry.reason = "too few generated cases apply: " + gave_up.description;
  }
  entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return entry;
}

/// P11 in depth, once per kind: a 10,000-deep chain of the kind in turn with the built-in kinds.
Entry run_deep_chain(const std::string& kind, const props::UnwrapSubject& subject) {
  Entry entry = new_entry(kind, "P11 graph safety", kDeepChain);
  const auto start = Clock::now();
  std::vector<std::string> kinds{kind};
  for (const auto& name : Registry::with_builtins().names()) {
    if (name != kind) kinds.push_back(name);
  }
  const auto verdict = props::deep_chain(kinds, subject);
  entry.cases = 1;
  if (!verdict.passed) {
    entry.status = Status::kFailed;
    entry.reason = verdict.reason;
    entry.key = verdict.key;
  }
  entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return entry;
}

/// Every decoder layer and the root wrapped in `kind`.
ModulePtr wrap_fixture(const ModulePtr& model, const Model& config, const std::string& kind) {
  try {
    return auto_wrap(model, config.wrap_classes, Registry::global().resolve(kind).descriptor());
  } catch (...) {
    detail::note_blame("the wrapper kind " + kind + " (wrapping the fixture)");
    throw;
  }
}

std::vector<std::shared_ptr<WrapperImpl>> wrappers_in(const ModulePtr& root) {
  std::vector<std::shared_ptr<WrapperImpl>> out;
  const auto view = ModuleView::of(root);
  for (size_t i = 0; i < view.size(); ++i) {
    if (auto w = std::dynamic_pointer_cast<WrapperImpl>(view.node(i).module)) out.push_back(w);
  }
  return out;
}

const char* const kLayoutProperties[] = {"P1 keys", "P2 identity", "P3 ties"};

/// P1, P2 or P3 on a full-size fixture on the meta device, on a freshly built model.
Entry run_layout(const std::string& kind, const Model& config, const props::UnwrapSubject& subject,
                 const std::string& property) {
  Entry entry = new_entry(kind, property, config.name);
  const auto start = Clock::now();
  entry.cases = 1;
  (void)detail::take_blame();
  try {
    auto model = config.build(c10::kMeta, config.dtype);
    const auto original = state_dict(model);
    const auto state = subject(wrap_fixture(model, config, kind)).state;
    auto fail = [&entry](std::string reason, std::string key) {
      entry.status = Status::kFailed;
      entry.reason = std::move(reason);
      entry.key = std::move(key);
    };
    if (property == "P1 keys") {
      if (const auto d = props::first_key_difference(state.keys(), original.keys())) {
        fail("the unwrapped keys differ from the model's: " + d->describe(), d->key());
      }
    } else if (property == "P2 identity") {
      for (const auto& item : original) {
        const auto* got = state.find(item.key());
        if (!got || !got->is_same(item.value())) {
          fail(got ? "not the model's own tensor" : "missing", item.key());
          break;
        }
      }
    } else if (property == "P3 ties") {
      const auto want = props::tie_groups(original);
      const auto got = props::tie_groups(state);
      for (const auto& group : want) {
        if (!got.count(group)) {
          fail("tied keys no longer share one tensor", group.back());
          break;
        }
      }
      for (const auto& group : got) {
        if (entry.status != Status::kFailed && !want.count(group)) {
          fail("keys that were not tied share one tensor", group.back());
        }
      }
    }
  } catch (const std::exception& e) {
    entry.status = Status::kFailed;
    entry.reason = first_line(e.what());
  }
  entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return entry;
}

/// P4 on a tiny fixture in double: through every wrapper and through none.
Entry run_numerics(const std::string& kind, const Model& config,
                   const props::UnwrapSubject& subject) {
  Entry entry = new_entry(kind, "P4 backward", config.name);
  const auto start = Clock::now();
  entry.cases = 1;
  (void)detail::take_blame();
  const auto ref = Registry::global().resolve(kind);
  auto finish = [&] {
    entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return entry;
  };
  const auto numerics = ref.numerics();
  if (numerics == Numerics::kChangesOutput || numerics == Numerics::kNeedsRelease) {
    entry.status = Status::kSkipped;
    entry.reason = numerics == Numerics::kChangesOutput
                       ? "the kind changes outputs by design"
                       : "the kind needs release before its inner module computes (P14 runs it "
                         "released)";
    return finish();
  }
  const double tol = numerics == Numerics::kTolerance ? ref.kind->tolerance : 0.0;
  auto close = [tol](const torch::Tensor& a, const torch::Tensor& b) {
    return tol == 0.0 ? a.equal(b) : torch::allclose(a, b, tol, tol);
  };
  try {
    const auto ids = torch::tensor({{3, 1, 4, 1, 5, 9}}, torch::kLong);
    auto plain = config.build(c10::kCPU, c10::kDouble);
    auto expected = call(*plain, ids);
    expected.pow(2).mean().backward();
    auto model = config.build(c10::kCPU, c10::kDouble);
    const auto params = model->named_parameters();  // before wrapping: the clean keys
    auto wrapped = wrap_fixture(model, config, kind);
    auto wrappers = wrappers_in(wrapped);
    auto grads_match = [&](double tolerance) {
      const auto a = plain->named_parameters();
      for (const auto& item : a) {
        const auto& g = params[item.key()].grad();
        if (!g.defined() ||
            !(tolerance == 0.0 ? g.equal(item.value().grad())
                               : torch::allclose(g, item.value().grad(), tolerance, tolerance))) {
          entry.key = item.key();
          return false;
        }
      }
      return true;
    };
    auto out = call(*wrapped, ids);
    out.pow(2).mean().backward();
    for (const auto& w : wrappers) {
      if (w->calls() == 0) {
        entry.status = Status::kFailed;
        entry.reason = "the wrapped run skipped a wrapper";
        return finish();
      }
    }
    if (!close(out, expected) || !grads_match(tol)) {
      entry.status = Status::kFailed;
      entry.reason = "the wrapped run's output or gradients differ from the model's";
      return finish();
    }
    for (const auto& item : params) item.value().mutable_grad() = torch::Tensor();
    const auto u = subject(wrapped);
    for (const auto& w : wrappers) w->reset_calls();
    auto run = call(*u.root, ids);
    run.pow(2).mean().backward();
    for (const auto& w : wrappers) {
      if (w->calls() != 0) {
        entry.status = Status::kFailed;
        entry.reason = "the unwrapped run went through a " + w->kind_name();
        return finish();
      }
    }
    if (!run.equal(expected) || !grads_match(0.0)) {
      entry.status = Status::kFailed;
      entry.reason = "the unwrapped model's output or gradients differ from the model's";
    }
  } catch (const std::exception& e) {
    entry.status = Status::kFailed;
    entry.reason = first_line(e.what());
  }
  return finish();
}

nlohmann::json to_json_value(const Entry& e) {
  return {{"kind", e.kind},
          {"property", e.property},
          {"target", e.target},
          {"status", static_cast<int>(e.status)},
          {"reason", e.reason},
          {"key", e.key},
          {"counterexample", e.counterexample},
          {"cases", e.cases},
          {"seconds", e.seconds}};
}

Entry from_json_value(const nlohmann::json& j) {
  Entry e;
  e.kind = j.at("kind").get<std::string>();
  e.property = j.at("property").get<std::string>();
  e.target = j.at("target").get<std::string>();
  e.status = static_cast<Status>(j.at("status").get<int>());
  e.reason = j.at("reason").get<std::string>();
  e.key = j.at("key").get<std::string>();
  e.counterexample = j.at("counterexample").get<std::string>();
  e.cases = j.at("cases").get<int>();
  e.seconds = j.at("seconds").get<double>();
  return e;
}

void write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

/// Runs `check` in a child process with a time limit; its entry comes back through a pipe. A
/// child that dies by a signal, exits without a verdict or outlives the limit is a failed entry
/// saying so.
Entry run_isolated(const Entry& blank, const Options& options,
                   const std::function<Entry()>& check) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(ErrorCode::kInvalidArgument, "",
                std::string("cannot isolate a check: ") + std::strerror(errno));
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw Error(ErrorCode::kInvalidArgument, "",
                std::string("cannot isolate a check: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    // Only this thread survives the fork: a thread pool the parent had running (OpenMP's, after
    // any multi-threaded LibTorch op) would wait for workers that are not there.
    at::set_num_threads(1);
    Entry entry = blank;
    try {
      entry = check();
    } catch (const std::exception& e) {
      entry.status = Status::kFailed;
      entry.reason = first_line(e.what());
    } catch (...) {
      entry.status = Status::kFailed;
      entry.reason = "threw something that is not an exception";
    }
    write_all(fds[1], to_json_value(entry).dump());
    ::_exit(0);  // no exit handlers: they belong to the parent
  }
  ::close(fds[1]);
  std::string data;
  bool timed_out = false;
  const auto deadline = start + std::chrono::seconds(options.timeout_seconds);
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd in{fds[0], POLLIN, 0};
    const int ready = ::poll(&in, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buffer[65536];
    const auto n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  Entry entry = blank;
  entry.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  entry.status = Status::kFailed;
  if (timed_out) {
    entry.reason =
        "did not finish within " + std::to_string(options.timeout_seconds) + " s: stopped as hung";
  } else if (WIFSIGNALED(status)) {
    entry.reason = std::string("crashed: signal ") + std::to_string(WTERMSIG(status)) + " (" +
                   ::strsignal(WTERMSIG(status)) + ")";
  } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
    entry.reason =
        "exited with status " + std::to_string(WEXITSTATUS(status)) + " before giving a verdict";
  } else {
    try {
      return from_json_value(nlohmann::json::parse(data));
    } catch (const nlohmann::json::exception&) {
      entry.reason = "ended without a verdict";
    }
  }
  return entry;
}

/// The command line that runs the check of `entry` again.
std::string replay_command(const Entry& entry, const Options& options) {
  if (options.custom_subject) {
    return "certify::run() with seed " + std::to_string(options.seed) + ", " +
           std::to_string(options.cases) + " cases, max size " + std::to_string(options.max_size) +
           " and the subject '" + options.custom_subject_name + "', for " + entry.kind + " on " +
           entry.target;
  }
  // `Kind[mode]` is a glob to a shell: quoted.
  const bool plain =
      entry.kind.find_first_not_of(
          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") == std::string::npos;
  std::string out = "wrapcert certify --wrappers " + (plain ? entry.kind : "'" + entry.kind + "'") +
                    " --subject " + subject_name(options) + " --seed " +
                    std::to_string(options.seed);
  if (entry.target == kDeepChain) {
    out += " --cases 1 --fixtures tiny-gemma";  // every run checks the chain; this one is short
  } else if (entry.target == kGenerated) {
    out += " --cases " + std::to_string(options.cases) + " --max-size " +
           std::to_string(options.max_size);
  } else {
    out += " --fixtures " + entry.target;
  }
  return out;
}

}  // namespace

std::string subject_name(const Options& options) {
  return options.custom_subject ? options.custom_subject_name
                                : std::string(to_string(options.subject));
}

const char* to_string(Status status) {
  switch (status) {
    case Status::kPassed:
      return "passed";
    case Status::kFailed:
      return "failed";
    case Status::kSkipped:
      return "skipped";
  }
  return "unknown";
}

bool Report::passed() const {
  return count(Status::kFailed) == 0;
}

size_t Report::count(Status status) const {
  size_t n = 0;
  for (const auto& e : entries) n += e.status == status;
  return n;
}

Report run(const Options& options, const Listener& listener) {
  Report report;
  report.options = options;
  if (report.options.kinds.empty()) report.options.kinds = Registry::global().names_with_modes();
  for (const auto& kind : report.options.kinds) (void)Registry::global().resolve(kind);  // validate
  if (options.cases < 1 || options.max_size < 1 || options.timeout_seconds < 1) {
    throw Error(ErrorCode::kInvalidArgument, "",
                "cases, max_size and timeout_seconds must be positive");
  }
  for (const auto& model : options.models) {
    if (model.name.empty() || !model.build) {
      throw Error(ErrorCode::kInvalidArgument, model.name,
                  "a model to certify on needs a name and a build function");
    }
  }
  if (report.options.seed == 0) report.options.seed = std::random_device{}() | 1ULL;

  const auto subject =
      options.custom_subject ? options.custom_subject : props::subject(options.subject);
  const auto translator =
      options.custom_translator ? options.custom_translator : props::reference_translator();
  const auto& o = report.options;
  // rapidcheck reads RC_PARAMS (and says so) once per process: here, not in every child.
  (void)rc::detail::configuration();
  auto run = [&](const Entry& blank, const std::function<Entry()>& check) {
    if (listener) listener(blank, false);
    Entry entry = o.isolate ? run_isolated(blank, o, check) : check();
    if (entry.status == Status::kFailed) entry.replay = replay_command(entry, o);
    if (listener) listener(entry, true);
    report.entries.push_back(std::move(entry));
  };
  for (const auto& kind : o.kinds) {
    for (const auto& property : props::generated_properties()) {
      run(new_entry(kind, property.name, kGenerated),
          [&] { return run_generated(kind, property, subject, translator, o); });
    }
    run(new_entry(kind, "P11 graph safety", kDeepChain),
        [&] { return run_deep_chain(kind, subject); });
    for (const auto& config : o.models) {
      if (config.numerics) {
        run(new_entry(kind, "P4 backward", config.name),
            [&] { return run_numerics(kind, config, subject); });
        continue;
      }
      for (const std::string property : kLayoutProperties) {
        run(new_entry(kind, property, config.name),
            [&] { return run_layout(kind, config, subject, property); });
      }
    }
  }
  // What could not run here, and why: it shows in every report.
  const auto hw = hardware::detect();
  if (hw.cuda_devices == 0) {
    auto entry = new_entry("hardware", "P1-P5, P13 on CUDA", "cuda");
    entry.status = Status::kSkipped;
    entry.reason = hw.cuda_reason;
    report.entries.push_back(entry);
  }
  if (!hw.tpu) {
    auto entry = new_entry("hardware", "real SpmdFullyShardedDataParallel (torch_xla)", "tpu");
    entry.status = Status::kSkipped;
    entry.reason = hw.tpu_reason;
    report.entries.push_back(entry);
  }
  return report;
}

Report run(const WrapperKind& registration, Options options, const Listener& listener) {
  const ScopedRegistration scope(registration);
  options.kinds = {registration.name};
  return run(options, listener);
}

}  // namespace wrapcert::certify
