#ifndef LOHAN_PLUGINS_LIBTORCH_LOHAN_ERROR_H_
#define LOHAN_PLUGINS_LIBTORCH_LOHAN_ERROR_H_

#include <stdexcept>
#include <string>

namespace lohan::torch_plugin {

// A failed call of the C ABI: what() is lohan_last_error() of that call,
// status() its lohan_status code (LOHAN_NOT_FOUND, ...).
class LohanError : public std::runtime_error {
 public:
  LohanError(int status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// Throws LohanError with lohan_last_error() unless `status` is LOHAN_OK.
// Call it right after the lohan_ call, on the same thread.
void ThrowIfFailed(int status);

}  // namespace lohan::torch_plugin

#endif  // LOHAN_PLUGINS_LIBTORCH_LOHAN_ERROR_H_
