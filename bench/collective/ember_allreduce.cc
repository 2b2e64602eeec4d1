// Ember's side of bench/allreduce.py: ember::collective::Communicator over
// the public header only, Transport::kAuto (shared memory between the ranks
// of this host) or, with --tcp, Transport::kTcp (its TCP ring).
//
// The ranks meet through SharedStore: a key/value table in an anonymous
// shared mapping the harness makes before forking, guarded by a
// process-shared mutex; Get blocks on a process-shared condition variable
// with a deadline.
#include <pthread.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "ember/collective.h"
#include "harness.h"

namespace {

namespace ec = ember::collective;

class SharedStore : public ec::Store {
 public:
  // Before fork: the children inherit the mapping.  nullptr if mmap fails.
  static std::shared_ptr<SharedStore> Create() {
    void* p = ::mmap(nullptr, sizeof(Table), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    auto* t = new (p) Table;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&t->mu, &ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    return std::shared_ptr<SharedStore>(new SharedStore(t));
  }
  ~SharedStore() override { ::munmap(t_, sizeof(Table)); }

  ember::Status Set(const std::string& key, const std::string& value) override {
    if (key.size() >= kKey || value.size() > kValue) {
      return ember::Status::InvalidArgument("bench store: key or value too long: " + key);
    }
    pthread_mutex_lock(&t_->mu);
    ember::Status st;
    if (Find(key) >= 0) {
      st = ember::Status::AlreadyExists("bench store: key set twice: " + key);
    } else if (t_->n == kEntries) {
      st = ember::Status::Internal("bench store: full");
    } else {
      Entry& e = t_->e[t_->n++];
      std::memcpy(e.key, key.c_str(), key.size() + 1);
      std::memcpy(e.value, value.data(), value.size());
      e.len = value.size();
      pthread_cond_broadcast(&t_->cv);
    }
    pthread_mutex_unlock(&t_->mu);
    return st;
  }

  ember::Result<std::string> Get(const std::string& key, ember::Duration timeout) override {
    timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    long long ns = deadline.tv_nsec + static_cast<long long>(timeout.count()) * 1000000;
    deadline.tv_sec += ns / 1000000000;
    deadline.tv_nsec = ns % 1000000000;
    pthread_mutex_lock(&t_->mu);
    int i;
    int rc = 0;
    while ((i = Find(key)) < 0 && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&t_->cv, &t_->mu, &deadline);
    std::string value = i >= 0 ? std::string(t_->e[i].value, t_->e[i].len) : "";
    pthread_mutex_unlock(&t_->mu);
    if (i < 0) return ember::Status::DeadlineExceeded("bench store: no key " + key);
    return value;
  }

 private:
  static constexpr int kEntries = 512;
  static constexpr size_t kKey = 256, kValue = 8192;
  struct Entry {
    char key[kKey];
    size_t len;
    char value[kValue];
  };
  struct Table {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n = 0;
    Entry e[kEntries];
  };

  explicit SharedStore(Table* t) : t_(t) {}
  int Find(const std::string& key) const {
    for (int i = 0; i < t_->n; ++i) {
      if (key == t_->e[i].key) return i;
    }
    return -1;
  }

  Table* t_;
};

class EmberContender : public bench::Contender {
 public:
  explicit EmberContender(std::unique_ptr<ec::Communicator> comm) : comm_(std::move(comm)) {}
  std::string Allreduce(void* data, size_t count, bench::Dtype dtype, bool max) override {
    const ec::DataType t = dtype == bench::Dtype::kBFloat16  ? ec::DataType::kBFloat16
                           : dtype == bench::Dtype::kFloat16 ? ec::DataType::kFloat16
                                                              : ec::DataType::kFloat32;
    ember::Status st = comm_->Allreduce(data, count, t, max ? ec::ReduceOp::kMax : ec::ReduceOp::kSum);
    return st.ok() ? "" : "ember: " + st.ToString();
  }

 private:
  std::unique_ptr<ec::Communicator> comm_;
};

}  // namespace

int main(int argc, char** argv) {
  // Made before HarnessMain forks the ranks: every rank inherits the mapping.
  std::shared_ptr<SharedStore> store = SharedStore::Create();
  if (!store) {
    std::perror("ember_allreduce: mmap");
    return 1;
  }
  auto make = [store](const bench::RankEnv& env, std::string* error) -> std::unique_ptr<bench::Contender> {
    ec::CommunicatorOptions o;
    o.rank = env.rank;
    o.size = env.size;
    o.host = env.host;
    o.name = "bench:" + std::to_string(env.rank);
    o.secret = "ember-allreduce-bench-secret";
    o.prefix = "ember-bench-" + env.run_id;
    o.transport = env.tcp ? ec::Transport::kTcp : ec::Transport::kAuto;
    o.shm_threads = env.threads;
    o.timeout = std::chrono::milliseconds(120000);
    auto comm = ec::Communicator::Create(o, store);
    if (!comm.ok()) {
      *error = "ember: " + comm.status().ToString();
      return nullptr;
    }
    return std::make_unique<EmberContender>(comm.MoveValueUnsafe());
  };
  return bench::HarnessMain(argc, argv, "ember_allreduce", make);
}
