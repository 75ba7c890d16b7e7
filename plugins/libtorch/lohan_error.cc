#include "plugins/libtorch/lohan_error.h"

#include "lohan/lohan_client.h"

namespace lohan::torch_plugin {

void ThrowIfFailed(int status) {
  if (status != LOHAN_OK) throw LohanError(status, lohan_last_error());
}

}  // namespace lohan::torch_plugin
