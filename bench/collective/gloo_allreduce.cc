// Gloo's side of bench/allreduce.py: Debian's libgloo, TCP device on each
// rank's address, ranks meeting through gloo::rendezvous::FileStore.
//
// --variant picks Gloo's algorithm:
//   allreduce     gloo::allreduce with AllreduceOptions::Algorithm::RING (the
//                 default; what torch.distributed's gloo backend calls): ring
//                 reduce-scatter + allgather in segments
//   ring_chunked  the older gloo::AllreduceRingChunked algorithm object
//   ring          gloo::AllreduceRing: passes the whole buffer N-1 times
//                 round the ring (2(N-1)/N moves less per rank; for reference)
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <filesystem>
#include <map>
#include <tuple>

#include "harness.h"

namespace {

constexpr std::chrono::milliseconds kTimeout{120000};

class GlooContender : public bench::Contender {
 public:
  static std::unique_ptr<GlooContender> Connect(const bench::RankEnv& env, std::string* error) {
    try {
      auto c = std::unique_ptr<GlooContender>(new GlooContender(env.variant.empty() ? "allreduce" : env.variant));
      if (c->variant_ != "allreduce" && c->variant_ != "ring_chunked" && c->variant_ != "ring") {
        *error = "unknown --variant " + c->variant_;
        return nullptr;
      }
      gloo::transport::tcp::attr attr;
      attr.hostname = env.host;
      c->device_ = gloo::transport::tcp::CreateDevice(attr);
      std::string dir = env.tmpdir + "/gloo-store";
      std::filesystem::create_directories(dir);
      gloo::rendezvous::FileStore store(dir);
      gloo::rendezvous::PrefixStore prefix("bench", store);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(env.rank, env.size);
      ctx->setTimeout(kTimeout);
      ctx->connectFullMesh(prefix, c->device_);
      c->ctx_ = ctx;
      return c;
    } catch (const std::exception& e) {
      *error = std::string("gloo: ") + e.what();
      return nullptr;
    }
  }

  // float32 only: bench/allreduce.py runs Debian's Gloo for --dtype float32
  // and leaves the 16-bit comparison to torch's gloo.
  std::string Allreduce(void* raw, size_t count, bench::Dtype dtype, bool max) override {
    if (dtype != bench::Dtype::kFloat32) return "gloo harness: float32 only";
    float* data = static_cast<float*>(raw);
    try {
      if (variant_ == "allreduce") {
        gloo::AllreduceOptions opts(ctx_);
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        opts.setOutput(data, count);
        using Fn = void (*)(void*, const void*, const void*, size_t);
        opts.setReduceFunction(max ? static_cast<Fn>(&gloo::max<float>) : static_cast<Fn>(&gloo::sum<float>));
        opts.setTag(tag_++);
        opts.setTimeout(kTimeout);
        gloo::allreduce(opts);
        return "";
      }
      // The algorithm objects bind their buffers when built: one per buffer.
      auto key = std::make_tuple(data, count, max);
      auto it = algos_.find(key);
      if (it == algos_.end()) {
        if (!max) std::erase_if(algos_, [](const auto& kv) { return !std::get<2>(kv.first); });  // a new size
        const auto* fn = max ? gloo::ReductionFunction<float>::max : gloo::ReductionFunction<float>::sum;
        std::unique_ptr<gloo::Algorithm> a;
        if (variant_ == "ring") a.reset(new gloo::AllreduceRing<float>(ctx_, {data}, static_cast<int>(count), fn));
        else a.reset(new gloo::AllreduceRingChunked<float>(ctx_, {data}, static_cast<int>(count), fn));
        it = algos_.emplace(key, std::move(a)).first;
      }
      it->second->run();
      return "";
    } catch (const std::exception& e) {
      return std::string("gloo: ") + e.what();
    }
  }

 private:
  explicit GlooContender(std::string variant) : variant_(std::move(variant)) {}

  std::string variant_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t tag_ = 0;
  std::map<std::tuple<float*, size_t, bool>, std::unique_ptr<gloo::Algorithm>> algos_;
};

}  // namespace

int main(int argc, char** argv) {
  return bench::HarnessMain(argc, argv, "gloo_allreduce",
                            [](const bench::RankEnv& env, std::string* error) -> std::unique_ptr<bench::Contender> {
                              return GlooContender::Connect(env, error);
                            });
}
