// libFuzzer target for every decoder of bytes a collective peer sends
// (call.h): the call descriptor at the start of every call, and the TCP
// ring's hello and abort frames.  A decoder must reject or accept, never
// crash, and what it accepts must survive a round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "collective/call.h"
#include "common/codec.h"

using namespace ember::collective;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);

  {
    ember::codec::Reader r(bytes);
    CallDesc d;
    if (DecodeCallDesc(&r, &d).ok()) {
      ember::codec::Writer w;
      EncodeCallDesc(d, &w);
      ember::codec::Reader again(w.data());
      CallDesc e;
      if (!DecodeCallDesc(&again, &e).ok() || !(d == e)) std::abort();
      (void)d.ToString();
    }
  }
  {
    Hello h;
    if (DecodeHello(bytes, &h).ok()) {
      Hello again;
      if (!DecodeHello(EncodeHello(h), &again).ok() || again.ring_id != h.ring_id || again.from != h.from) {
        std::abort();
      }
    }
  }
  {
    int origin = -1;
    const int ring_size = size > 0 ? 1 + data[0] % 8 : 1;
    ember::Status s = DecodeAbort(bytes, ring_size, &origin);
    if (s.code() != ember::StatusCode::kCorruption && (origin < 0 || origin >= ring_size)) std::abort();
  }
  return 0;
}
