// gpu_codec.h in a build without nvcc: the same interface, every call answering why it cannot run.
// (The CPU engines are the codecs' reference implementation; callers fall back to them.)
#include <string>

#include "codec/cuda/gpu_codec.h"

namespace longhaul::codec::gpu {
namespace {

absl::Status NotBuilt() {
  return absl::FailedPreconditionError("this build has no CUDA codec kernels (nvcc was not found at configure time)");
}

}  // namespace

bool Available(std::string* why) {
  if (why != nullptr) *why = std::string(NotBuilt().message());
  return false;
}

DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  data_ = o.data_;
  size_ = o.size_;
  return *this;
}
absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t) { return NotBuilt(); }

Workspace::Workspace() = default;
Workspace::~Workspace() = default;
absl::StatusOr<void*> Workspace::Scratch(int, size_t) { return NotBuilt(); }
absl::StatusOr<void*> Workspace::ZeroedScratch(int, size_t, Stream) { return NotBuilt(); }
void Workspace::MarkDirty(int) {}
absl::StatusOr<void*> Workspace::Pinned() { return NotBuilt(); }
absl::StatusOr<void*> Workspace::PinnedOnDevice() { return NotBuilt(); }
absl::Status Workspace::UploadAsync(void*, const void*, size_t, Stream) { return NotBuilt(); }

absl::Status Upload(void*, const void*, size_t, Stream) { return NotBuilt(); }
absl::Status Download(void*, const void*, size_t, Stream) { return NotBuilt(); }
absl::Status CopyOnDevice(void*, const void*, size_t, Stream) { return NotBuilt(); }
absl::Status Synchronize(Stream) { return NotBuilt(); }
absl::Status AppendToHost(const DeviceBytes&, Stream, std::string*) { return NotBuilt(); }

absl::StatusOr<DeviceBytes> GroupQuantEncode(const void*, FrameDtype, int64_t, int64_t, const GroupQuantParams&,
                                             Workspace&, Stream, GroupQuantStats*) {
  return NotBuilt();
}
absl::StatusOr<DeviceBytes> SymQuantEncode(const void*, FrameDtype, int64_t, const SymQuantParams&, uint64_t,
                                           Workspace&, Stream, int64_t) {
  return NotBuilt();
}
absl::StatusOr<DeviceBytes> BitDpEncode(const void*, FrameDtype, int64_t, int64_t, int, Workspace&, Stream) {
  return NotBuilt();
}
absl::Status GroupQuantDecode(const uint8_t*, const GroupQuantLayout&, int64_t, int64_t, const GroupQuantParams&,
                              float*, Workspace&, Stream) {
  return NotBuilt();
}
absl::Status SymQuantDecode(const uint8_t*, int64_t, const SymQuantParams&, float*, Stream) { return NotBuilt(); }
absl::Status BitDpDecode(const uint8_t*, int64_t, int64_t, int, float*, Stream) { return NotBuilt(); }

}  // namespace longhaul::codec::gpu
