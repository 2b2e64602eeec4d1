// Minimal leveled logging to stderr.
//
//   EMBER_LOG(WARN) << "rejected connection from " << peer;
//
// Messages below the minimum level (default INFO) are not formatted at all.
// The sink is process-wide and replaceable (tests capture lines with it);
// SetLogSink/SetLogLevel and logging itself are thread-safe.
#pragma once

#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace ember {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

std::string_view LogLevelName(LogLevel level);

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
inline bool LogEnabled(LogLevel level) { return level >= GetLogLevel(); }

// Receives each formatted message (without trailing newline).  A null sink
// restores the default, which writes "[ember WARN file:line] msg" to stderr.
using LogSink = std::function<void(LogLevel, std::string_view message)>;
void SetLogSink(LogSink sink);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};
}  // namespace internal

}  // namespace ember

#define EMBER_LOG_LEVEL_DEBUG ::ember::LogLevel::kDebug
#define EMBER_LOG_LEVEL_INFO ::ember::LogLevel::kInfo
#define EMBER_LOG_LEVEL_WARN ::ember::LogLevel::kWarn
#define EMBER_LOG_LEVEL_ERROR ::ember::LogLevel::kError
#define EMBER_LOG(severity)                                 \
  if (!::ember::LogEnabled(EMBER_LOG_LEVEL_##severity)) {   \
  } else                                                    \
    ::ember::internal::LogMessage(EMBER_LOG_LEVEL_##severity, __FILE__, __LINE__).stream()
