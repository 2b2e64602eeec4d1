// See harness.h for the protocol.
#include "harness.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

namespace bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) out += ' ';
    else out += c;
  }
  return out + "\"";
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

// One line from `f` without its newline; false at EOF.
bool ReadLine(FILE* f, std::string* line) {
  line->clear();
  int c;
  while ((c = std::fgetc(f)) != EOF && c != '\n') line->push_back(static_cast<char>(c));
  return c != EOF || !line->empty();
}

// False when the reader is gone.
bool WriteLine(int fd, const std::string& s) {
  std::string line = s + "\n";
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(fd, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// ---------------------------------------------------------------- one rank
size_t SizeOf(Dtype t) { return t == Dtype::kFloat32 ? 4 : 2; }

// The harness's values are small integers (at most 25 * size(size+1)/2), exact
// in every dtype up to 4 ranks (bfloat16: 256, float16: 2048).
uint16_t ToHalfBits(Dtype t, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (t == Dtype::kBFloat16) return static_cast<uint16_t>(bits >> 16);  // exact: the low bits are zero
  if (v == 0.0f) return 0;
  const int exp = static_cast<int>((bits >> 23) & 0xff) - 127;  // a normal float16 for these values
  return static_cast<uint16_t>(((exp + 15) << 10) | ((bits >> 13) & 0x3ff));
}

float FromHalfBits(Dtype t, uint16_t h) {
  uint32_t bits;
  if (t == Dtype::kBFloat16) {
    bits = static_cast<uint32_t>(h) << 16;
  } else {
    const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    bits = (static_cast<uint32_t>(h & 0x8000) << 16) |
           (exp == 0 && mant == 0 ? 0 : ((exp + 112) << 23) | (mant << 13));  // zero or normal only
  }
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

class RankBench {
 public:
  RankBench(const RankEnv& env, Contender* c) : env_(env), c_(c) {}

  // "ok <median_s> <iters>" or "err <message>"
  std::string Run(size_t bytes, int warmup, int min_iters, double min_secs) {
    const size_t es = SizeOf(env_.dtype);
    size_t count = std::max<size_t>(1, bytes / es);
    if (count != base_.size()) {
      data_.assign(count * es, 0);
      base_.resize(count);
      for (size_t i = 0; i < count; ++i) base_[i] = static_cast<float>(1 + i % 13);
    }
    std::vector<double> warm;
    for (int k = 0; k < std::max(1, warmup); ++k) {
      double t;
      if (std::string e = Once(k, &t); !e.empty()) return "err " + e;
      warm.push_back(t);
    }
    // Agree on the iteration count: every rank must make the same calls.
    float slowest = static_cast<float>(Median(warm));
    if (std::string e = c_->Allreduce(&slowest, 1, Dtype::kFloat32, /*max=*/true); !e.empty()) return "err " + e;
    long iters = std::max<long>(min_iters, std::lround(std::ceil(min_secs / std::max(slowest, 1e-9f))));
    iters = std::min<long>(iters, 200000);
    std::vector<double> times;
    times.reserve(iters);
    for (long k = 0; k < iters; ++k) {
      double t;
      if (std::string e = Once(warmup + k, &t); !e.empty()) return "err " + e;
      times.push_back(t);
    }
    char buf[96];
    std::snprintf(buf, sizeof buf, "ok %.9g %ld", Median(times), iters);
    return buf;
  }

 private:
  // Fills, times one allreduce, checks every element.
  std::string Once(long k, double* secs) {
    const float r1 = static_cast<float>(env_.rank + 1);
    const float s = static_cast<float>(env_.size * (env_.size + 1) / 2);
    const float c = static_cast<float>(k % 13);
    const size_t n = base_.size();
    const Dtype t = env_.dtype;
    const float* b = base_.data();
    if (t == Dtype::kFloat32) {
      float* x = reinterpret_cast<float*>(data_.data());
      for (size_t i = 0; i < n; ++i) x[i] = r1 * (b[i] + c);
    } else {
      uint16_t* x = reinterpret_cast<uint16_t*>(data_.data());
      for (size_t i = 0; i < n; ++i) x[i] = ToHalfBits(t, r1 * (b[i] + c));
    }
    auto t0 = Clock::now();
    std::string err = c_->Allreduce(data_.data(), n, t, /*max=*/false);
    auto t1 = Clock::now();
    if (!err.empty()) return err;
    *secs = Seconds(t0, t1);
    for (size_t i = 0; i < n; ++i) {
      const float got = t == Dtype::kFloat32 ? reinterpret_cast<const float*>(data_.data())[i]
                                             : FromHalfBits(t, reinterpret_cast<const uint16_t*>(data_.data())[i]);
      const float want = s * (b[i] + c);
      if (got != want) {
        char buf[200];
        std::snprintf(buf, sizeof buf, "rank %d: wrong sum at element %zu of %zu, call %ld: got %g, want %g",
                      env_.rank, i, n, k, got, want);
        return buf;
      }
    }
    return "";
  }

  RankEnv env_;
  Contender* c_;
  std::vector<float> base_;
  std::vector<char> data_;  // what the contender reduces: base_'s values as env_.dtype
};

[[noreturn]] void RankMain(const RankEnv& env, const std::string& netns, int cmd_fd, int res_fd,
                           const ContenderFactory& factory) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (!netns.empty()) {
    std::string path = "/var/run/netns/" + netns;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
      WriteLine(res_fd, "err rank " + std::to_string(env.rank) + ": cannot enter " + path + ": " + std::strerror(errno));
      _exit(2);
    }
    ::close(fd);
  }
  std::string error;
  std::unique_ptr<Contender> c = factory(env, &error);
  if (!c) {
    WriteLine(res_fd, "err rank " + std::to_string(env.rank) + ": " + error);
    _exit(2);
  }
  WriteLine(res_fd, "ready");
  FILE* in = ::fdopen(cmd_fd, "r");
  RankBench bench(env, c.get());
  for (std::string line; ReadLine(in, &line);) {
    auto w = Split(line, ' ');
    if (w.empty()) continue;
    if (w[0] == "quit") break;
    if (w[0] == "run" && w.size() == 5) {
      if (!WriteLine(res_fd, bench.Run(std::stoull(w[1]), std::stoi(w[2]), std::stoi(w[3]), std::stod(w[4])))) break;
    } else {
      WriteLine(res_fd, "err rank " + std::to_string(env.rank) + ": bad command: " + line);
      break;
    }
  }
  c.reset();  // closes connections before the process goes
  std::fflush(nullptr);
  _exit(0);
}

double MemcpyGBps(size_t bytes, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 2);
  std::vector<double> t;
  for (int i = 0; i < std::max(1, reps); ++i) {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    auto t1 = Clock::now();
    t.push_back(Seconds(t0, t1));
    src[i % bytes] = static_cast<char>(dst[(i * 7919) % bytes] + 1);  // keep the copies live
  }
  return bytes / Median(t) / 1e9;
}

struct Child {
  pid_t pid;
  int cmd_fd;   // write end
  FILE* res;    // read end
};

void Fail(const std::string& msg) {
  std::printf("{\"error\": %s}\n", JsonString(msg).c_str());
  std::fflush(stdout);
}

}  // namespace

int HarnessMain(int argc, char** argv, const char* name, ContenderFactory factory) {
  int ranks = 2;
  std::vector<std::string> hosts, netns;
  RankEnv proto;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s: %s needs a value\n", name, a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--ranks") ranks = std::stoi(next());
    else if (a == "--hosts") hosts = Split(next(), ',');
    else if (a == "--netns") netns = Split(next(), ',');
    else if (a == "--tcp") proto.tcp = true;
    else if (a == "--variant") proto.variant = next();
    else if (a == "--threads") proto.threads = std::stoi(next());
    else if (a == "--dtype") {
      const std::string d = next();
      if (d == "float32") proto.dtype = Dtype::kFloat32;
      else if (d == "bfloat16") proto.dtype = Dtype::kBFloat16;
      else if (d == "float16") proto.dtype = Dtype::kFloat16;
      else { std::fprintf(stderr, "%s: --dtype float32|bfloat16|float16, not %s\n", name, d.c_str()); return 2; }
    } else {
      std::fprintf(stderr, "usage: %s [--ranks N] [--hosts a,b,..] [--netns ns0,ns1,..] [--tcp] [--variant V]\n"
                           "       [--dtype float32|bfloat16|float16] [--threads N]\n"
                           "then commands on stdin (see bench/collective/harness.h)\n", name);
      return 2;
    }
  }
  if (ranks < 1 || (!hosts.empty() && hosts.size() != static_cast<size_t>(ranks)) ||
      (!netns.empty() && netns.size() != static_cast<size_t>(ranks))) {
    std::fprintf(stderr, "%s: --hosts/--netns need one entry per rank\n", name);
    return 2;
  }
  char tmpl[] = "/tmp/ember-allreduce-bench-XXXXXX";
  if (!::mkdtemp(tmpl)) { Fail(std::string("mkdtemp: ") + std::strerror(errno)); return 1; }
  proto.tmpdir = tmpl;
  proto.run_id = std::to_string(::getpid());
  proto.size = ranks;
  std::fflush(nullptr);

  std::vector<Child> kids;
  for (int r = 0; r < ranks; ++r) {
    int cmd[2], res[2];
    if (::pipe2(cmd, O_CLOEXEC) != 0 || ::pipe2(res, O_CLOEXEC) != 0) { Fail("pipe failed"); return 1; }
    pid_t pid = ::fork();
    if (pid < 0) { Fail("fork failed"); return 1; }
    if (pid == 0) {
      for (auto& k : kids) { ::close(k.cmd_fd); std::fclose(k.res); }
      ::close(cmd[1]);
      ::close(res[0]);
      RankEnv env = proto;
      env.rank = r;
      if (!hosts.empty()) env.host = hosts[r];
      RankMain(env, netns.empty() ? "" : netns[r], cmd[0], res[1], factory);
    }
    ::close(cmd[0]);
    ::close(res[1]);
    kids.push_back({pid, cmd[1], ::fdopen(res[0], "r")});
  }
  ::signal(SIGPIPE, SIG_IGN);

  int rc = 0;
  auto collect = [&](std::vector<std::string>* lines) -> bool {
    lines->clear();
    for (size_t r = 0; r < kids.size(); ++r) {
      std::string line;
      if (!ReadLine(kids[r].res, &line)) line = "err rank " + std::to_string(r) + " died";
      lines->push_back(line);
    }
    for (auto& l : *lines) {
      if (l.rfind("err ", 0) == 0) { Fail(l.substr(4)); return false; }
    }
    return true;
  };
  std::vector<std::string> lines;
  if (!collect(&lines)) {
    rc = 1;
  } else {
    std::printf("{\"ready\": true, \"ranks\": %d}\n", ranks);
    std::fflush(stdout);
    for (std::string line; ReadLine(stdin, &line);) {
      auto w = Split(line, ' ');
      if (w.empty()) continue;
      if (w[0] == "quit") break;
      if (w[0] == "memcpy" && w.size() == 3) {
        size_t bytes = std::stoull(w[1]);
        std::printf("{\"memcpy_bytes\": %zu, \"gbps\": %.6g}\n", bytes, MemcpyGBps(bytes, std::stoi(w[2])));
        std::fflush(stdout);
        continue;
      }
      if (w[0] != "run") { Fail("bad command: " + line); rc = 1; break; }
      bool sent = true;
      for (auto& k : kids) sent = WriteLine(k.cmd_fd, line) && sent;
      if (!sent || !collect(&lines)) { rc = 1; break; }
      double worst = 0;
      long iters = 0;
      std::string per_rank;
      for (auto& l : lines) {
        auto f = Split(l, ' ');  // ok <median_s> <iters>
        double m = std::stod(f[1]);
        worst = std::max(worst, m);
        iters = std::stol(f[2]);
        per_rank += (per_rank.empty() ? "" : ", ") + f[1];
      }
      std::printf("{\"bytes\": %s, \"iters\": %ld, \"median_s\": %.9g, \"rank_median_s\": [%s]}\n", w[1].c_str(),
                  iters, worst, per_rank.c_str());
      std::fflush(stdout);
    }
  }
  for (auto& k : kids) {
    if (rc == 0) WriteLine(k.cmd_fd, "quit");
    ::close(k.cmd_fd);
  }
  for (auto& k : kids) {
    if (rc != 0) ::kill(k.pid, SIGKILL);
    int status = 0;
    ::waitpid(k.pid, &status, 0);
    std::fclose(k.res);
  }
  std::error_code ec;
  std::filesystem::remove_all(proto.tmpdir, ec);
  return rc;
}

}  // namespace bench
