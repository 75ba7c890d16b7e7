#include "daemon/store/crc32c.h"

#include <array>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace lohan {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

// tables[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPolyReflected : 0);
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
      }
    }
  }
};

const Tables& GetTables() {
  static const Tables* tables = new Tables();
  return *tables;
}

// The CRC register (no pre- or post-inversion) is linear over GF(2) in the
// register and the data: running it over A from state s gives
// ZeroShift(s, |A|) ^ (A run from state 0), where ZeroShift(s, n) is s run
// over n zero bytes. So a buffer can be split into parts whose CRCs are
// computed independently and joined with ZeroShift. ZeroShift for a fixed n
// is a linear map of the 32-bit register: kept as four byte tables.
class ZeroShift {
 public:
  explicit ZeroShift(size_t zero_bytes) {
    const auto& byte_table = GetTables().t[0];
    uint32_t image[32];
    for (int bit = 0; bit < 32; ++bit) {
      uint32_t c = uint32_t{1} << bit;
      for (size_t i = 0; i < zero_bytes; ++i) {
        c = (c >> 8) ^ byte_table[c & 0xFF];
      }
      image[bit] = c;
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if ((b >> bit) & 1) v ^= image[8 * k + bit];
        }
        table_[k][b] = v;
      }
    }
  }

  uint32_t operator()(uint32_t c) const {
    return table_[0][c & 0xFF] ^ table_[1][(c >> 8) & 0xFF] ^
           table_[2][(c >> 16) & 0xFF] ^ table_[3][c >> 24];
  }

 private:
  std::array<std::array<uint32_t, 256>, 4> table_;
};
static_assert(std::is_trivially_destructible_v<ZeroShift>);

#if defined(__x86_64__)
// The crc32 instruction takes 3 cycles and can start one a cycle: a single
// dependency chain uses a third of it. Three chains over three consecutive
// lanes of kLaneBytes, joined by ZeroShift, use all of it.
constexpr size_t kLaneBytes = 4096;

const ZeroShift& LaneShift() {
  static const ZeroShift shift(kLaneBytes);  // trivially destructible
  return shift;
}

__attribute__((target("sse4.2"))) uint64_t Chain(uint64_t c, const uint8_t* p,
                                                 size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  for (; n > 0; --n) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return c;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc,
                                                       const uint8_t* p,
                                                       size_t n) {
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  if (n >= 3 * kLaneBytes) {
    const ZeroShift& shift = LaneShift();
    for (; n >= 3 * kLaneBytes; n -= 3 * kLaneBytes, p += 3 * kLaneBytes) {
      uint64_t a = c;
      uint64_t b = 0;
      uint64_t d = 0;
      for (size_t i = 0; i < kLaneBytes; i += 8) {
        uint64_t wa, wb, wd;
        std::memcpy(&wa, p + i, 8);
        std::memcpy(&wb, p + kLaneBytes + i, 8);
        std::memcpy(&wd, p + 2 * kLaneBytes + i, 8);
        a = _mm_crc32_u64(a, wa);
        b = _mm_crc32_u64(b, wb);
        d = _mm_crc32_u64(d, wd);
      }
      const uint32_t ab =
          shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b);
      c = shift(ab) ^ static_cast<uint32_t>(d);
    }
  }
  return ~static_cast<uint32_t>(Chain(c, p, n));
}

bool CpuHasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size) {
  const Tables& tb = GetTables();
  const auto& t = tb.t;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    uint32_t lo;
    uint32_t hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;  // Little-endian host (x86-64, aarch64).
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^
        t[4][lo >> 24] ^ t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^
        t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
    --size;
  }
  return ~c;
}

bool Crc32cIsHardwareAccelerated() {
#if defined(__x86_64__)
  return CpuHasSse42();
#else
  return false;
#endif
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (CpuHasSse42()) {
    return ExtendSse42(crc, static_cast<const uint8_t*>(data), size);
  }
#endif
  return Crc32cExtendPortable(crc, data, size);
}

}  // namespace lohan
