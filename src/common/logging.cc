#include "common/logging.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace ember {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}
LogSink& Sink() {  // guarded by SinkMutex()
  static LogSink sink;
  return sink;
}

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarn: return "WARN";
    case LogLevel::kError: return "ERROR";
  }
  return "?";
}

void SetLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_min_level.load()); }

void SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(sink);
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  const std::string msg = stream_.str();
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (Sink()) {
    Sink()(level_, msg);
    return;
  }
  std::fprintf(stderr, "[ember %s %s:%d] %s\n", LogLevelName(level_).data(), Basename(file_),
               line_, msg.c_str());
}

}  // namespace internal
}  // namespace ember
