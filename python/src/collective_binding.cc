// Bindings of include/ember/collective.h: the Communicator and its Stores.
// Type conversion only.  Arrays cross as DLPack/buffer-protocol ndarrays
// (numpy, PyTorch, TensorFlow, anything with __dlpack__), C-contiguous and
// on the CPU, and are reduced in place, without a copy; outputs are allocated
// by the caller (python/ember/collective.py).  An array whose element type the
// exporter cannot describe (numpy's ml_dtypes.bfloat16: neither the buffer
// protocol nor numpy's DLPack carries it) comes as a same-width integer view
// with `dtype` naming what its bits are.  The GIL is released for every call
// into the core.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bindings.h"
#include "ember/collective.h"
#include "ember/coordinator.h"

namespace ember::python {
namespace {

using namespace nb::literals;
using collective::CallOptions;
using collective::Communicator;
using collective::CommunicatorOptions;
using collective::DataType;
using collective::ReduceOp;
using collective::Store;
using collective::Work;

using Array = nb::ndarray<nb::device::cpu, nb::c_contig>;
// Host or accelerator memory (DLPack from torch, TensorFlow, CuPy, JAX): the
// calls that take it route by its device (ember/device.h).
using AnyArray = nb::ndarray<nb::c_contig>;

constexpr char kSupported[] = "float32, float64, bfloat16, float16, int32 or int64";  // DataType order

// "uint8", "complex64", "bool", ...: a DLPack element type as numpy names it.
std::string DlpackTypeName(const nb::dlpack::dtype& t) {
  using Code = nb::dlpack::dtype_code;
  std::string name;
  switch (static_cast<Code>(t.code)) {
    case Code::Int: name = "int"; break;
    case Code::UInt: name = "uint"; break;
    case Code::Float: name = "float"; break;
    case Code::Bfloat: name = "bfloat"; break;
    case Code::Complex: name = "complex"; break;
    case Code::Bool: return "bool";
    default: name = "dtype code " + std::to_string(t.code) + " of ";
  }
  name += std::to_string(t.bits);
  if (t.lanes != 1) name += " x" + std::to_string(t.lanes);
  return name;
}

// The core's element type of `a`.  With `as`, `a` is a view of raw bits (any
// element type of the same width) whose elements are `as`.
template <typename A>
DataType DataTypeOf(const A& a, std::optional<DataType> as = std::nullopt) {
  const nb::dlpack::dtype t = a.dtype();
  const auto code = static_cast<nb::dlpack::dtype_code>(t.code);
  if (as) {
    if (t.lanes == 1 && t.bits == 8 * collective::SizeOf(*as)) return *as;
    throw StatusError(Status::InvalidArgument(std::string("collectives: an array read as ") +
                                              collective::DataTypeName(*as) + " must have " +
                                              std::to_string(8 * collective::SizeOf(*as)) +
                                              "-bit elements; got " + DlpackTypeName(t)));
  }
  if (t.lanes == 1) {
    if (code == nb::dlpack::dtype_code::Float && t.bits == 32) return DataType::kFloat32;
    if (code == nb::dlpack::dtype_code::Float && t.bits == 64) return DataType::kFloat64;
    if (code == nb::dlpack::dtype_code::Float && t.bits == 16) return DataType::kFloat16;
    if (code == nb::dlpack::dtype_code::Bfloat && t.bits == 16) return DataType::kBFloat16;
    if (code == nb::dlpack::dtype_code::Int && t.bits == 32) return DataType::kInt32;
    if (code == nb::dlpack::dtype_code::Int && t.bits == 64) return DataType::kInt64;
  }
  throw StatusError(Status::InvalidArgument(std::string("collectives take ") + kSupported + " arrays; got " +
                                            DlpackTypeName(t)));
}

// Where `a` lives: host memory, or a CUDA device (DLPack kDLCUDA; kDLCUDAHost
// and managed memory are host-reachable and take the host path).  `ready`: the handle of an event
// the caller recorded after the work writing `a` (ember/device.h Device::ready), CUDA memory only.
device::Device DeviceOf(const AnyArray& a, std::optional<uintptr_t> ready = std::nullopt) {
  const int type = a.device_type();
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value ||
      type == nb::device::cuda_managed::value) {
    if (ready && *ready != 0) {
      throw StatusError(Status::InvalidArgument("collectives: a ready event is for CUDA memory; this array is "
                                                "in host memory"));
    }
    return {};
  }
  if (type == nb::device::cuda::value) {
    return {device::Kind::kCuda, a.device_id(), reinterpret_cast<device::Event>(ready.value_or(0))};
  }
  throw StatusError(Status::InvalidArgument("collectives take host or CUDA memory; got DLPack device type " +
                                            std::to_string(type)));
}

CallOptions Timeout(double seconds) {
  CallOptions o;
  o.timeout = SecondsToDuration(seconds);
  return o;
}

// Holds the arrays of an async call alive until the call ended.
struct PyWork {
  std::unique_ptr<Work> work;
  nb::object keep;
};

}  // namespace

void BindCollective(nb::module_& m) {
  nb::enum_<DataType>(m, "CollectiveDataType")
      .value("FLOAT32", DataType::kFloat32)
      .value("FLOAT64", DataType::kFloat64)
      .value("BFLOAT16", DataType::kBFloat16)
      .value("FLOAT16", DataType::kFloat16)
      .value("INT32", DataType::kInt32)
      .value("INT64", DataType::kInt64);
  nb::enum_<ReduceOp>(m, "ReduceOp")
      .value("SUM", ReduceOp::kSum)
      .value("AVERAGE", ReduceOp::kAverage)
      .value("MIN", ReduceOp::kMin)
      .value("MAX", ReduceOp::kMax);
  nb::enum_<collective::Transport>(m, "CollectiveTransport")
      .value("AUTO", collective::Transport::kAuto)
      .value("TCP", collective::Transport::kTcp);

  nb::class_<CommunicatorOptions>(m, "CommunicatorOptions", "ember::collective::CommunicatorOptions.")
      .def(nb::init<>())
      .def_rw("rank", &CommunicatorOptions::rank)
      .def_rw("size", &CommunicatorOptions::size)
      .def_rw("host", &CommunicatorOptions::host)
      .def_rw("name", &CommunicatorOptions::name)
      .def_rw("bind_host", &CommunicatorOptions::bind_host)
      .def_prop_rw(
          "secret", [](const CommunicatorOptions& o) { return nb::bytes(o.secret.data(), o.secret.size()); },
          [](CommunicatorOptions& o, nb::bytes b) { o.secret.assign(b.c_str(), b.size()); })
      .def_rw("prefix", &CommunicatorOptions::prefix)
      .def_rw("transport", &CommunicatorOptions::transport)
      .def_prop_rw(
          "connect_timeout", [](const CommunicatorOptions& o) { return DurationToSeconds(o.connect_timeout); },
          [](CommunicatorOptions& o, double s) { o.connect_timeout = SecondsToDuration(s); })
      .def_prop_rw(
          "timeout", [](const CommunicatorOptions& o) { return DurationToSeconds(o.timeout); },
          [](CommunicatorOptions& o, double s) { o.timeout = SecondsToDuration(s); })
      .def_rw("shm_buffer_bytes", &CommunicatorOptions::shm_buffer_bytes)
      .def_rw("shm_threads", &CommunicatorOptions::shm_threads)
      .def_rw("tcp_chunk_bytes", &CommunicatorOptions::tcp_chunk_bytes)
      .def_rw("device_chunk_bytes", &CommunicatorOptions::device_chunk_bytes)
      .def_rw("use_nccl", &CommunicatorOptions::use_nccl)
      .def_rw("nccl_libraries", &CommunicatorOptions::nccl_libraries)
      .def_prop_rw(
          "cuda_libraries", [](const CommunicatorOptions& o) { return o.cuda.libraries; },
          [](CommunicatorOptions& o, std::vector<std::string> libraries) { o.cuda.libraries = std::move(libraries); });

  nb::class_<Store>(m, "CollectiveStore", "Where ranks meet (ember::collective::Store).")
      .def_static("in_memory", &collective::NewInMemoryStore, "A store in this process (tests).")
      .def_static(
          "coordinator",
          [](const std::string& host, int port, nb::bytes secret, double connect_timeout) {
            ClientOptions co;
            co.connect_timeout = SecondsToDuration(connect_timeout);
            auto client = ValueOrThrow(
                CoordinatorClient::Connect(host, port, std::string(secret.c_str(), secret.size()), co));
            return collective::NewCoordinatorStore(std::shared_ptr<CoordinatorClient>(std::move(client)));
          },
          "host"_a, "port"_a, "secret"_a, "connect_timeout"_a, nb::call_guard<nb::gil_scoped_release>(),
          "The job's store: the coordinator's key/value store, over a connection of its own.");

  nb::class_<PyWork>(m, "CollectiveWork", "An asynchronous collective call in flight.")
      .def(
          "wait", [](PyWork& w) { ThrowIfError(w.work->Wait()); }, nb::call_guard<nb::gil_scoped_release>())
      .def("done", [](PyWork& w) { return w.work->Done(); });

  nb::class_<Communicator>(m, "Communicator", "ember::collective::Communicator (include/ember/collective.h).")
      .def_static(
          "create",
          [](const CommunicatorOptions& o, std::shared_ptr<Store> store) {
            return ValueOrThrow(Communicator::Create(o, std::move(store)));
          },
          "options"_a, "store"_a, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("size", &Communicator::size)
      .def("describe", &Communicator::Describe, "rank"_a)
      .def(
          "allreduce",
          [](Communicator& c, AnyArray a, ReduceOp op, double timeout, std::optional<DataType> dtype,
             std::optional<uintptr_t> ready) {
            const DataType dt = DataTypeOf(a, dtype);
            const device::Device where = DeviceOf(a, ready);
            nb::gil_scoped_release release;
            ThrowIfError(c.AllreduceOn(where, a.data(), a.size(), dt, op, Timeout(timeout)));
          },
          "array"_a, "op"_a, "timeout"_a = 0.0, "dtype"_a = nb::none(), "ready"_a = nb::none(),
          "`ready`: a CUDA event handle (torch.cuda.Event.cuda_event) recorded after the work writing `array`")
      .def(
          "allreduce_fused",
          [](Communicator& c, std::vector<Array> arrays, ReduceOp op, double timeout, std::optional<DataType> dtype) {
            if (arrays.empty()) return;
            const DataType dt = DataTypeOf(arrays[0], dtype);
            std::vector<std::span<std::byte>> spans;
            for (auto& a : arrays) {
              if (DataTypeOf(a, dtype) != dt) {
                throw StatusError(Status::InvalidArgument("allreduce_fused: every array must have one dtype"));
              }
              spans.emplace_back(static_cast<std::byte*>(a.data()), a.nbytes());
            }
            nb::gil_scoped_release release;
            ThrowIfError(c.AllreduceFused(spans, dt, op, Timeout(timeout)));
          },
          "arrays"_a, "op"_a, "timeout"_a = 0.0, "dtype"_a = nb::none())
      .def(
          "allreduce_async",
          [](Communicator& c, nb::object owner, AnyArray a, ReduceOp op, double timeout, std::optional<DataType> dtype,
             std::optional<uintptr_t> ready) {
            const DataType dt = DataTypeOf(a, dtype);
            auto work = c.AllreduceOnAsync(DeviceOf(a, ready), a.data(), a.size(), dt, op, Timeout(timeout));
            return PyWork{std::move(work), std::move(owner)};
          },
          "owner"_a, "array"_a, "op"_a, "timeout"_a = 0.0, "dtype"_a = nb::none(), "ready"_a = nb::none(),
          "`owner` (the array, and the `ready` event's owner) is held until the call ended")
      .def(
          "broadcast",
          [](Communicator& c, AnyArray a, int root, double timeout, std::optional<DataType> dtype,
             std::optional<uintptr_t> ready) {
            const DataType dt = DataTypeOf(a, dtype);
            const device::Device where = DeviceOf(a, ready);
            nb::gil_scoped_release release;
            ThrowIfError(c.BroadcastOn(where, a.data(), a.size(), dt, root, Timeout(timeout)));
          },
          "array"_a, "root"_a, "timeout"_a = 0.0, "dtype"_a = nb::none(), "ready"_a = nb::none())
      .def(
          "allgather",
          [](Communicator& c, Array in, Array out, double timeout, std::optional<DataType> dtype) {
            const DataType dt = DataTypeOf(in, dtype);
            if (DataTypeOf(out, dtype) != dt || out.size() != in.size() * static_cast<size_t>(c.size())) {
              throw StatusError(Status::InvalidArgument("allgather: the output must hold size * input elements of "
                                                        "the input's dtype"));
            }
            nb::gil_scoped_release release;
            ThrowIfError(c.Allgather(in.data(), in.size(), out.data(), dt, Timeout(timeout)));
          },
          "input"_a, "output"_a, "timeout"_a = 0.0, "dtype"_a = nb::none())
      .def(
          "allgatherv",
          [](Communicator& c, Array in, double timeout, std::optional<DataType> dtype) {
            const DataType dt = DataTypeOf(in, dtype);
            std::vector<std::byte> out;
            std::vector<uint64_t> counts;
            {
              nb::gil_scoped_release release;
              ThrowIfError(c.AllgatherV(in.data(), in.size(), dt, &out, &counts, Timeout(timeout)));
            }
            return std::make_pair(nb::bytes(reinterpret_cast<const char*>(out.data()), out.size()), counts);
          },
          "input"_a, "timeout"_a = 0.0, "dtype"_a = nb::none())
      .def(
          "reduce_scatter",
          [](Communicator& c, Array in, Array out, ReduceOp op, double timeout, std::optional<DataType> dtype) {
            const DataType dt = DataTypeOf(in, dtype);
            if (DataTypeOf(out, dtype) != dt || in.size() != out.size() * static_cast<size_t>(c.size())) {
              throw StatusError(Status::InvalidArgument("reduce_scatter: the input must hold size * output elements "
                                                        "of the output's dtype"));
            }
            nb::gil_scoped_release release;
            ThrowIfError(c.ReduceScatter(in.data(), out.data(), out.size(), dt, op, Timeout(timeout)));
          },
          "input"_a, "output"_a, "op"_a, "timeout"_a = 0.0, "dtype"_a = nb::none())
      .def(
          "barrier", [](Communicator& c, double timeout) { ThrowIfError(c.Barrier(Timeout(timeout))); },
          "timeout"_a = 0.0, nb::call_guard<nb::gil_scoped_release>())
      .def("abort", &Communicator::Abort, "reason"_a, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace ember::python
