// TensorBoard event files: the log a training program writes for
// TensorBoard's scalars, histograms, text and images dashboards.
//
// One EventWriter writes one file, `<log_dir>/events.out.tfevents.<secs>.
// <host>.<pid>.<n><file_suffix>` (TF's name, with TF2's `.<pid>.<n>` so two
// writers opened in the same second never share a file).  The file is a
// TFRecord file (ember/record.h: masked CRC32C framing) of `tensorflow.Event`
// protocol buffers; the first is `file_version: "brain.Event:2"`.  Every event
// carries the wall time from the system clock and the caller's step.
//
// What each Add* writes (docs/architecture.md, "Summaries"):
//   AddScalar     Summary.Value.simple_value (TF1's form; TensorBoard's
//                 data_compat reads it as a scalars-plugin tensor)
//   AddHistogram  Summary.Value.histo, a HistogramProto with TF1's default
//                 buckets (exponential, factor 1.1, from 1e-12 to 1e20, both signs)
//   AddText       a DT_STRING scalar tensor with plugin_name "text"
//   AddImage      Summary.Value.image (encoded PNG or JPEG bytes)
//
// The file lives on any fs::FileSystem, so the log dir may be on HDFS.
// Events reach the file object as they are added (it buffers: 64 KiB
// locally, write_chunk_bytes on HDFS) and become visible to readers on
// Flush, Close, and every `flush_period` from a background thread.
//
// Thread safety: an EventWriter is safe for concurrent use from many threads
// without external synchronization.  Add* never waits for the periodic
// flush except while it holds the file (at most one flush's I/O).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ember/fs.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember::summary {

// Value type.
struct EventWriterOptions {
  // Appended to the file name (TF's filename_suffix), e.g. ".v2" or ".eval".
  std::string file_suffix;
  // How often buffered events are flushed to the file system by a background
  // thread; zero or negative: only on Flush() and Close().  TF's default
  // (flush_millis of tf.summary.create_file_writer) is two minutes; ten
  // seconds keeps TensorBoard close behind a run at the cost of one write
  // (on HDFS one APPEND request) per period in which events were added; an
  // idle writer flushes nothing.
  Duration flush_period{10000};
};

class EventWriter {
 public:
  // Creates `log_dir` (and its parents) in `fs` if missing and a new event
  // file in it, writes the file_version event and flushes it, so the file
  // is visible to TensorBoard at once.  Starts the flush thread.
  //
  // On failure (the directory or file cannot be created, the first write
  // fails) returns the file system's error, naming the URI; nothing is left
  // open.  The writer shares ownership of `fs`.
  static Result<std::unique_ptr<EventWriter>> Open(std::shared_ptr<fs::FileSystem> fs,
                                                   const std::string& log_dir,
                                                   EventWriterOptions options = {});

  // Closes, dropping the status; call Close() and check it.
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // Each Add* appends one event (wall time now, `step`, one Summary.Value
  // tagged `tag`).  OK once the event is handed to the file object; it is
  // readable after the next flush.  InvalidArgument after Close or for an
  // empty tag; after a failed write (IOError naming the file's URI) every
  // later call returns that same error: an event file is append-only, and
  // one with a hole would mislead.
  Status AddScalar(std::string_view tag, double value, int64_t step);

  // A histogram of `values` (TF1's tf.summary.histogram).  InvalidArgument,
  // naming the tag, if a value is NaN or infinite (TF1 refuses them too).
  // An empty span writes an empty histogram.
  Status AddHistogram(std::string_view tag, std::span<const double> values, int64_t step);

  // A text summary (markdown in TensorBoard's text dashboard).
  Status AddText(std::string_view tag, std::string_view text, int64_t step);

  // An image: `encoded` is a PNG or JPEG file's bytes, of the given size and
  // channels (1 grey, 3 RGB, 4 RGBA); the bytes are not checked.
  Status AddImage(std::string_view tag, std::string_view encoded, int height, int width,
                  int channels, int64_t step);

  // Makes every event added so far visible to readers.  The first write
  // error, naming the URI; InvalidArgument after Close.
  Status Flush();

  // Stops the flush thread, flushes and closes the file.  Idempotent: later
  // calls return the first call's result.  Add* and Flush after Close are
  // InvalidArgument.
  Status Close();

  // The event file's URI (fs->Uri of its path).
  const std::string& uri() const;
  // The event file's path in its file system.
  const std::string& path() const;
  // Events written so far, the file_version event included.
  uint64_t events_written() const;

 private:
  class Impl;
  explicit EventWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Where node `job_name`:`task_index` of a job writes its events:
// `<log_dir>/<job_name>_<task_index>` ("hdfs://nn/logs/worker_1"), one
// directory per node, so that nodes never share a file and TensorBoard shows
// each node as a run.  Used by Node::OpenSummaryWriter (ember/node.h) and
// Python's ctx.summary_writer().
std::string NodeLogDir(const std::string& log_dir, const std::string& job_name, int task_index);

}  // namespace ember::summary
