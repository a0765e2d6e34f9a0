#include <wrapcert/error.h>
#include <wrapcert/process_group.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/stat.h>
#include <unistd.h>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace wrapcert {
namespace {

/// `name`'s value as a number, nullopt when unset; throws naming the variable otherwise.
std::optional<int> env_int(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  try {
    size_t used = 0;
    const int n = std::stoi(value, &used);
    if (used == std::char_traits<char>::length(value)) return n;
  } catch (const std::exception&) {
  }
  throw Error(ErrorCode::kInvalidArgument, name,
              std::string("is '") + value + "', not a whole number");
}

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

}  // namespace

std::optional<Rendezvous> Rendezvous::from_env() {
  Rendezvous r;
  auto rank = env_int("RANK");
  auto world = env_int("WORLD_SIZE");
  auto local = env_int("LOCAL_RANK");
  if (!rank && !world) {  // not torchrun: Slurm's names
    rank = env_int("SLURM_PROCID");
    world = env_int("SLURM_NTASKS");
    local = env_int("SLURM_LOCALID");
  }
  if (!rank && !world) return std::nullopt;
  if (!rank || !world) {
    throw Error(ErrorCode::kInvalidArgument, rank ? "WORLD_SIZE" : "RANK",
                "is not set, though " + std::string(rank ? "RANK" : "WORLD_SIZE") + " is");
  }
  r.rank = *rank;
  r.world_size = *world;
  r.local_rank = local.value_or(*rank);
  if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) r.master_addr = addr;
  if (const auto port = env_int("MASTER_PORT")) r.master_port = *port;
  if (const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
      agent && std::string(agent) == "True") {
    r.store_served = true;
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    r.store_prefix = std::string("/worker/attempt_") + (attempt && *attempt ? attempt : "0");
  }
  if (const char* served = std::getenv("WRAPCERT_STORE_SERVED");
      served && std::string(served) == "1") {
    r.store_served = true;
  }
  r.validate();
  return r;
}

void Rendezvous::validate() const {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(
        ErrorCode::kInvalidArgument, "rank",
        "rank " + std::to_string(rank) + " is outside a world of " + std::to_string(world_size));
  }
  if (master_port < 1 || master_port > 65535) {
    throw Error(ErrorCode::kInvalidArgument, "master_port",
                "port " + std::to_string(master_port) + " is outside 1-65535");
  }
}

struct StoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreServer::StoreServer(int port) : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(10);
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  } catch (const std::exception& e) {
    throw Error(
        ErrorCode::kInvalidArgument, "master_port",
        "cannot serve the store on port " + std::to_string(port) + ": " + first_line(e.what()));
  }
}

StoreServer::~StoreServer() = default;

int StoreServer::port() const {
  return impl_->store->getPort();
}

std::optional<std::string> StoreServer::get(const std::string& key) const {
  if (!impl_->store->check({key})) return std::nullopt;
  const auto bytes = impl_->store->get(key);
  return std::string(bytes.begin(), bytes.end());
}

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  std::string owned_store_file;  // removed on destruction when this process created it
  bool tcp = false;              // the store is a TCPStore a launcher may read
  std::atomic<std::int64_t> collectives{0};
  std::mutex mark_mutex;
  std::string where;  // the last `mark`
  // Where each collective entered is written, a line each, before it is entered: a file the
  // launcher made for this rank (`WRAPCERT_COLLECTIVES_FD`), read when the run ends to name the
  // rank whose collectives differ from the others'. -1: none.
  int sequence_fd = -1;
  // Publishes "<collectives> <where>" to the store when it changes, every 100 ms: off the
  // collectives' path (a store round trip per collective would double their cost).
  std::thread reporter;
  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  bool stop = false;

  void report(int rank) {
    std::string last;
    std::unique_lock<std::mutex> lock(stop_mutex);
    while (!stop_cv.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop; })) {
      std::string text;
      {
        const std::lock_guard<std::mutex> where_lock(mark_mutex);
        text = std::to_string(collectives.load()) + " " + where;
      }
      if (text == last) continue;
      try {
        store->set("wrapcert/progress/" + std::to_string(rank),
                   std::vector<uint8_t>(text.begin(), text.end()));
        last = text;
      } catch (const std::exception&) {
        return;  // the store is gone: nobody is watching any more
      }
    }
  }
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  if (impl_->tcp)
    impl_->reporter = std::thread([impl = impl_.get(), r = rank()] { impl->report(r); });
}

ProcessGroup::~ProcessGroup() {
  if (impl_->reporter.joinable()) {
    {
      const std::lock_guard<std::mutex> lock(impl_->stop_mutex);
      impl_->stop = true;
    }
    impl_->stop_cv.notify_all();
    impl_->reporter.join();
  }
  const auto file = impl_->owned_store_file;
  impl_.reset();
  if (!file.empty()) std::remove(file.c_str());
}

std::shared_ptr<ProcessGroup> ProcessGroup::gloo(const std::string& store_path, int rank,
                                                 int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw Error(
        ErrorCode::kInvalidArgument, "",
        "rank " + std::to_string(rank) + " is outside a world of " + std::to_string(world_size));
  }
  auto impl = std::make_unique<Impl>();
  impl->store = c10::make_intrusive<c10d::FileStore>(store_path, world_size);
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, rank, world_size, options);
  return std::make_shared<ProcessGroup>(std::move(impl));
}

std::shared_ptr<ProcessGroup> ProcessGroup::single_process() {
  // One group per process. A forked child (certification runs each check in one) inherits the
  // parent's group without the threads that serve it, so an all-reduce there would wait
  // forever: the child makes its own, and leaves the parent's alone (destroying it would wait
  // for those threads too).
  static std::mutex mutex;
  static pid_t owner = 0;
  static std::shared_ptr<ProcessGroup> group;
  const std::lock_guard<std::mutex> lock(mutex);
  if (owner != ::getpid()) {
    if (group) new std::shared_ptr<ProcessGroup>(std::move(group));  // the parent's: never freed
    const auto path =
        std::filesystem::temp_directory_path() / ("wrapcert-store-" + std::to_string(::getpid()));
    std::filesystem::remove(path);  // a stale file from an earlier process with this pid
    group = gloo(path.string(), 0, 1);
    // One rank has nothing more to agree on: the store's file is not needed after joining, and
    // a child that ends with _exit would leave it behind.
    std::filesystem::remove(path);
    owner = ::getpid();
  }
  return group;
}

std::shared_ptr<ProcessGroup> ProcessGroup::join(const Rendezvous& rendezvous) {
  rendezvous.validate();
  const std::string where = rendezvous.master_addr + ":" + std::to_string(rendezvous.master_port);
  auto impl = std::make_unique<Impl>();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(rendezvous.master_port);
  store_options.isServer = rendezvous.rank == 0 && !rendezvous.store_served;
  store_options.numWorkers = rendezvous.world_size;
  store_options.waitWorkers = false;  // ProcessGroupGloo waits for every rank itself
  store_options.timeout = rendezvous.timeout;
  store_options.multiTenant = true;  // as init_process_group's env:// store
  try {
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(rendezvous.master_addr, store_options);
    if (!rendezvous.store_prefix.empty()) {
      store = c10::make_intrusive<c10d::PrefixStore>(rendezvous.store_prefix, store);
    }
    impl->store = store;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, "master_addr",
                std::string(store_options.isServer ? "rank 0 cannot serve the store at "
                                                   : "cannot reach the store at ") +
                    where + " within " + std::to_string(rendezvous.timeout.count() / 1000) +
                    " s: " + first_line(e.what()));
  }
  impl->tcp = true;
  // The launcher's file for this rank's collectives, if it gave one: a regular file, appended to.
  if (const char* fd = std::getenv("WRAPCERT_COLLECTIVES_FD"); fd && *fd) {
    const int n = std::atoi(fd);
    struct stat st {};
    if (n > 2 && ::fstat(n, &st) == 0 && S_ISREG(st.st_mode)) impl->sequence_fd = n;
  }
  // Every rank states the world size it was given and compares it with rank 0's: a rank that
  // disagrees stops naming both values rather than waiting for ranks that will never come.
  const auto world = std::to_string(rendezvous.world_size);
  impl->store->set("wrapcert/world/" + std::to_string(rendezvous.rank),
                   std::vector<uint8_t>(world.begin(), world.end()));
  try {
    const auto bytes = impl->store->get("wrapcert/world/0");
    const std::string first(bytes.begin(), bytes.end());
    if (first != world) {
      throw Error(ErrorCode::kInvalidArgument, "world_size",
                  "rank " + std::to_string(rendezvous.rank) + " was started with world size " +
                      world + ", rank 0 with " + first);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, "rank",
                "rank 0 did not join at " + where + " within " +
                    std::to_string(rendezvous.timeout.count() / 1000) +
                    " s: " + first_line(e.what()));
  }
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(rendezvous.timeout);
    const bool local =
        rendezvous.master_addr == "127.0.0.1" || rendezvous.master_addr == "localhost";
    options->devices.push_back(local ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                     : c10d::ProcessGroupGloo::createDefaultDevice());
    impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, rendezvous.rank,
                                                              rendezvous.world_size, options);
  } catch (const std::exception& e) {
    throw Error(
        ErrorCode::kInvalidArgument, "world_size",
        "rank " + std::to_string(rendezvous.rank) + " of " + std::to_string(rendezvous.world_size) +
            " could not join the others at " + where + " within " +
            std::to_string(rendezvous.timeout.count() / 1000) +
            " s (a rank missing, or started with another world size): " + first_line(e.what()));
  }
  return std::make_shared<ProcessGroup>(std::move(impl));
}

namespace {
std::mutex& default_mutex() {
  static std::mutex m;
  return m;
}
std::shared_ptr<ProcessGroup>& default_group() {
  static auto* g = new std::shared_ptr<ProcessGroup>;  // never destroyed: Gloo's threads
  return *g;
}
}  // namespace

void ProcessGroup::set_default(std::shared_ptr<ProcessGroup> group) {
  const std::lock_guard<std::mutex> lock(default_mutex());
  default_group() = std::move(group);
}

std::shared_ptr<ProcessGroup> ProcessGroup::current() {
  {
    const std::lock_guard<std::mutex> lock(default_mutex());
    if (default_group()) return default_group();
  }
  return single_process();
}

std::vector<torch::Tensor> ProcessGroup::all_gather(const torch::Tensor& tensor) {
  entered_collective("all_gather", tensor);
  const bool narrow = tensor.scalar_type() == torch::kBFloat16;  // no bfloat16 in Gloo 1.13
  auto input = (narrow ? tensor.to(torch::kFloat) : tensor).contiguous();
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < size(); ++r) out[0].push_back(torch::empty_like(input));
  std::vector<torch::Tensor> in{input};
  impl_->group->allgather(out, in)->wait();
  if (narrow) {
    for (auto& t : out[0]) t = t.to(torch::kBFloat16);
  }
  return out[0];
}

torch::Tensor ProcessGroup::reduce_scatter_sum(const torch::Tensor& tensor) {
  if (tensor.dim() == 0 || tensor.size(0) % size() != 0) {
    throw Error(ErrorCode::kInvalidArgument, "",
                "reduce-scatter needs a first dimension that is a multiple of the world size");
  }
  auto sum = tensor.clone();
  all_reduce_sum(sum);
  const auto rows = tensor.size(0) / size();
  return sum.narrow(0, rows * rank(), rows).clone();
}

std::vector<std::string> ProcessGroup::all_gather_text(const std::string& text) {
  auto length = torch::tensor({static_cast<int64_t>(text.size())}, torch::kLong);
  auto lengths = all_gather(length);
  int64_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, l.item<int64_t>());
  auto bytes = torch::zeros({std::max<int64_t>(longest, 1)}, torch::kUInt8);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  const auto all = all_gather(bytes);
  std::vector<std::string> out;
  for (size_t r = 0; r < all.size(); ++r) {
    const auto* data = static_cast<const char*>(all[r].data_ptr());
    out.emplace_back(data, static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  return out;
}

std::int64_t ProcessGroup::all_reduce_max(std::int64_t value) {
  std::vector<torch::Tensor> tensors{torch::tensor({value}, torch::kLong)};
  entered_collective("all_reduce_max", tensors[0]);
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  impl_->group->allreduce(tensors, options)->wait();
  return tensors[0].item<int64_t>();
}

std::int64_t ProcessGroup::collectives() const {
  return impl_->collectives;
}

void ProcessGroup::mark(const std::string& what) {
  const std::lock_guard<std::mutex> lock(impl_->mark_mutex);
  impl_->where = what;
}

void ProcessGroup::entered_collective(const char* op, const torch::Tensor& tensor) {
  ++impl_->collectives;
  if (impl_->sequence_fd < 0) return;
  // "<op>(<elements> <dtype>)\t<where>\n", one write: a line is never split by a crash.
  std::string line = std::string(op) + "(" + std::to_string(tensor.numel()) + " " +
                     c10::toString(tensor.scalar_type()) + ")\t";
  {
    const std::lock_guard<std::mutex> lock(impl_->mark_mutex);
    line += impl_->where;
  }
  line += "\n";
  if (::write(impl_->sequence_fd, line.data(), line.size()) < 0) impl_->sequence_fd = -1;
}

void ProcessGroup::publish(const std::string& key, const std::string& value) {
  if (!impl_->tcp) return;
  impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

int ProcessGroup::rank() const {
  return impl_->group->getRank();
}
int ProcessGroup::size() const {
  return impl_->group->getSize();
}

void ProcessGroup::all_reduce_sum(torch::Tensor& tensor) {
  entered_collective("all_reduce_sum", tensor);
  if (tensor.scalar_type() == torch::kBFloat16) {
    // Gloo in LibTorch 1.13 reduces no bfloat16: summed in float32 and rounded once (one rank's
    // gradient comes back bit for bit).
    std::vector<torch::Tensor> wide{tensor.to(torch::kFloat)};
    impl_->group->allreduce(wide)->wait();
    tensor.copy_(wide[0]);
    return;
  }
  std::vector<torch::Tensor> tensors{tensor};
  impl_->group->allreduce(tensors)->wait();
}

}  // namespace wrapcert
