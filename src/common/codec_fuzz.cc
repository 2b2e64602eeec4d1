// libFuzzer target for the wire codec: the Reader must never crash, read out
// of bounds or over-allocate on arbitrary bytes.  Built with
// -DEMBER_BUILD_FUZZERS=ON under clang.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "common/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ember::codec::Reader;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.empty()) return 0;
  // First byte picks a sequence of field reads; the rest is the payload.
  const uint8_t program = static_cast<uint8_t>(bytes[0]);
  Reader r(bytes.substr(1));
  for (int step = 0; step < 64 && r.remaining() > 0; ++step) {
    ember::Status st;
    switch ((program + step) % 8) {
      case 0: { uint8_t v; st = r.GetU8(&v); break; }
      case 1: { uint16_t v; st = r.GetU16(&v); break; }
      case 2: { uint32_t v; st = r.GetU32(&v); break; }
      case 3: { int32_t v; st = r.GetI32(&v); break; }
      case 4: { int64_t v; st = r.GetI64(&v); break; }
      case 5: { double v; st = r.GetF64(&v); break; }
      case 6: { std::string v; st = r.GetString(&v); break; }
      case 7: { std::map<std::string, double> v; st = r.GetMap(&v); break; }
    }
    if (!st.ok()) break;
  }
  (void)r.ExpectEnd();
  return 0;
}
