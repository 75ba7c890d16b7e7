#include "daemon/store/aio_device.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/common/check.h"
#include "daemon/store/aligned_buffer.h"
#include "wire/errno_status.h"

namespace lohan {

struct AioBlockDevice::Slot {
  struct iocb cb;
  IoRequest request;
};

namespace {

// The device whose completion thread this is (null elsewhere).
thread_local const AioBlockDevice* t_completion_thread_of = nullptr;

const char* OpName(IoRequest::Op op) {
  return op == IoRequest::Op::kRead ? "read" : "write";
}

absl::Status IoContextError(IoRequest::Op op, const std::string& path,
                            uint64_t offset, uint64_t length, int error) {
  return ErrnoToStatus(error, absl::StrCat(OpName(op), " ", path, " at offset ",
                                           offset, " length ", length));
}

// Reads one block to check that the file really accepts O_DIRECT I/O (some
// filesystems accept the open flag and fail the I/O with EINVAL).
int ProbeRead(int fd, uint32_t block_size) {
  AlignedBuffer probe(block_size, block_size);
  ssize_t n = ::pread(fd, probe.data(), block_size, 0);
  return n < 0 ? errno : 0;
}

}  // namespace

std::string AioBlockDevice::DataFilePath(const std::string& ssd_path) {
  struct stat st;
  return ::stat(ssd_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)
             ? absl::StrCat(ssd_path, "/lohan.data")
             : ssd_path;
}

absl::StatusOr<std::unique_ptr<AioBlockDevice>> AioBlockDevice::Open(
    const AioDeviceOptions& options) {
  const uint32_t bs = options.block_size;
  if (bs < 512 || (bs & (bs - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be a power of two >= 512, got ", bs));
  }
  if (options.queue_depth == 0) {
    return absl::InvalidArgumentError("queue_depth must be > 0");
  }
  struct stat st;
  if (::stat(options.path.c_str(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat SSD path ", options.path));
  }
  std::string file_path = options.path;
  const bool is_block = S_ISBLK(st.st_mode);
  if (S_ISDIR(st.st_mode)) {
    file_path = absl::StrCat(options.path, "/lohan.data");
  } else if (!is_block && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SSD path ", options.path,
        " is neither a directory, a regular file nor a block device"));
  }

  struct stat existing;
  const bool created = !is_block && ::stat(file_path.c_str(), &existing) != 0;
  bool direct = true;
  int flags = O_RDWR | O_CLOEXEC | (is_block ? 0 : O_CREAT);
  UniqueFd fd(::open(file_path.c_str(), flags | O_DIRECT, 0600));
  if (!fd.valid() && errno != EINVAL) {
    return ErrnoToStatus(errno, absl::StrCat("open ", file_path));
  }
  if (fd.valid() && ProbeRead(fd.get(), bs) == EINVAL) fd.reset();
  if (!fd.valid()) {
    if (!options.allow_buffered_io) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the filesystem of SSD path ", options.path,
          " refuses O_DIRECT (tmpfs/ramfs?); use a real SSD filesystem or set "
          "allow_buffered_io to accept slower buffered I/O"));
    }
    std::fprintf(stderr,
                 "lohan store: WARNING: %s refuses O_DIRECT; using buffered "
                 "I/O (slower, goes through the page cache)\n",
                 options.path.c_str());
    direct = false;
    fd.reset(::open(file_path.c_str(), flags, 0600));
    if (!fd.valid()) {
      return ErrnoToStatus(errno, absl::StrCat("open ", file_path));
    }
  }

  // One store per SSD: another lohand (or a second store here) writing the
  // same file would overwrite this one's tensors. Held while fd is open.
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SSD path ", options.path, " (", file_path,
          ") is in use by another lohand store (it holds the file's lock); "
          "give each daemon its own SSD paths"));
    }
    return ErrnoToStatus(errno, absl::StrCat("flock ", file_path));
  }

  uint64_t size = 0;
  if (is_block) {
    if (::ioctl(fd.get(), BLKGETSIZE64, &size) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("BLKGETSIZE64 ", file_path));
    }
    if (options.capacity_bytes > 0 && options.capacity_bytes < size) {
      size = options.capacity_bytes;
    }
  } else {
    struct stat fst;
    if (::fstat(fd.get(), &fst) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("fstat ", file_path));
    }
    size = static_cast<uint64_t>(fst.st_size);
    if (options.capacity_bytes > 0) {
      if (size < options.capacity_bytes) {
        int rc = ::fallocate(fd.get(), 0, 0,
                             static_cast<off_t>(options.capacity_bytes));
        if (rc != 0 && errno == EOPNOTSUPP) {
          rc =
              ::ftruncate(fd.get(), static_cast<off_t>(options.capacity_bytes));
        }
        if (rc != 0) {
          return ErrnoToStatus(
              errno, absl::StrCat("preallocate ", options.capacity_bytes,
                                  " bytes for ", file_path));
        }
      }
      size = options.capacity_bytes;
    }
  }
  if (created) {
    // The new file and its size must survive a crash before any commit
    // points into it.
    UniqueFd dir(
        ::open(options.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (::fsync(fd.get()) != 0 || !dir.valid() || ::fsync(dir.get()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("fsync new ", file_path));
    }
  }
  const uint64_t capacity = size / bs * bs;
  if (capacity == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SSD path ", options.path,
        " has no space: set device_capacity_bytes to create its data file"));
  }

  UniqueFd event_fd(::eventfd(0, EFD_CLOEXEC));
  if (!event_fd.valid()) return ErrnoToStatus(errno, "eventfd");
  io_context_t context = nullptr;
  int rc = ::io_setup(static_cast<int>(options.queue_depth), &context);
  if (rc != 0) {
    return ErrnoToStatus(-rc, absl::StrCat("io_setup(", options.queue_depth,
                                           ") for ", options.path));
  }
  return std::unique_ptr<AioBlockDevice>(new AioBlockDevice(
      options.path, std::move(file_path), std::move(fd), std::move(event_fd),
      context, capacity, options, direct));
}

AioBlockDevice::AioBlockDevice(std::string path, std::string file_path,
                               UniqueFd fd, UniqueFd event_fd,
                               io_context_t context, uint64_t capacity,
                               const AioDeviceOptions& options, bool direct_io)
    : path_(std::move(path)),
      file_path_(std::move(file_path)),
      fd_(std::move(fd)),
      event_fd_(std::move(event_fd)),
      context_(context),
      capacity_(capacity),
      block_size_(options.block_size),
      queue_depth_(options.queue_depth),
      queue_capacity_(options.submit_queue_capacity > 0
                          ? options.submit_queue_capacity
                          : 2 * options.queue_depth),
      direct_io_(direct_io) {
  thread_ = std::thread([this] { Run(); });
}

AioBlockDevice::~AioBlockDevice() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  uint64_t one = 1;
  (void)!::write(event_fd_.get(), &one, sizeof(one));
  thread_.join();
  ::io_destroy(context_);
}

void AioBlockDevice::Submit(IoRequest request) {
  LOHAN_CHECK(request.done != nullptr);
  const uint64_t bs = block_size_;
  absl::Status invalid;
  if (reinterpret_cast<uintptr_t>(request.buffer) % bs != 0 ||
      request.offset % bs != 0 || request.length % bs != 0 ||
      request.length == 0) {
    invalid = absl::InvalidArgumentError(
        absl::StrCat(OpName(request.op), " ", path_, " at offset ",
                     request.offset, " length ", request.length,
                     ": buffer, offset and length must be "
                     "non-zero multiples of the block size ",
                     bs));
  } else if (request.offset > capacity_ ||
             request.length > capacity_ - request.offset) {
    invalid = absl::OutOfRangeError(absl::StrCat(
        OpName(request.op), " ", path_, " at offset ", request.offset,
        " length ", request.length, " is past the capacity ", capacity_));
  }
  if (!invalid.ok()) {
    request.done(IoResult{invalid, request.length, 0});
    return;
  }
  if (t_completion_thread_of == this) {
    // From a done callback: never block (this thread is the one that frees
    // queue space) and no wake-up needed (the loop looks at the queue right
    // after the callbacks).
    mu_.Lock();
    if (stopping_) {
      mu_.Unlock();
      request.done(IoResult{
          absl::CancelledError(absl::StrCat("device ", path_, " is closing")),
          request.length, 0});
      return;
    }
    queue_.push_back(std::move(request));
    mu_.Unlock();
    return;
  }
  {
    mu_.LockWhen(absl::Condition(
        +[](AioBlockDevice* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) {
          return d->stopping_ || d->queue_.size() < d->queue_capacity_;
        },
        this));
    if (stopping_) {
      mu_.Unlock();
      request.done(IoResult{
          absl::CancelledError(absl::StrCat("device ", path_, " is closing")),
          request.length, 0});
      return;
    }
    queue_.push_back(std::move(request));
    mu_.Unlock();
  }
  uint64_t one = 1;
  (void)!::write(event_fd_.get(), &one, sizeof(one));
}

absl::Status AioBlockDevice::Flush() {
  if (::fdatasync(fd_.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fdatasync ", file_path_));
  }
  return absl::OkStatus();
}

void AioBlockDevice::Run() {
  t_completion_thread_of = this;
  std::vector<Slot> slots(queue_depth_);
  std::vector<Slot*> free_slots;
  for (Slot& s : slots) free_slots.push_back(&s);
  std::vector<struct iocb*> ready;  // Prepared, not yet accepted by io_submit.
  std::vector<struct io_event> events(queue_depth_);
  uint32_t in_flight = 0;

  auto complete = [&](Slot* slot, IoResult result) {
    IoRequest request = std::move(slot->request);
    slot->request = IoRequest();
    free_slots.push_back(slot);
    request.done(result);
  };
  auto reap = [&](long min_nr) {
    struct timespec zero = {0, 0};
    int n = ::io_getevents(context_, min_nr, static_cast<long>(events.size()),
                           events.data(), min_nr == 0 ? &zero : nullptr);
    if (n < 0) {
      LOHAN_CHECK(n == -EINTR);  // Anything else is our bug (bad context).
      return;
    }
    for (int i = 0; i < n; ++i) {
      Slot* slot = static_cast<Slot*>(events[i].data);
      --in_flight;
      const IoRequest& rq = slot->request;
      const int64_t res = static_cast<int64_t>(events[i].res);
      IoResult result{absl::OkStatus(), rq.length, 0};
      if (res < 0) {
        result.status = IoContextError(rq.op, path_, rq.offset, rq.length,
                                       static_cast<int>(-res));
      } else {
        result.transferred = static_cast<uint64_t>(res);
        if (result.transferred < rq.length) {
          result.status = absl::DataLossError(absl::StrCat(
              "short ", OpName(rq.op), " on ", path_, " at offset ", rq.offset,
              ": ", result.transferred, " of ", rq.length, " bytes (residual ",
              result.residual(), ")"));
        }
      }
      complete(slot, std::move(result));
    }
  };

  while (true) {
    reap(0);
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      while (!queue_.empty() && !free_slots.empty()) {
        Slot* slot = free_slots.back();
        free_slots.pop_back();
        slot->request = std::move(queue_.front());
        queue_.pop_front();
        IoRequest& rq = slot->request;
        if (rq.op == IoRequest::Op::kRead) {
          ::io_prep_pread(&slot->cb, fd_.get(), rq.buffer, rq.length,
                          static_cast<long long>(rq.offset));
        } else {
          ::io_prep_pwrite(&slot->cb, fd_.get(), rq.buffer, rq.length,
                           static_cast<long long>(rq.offset));
        }
        ::io_set_eventfd(&slot->cb, event_fd_.get());
        slot->cb.data = slot;
        ready.push_back(&slot->cb);
      }
      stop = stopping_ && queue_.empty();
    }

    bool submit_blocked = false;
    size_t done = 0;
    while (done < ready.size()) {
      int n = ::io_submit(context_, static_cast<long>(ready.size() - done),
                          ready.data() + done);
      if (n > 0) {
        done += static_cast<size_t>(n);
        in_flight += static_cast<uint32_t>(n);
      } else if (n == -EAGAIN || n == 0) {
        submit_blocked = true;  // Kernel out of resources: reap first.
        break;
      } else if (n == -EINTR) {
        continue;
      } else {
        // The first remaining iocb was refused; fail it and go on.
        Slot* slot = static_cast<Slot*>(ready[done]->data);
        const IoRequest& rq = slot->request;
        IoResult result{IoContextError(rq.op, path_, rq.offset, rq.length, -n),
                        rq.length, 0};
        ++done;
        complete(slot, std::move(result));
      }
    }
    ready.erase(ready.begin(), ready.begin() + static_cast<long>(done));

    if (stop && ready.empty() && in_flight == 0) break;
    if (submit_blocked) {
      if (in_flight > 0) {
        reap(1);
      } else {
        struct timespec pause = {0, 100 * 1000};
        ::nanosleep(&pause, nullptr);
      }
      continue;
    }
    {
      // Go around again at once if there is queued work and a free slot.
      absl::MutexLock lock(&mu_);
      if ((!queue_.empty() && !free_slots.empty()) || stopping_) {
        if (!stopping_ || in_flight == 0) continue;
      }
    }
    uint64_t count;
    ssize_t r = ::read(event_fd_.get(), &count, sizeof(count));
    LOHAN_CHECK(r == sizeof(count) || errno == EINTR);
  }
}

}  // namespace lohan
