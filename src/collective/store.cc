// The two Stores: in memory (tests) and the coordinator's key/value store.
#include <map>

#include "ember/deadline.h"
#include "common/mutex.h"
#include "ember/collective.h"
#include "ember/coordinator.h"

namespace ember::collective {
namespace {

class InMemoryStore : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    MutexLock lock(&mu_);
    values_[key] = value;
    cv_.SignalAll();
    return Status::OK();
  }

  Result<std::string> Get(const std::string& key, Duration timeout) override {
    const Deadline deadline = Deadline::After(timeout);
    MutexLock lock(&mu_);
    while (true) {
      auto it = values_.find(key);
      if (it != values_.end()) return it->second;
      if (deadline.expired()) {
        return Status::DeadlineExceeded("store key '" + key + "' was not set within " + FormatDuration(timeout));
      }
      cv_.WaitUntil(&mu_, deadline.when());
    }
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::map<std::string, std::string> values_ GUARDED_BY(mu_);
};

class CoordinatorStore : public Store {
 public:
  explicit CoordinatorStore(std::shared_ptr<CoordinatorClient> client) : client_(std::move(client)) {}
  Status Set(const std::string& key, const std::string& value) override { return client_->KvSet(key, value); }
  Result<std::string> Get(const std::string& key, Duration timeout) override { return client_->KvGet(key, timeout); }

 private:
  std::shared_ptr<CoordinatorClient> client_;
};

}  // namespace

std::shared_ptr<Store> NewInMemoryStore() { return std::make_shared<InMemoryStore>(); }

std::shared_ptr<Store> NewCoordinatorStore(std::shared_ptr<CoordinatorClient> client) {
  return std::make_shared<CoordinatorStore>(std::move(client));
}

}  // namespace ember::collective
