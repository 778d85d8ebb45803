// CatchTorch: runs fn and turns a LibTorch c10::Error into an absl::Status, so no exception
// crosses a module boundary. Shared by codec/ and stage_runtime/.
//   return CatchTorch("forward", [&]() -> absl::StatusOr<torch::Tensor> { ... });
#ifndef LONGHAUL_COMMON_TORCH_STATUS_H_
#define LONGHAUL_COMMON_TORCH_STATUS_H_

#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace longhaul {

template <typename Fn>
auto CatchTorch(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": libtorch: ", e.what_without_backtrace()));
  }
}

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_TORCH_STATUS_H_
