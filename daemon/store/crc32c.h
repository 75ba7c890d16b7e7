#ifndef LOHAN_DAEMON_STORE_CRC32C_H_
#define LOHAN_DAEMON_STORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace lohan {

// CRC32C (Castagnoli, the iSCSI polynomial 0x1EDC6F41, reflected), as used by
// ext4, iSCSI and LevelDB. Uses the SSE4.2 crc32 instruction when the CPU has
// it (checked once at run time) and a slicing table otherwise; both give the
// same values. Thread-safe; no allocation.
//
// Extends `crc` (the value returned for the preceding bytes; 0 to start) over
// `data[0, size)`. Crc32c(b, Crc32c(a)) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) {
  return Crc32cExtend(0, data, size);
}

// Exposed for tests: the portable table implementation, whatever the CPU.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);

// True when Crc32cExtend uses the SSE4.2 instruction on this machine.
bool Crc32cIsHardwareAccelerated();

}  // namespace lohan

#endif  // LOHAN_DAEMON_STORE_CRC32C_H_
