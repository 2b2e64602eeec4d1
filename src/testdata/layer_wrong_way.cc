// Not compiled: the input of the test layer_check_refuses_a_wrong_way_include
// (src/CMakeLists.txt).  A file of layer "common" that includes headers of a
// layer above it, internal and public; check_layer.cmake must refuse both.
#include "common/status.h"
#include "ember/status.h"
#include "feed/codec.h"
#include "ember/feed.h"
