#ifndef LOHAN_WIRE_VERSION_H_
#define LOHAN_WIRE_VERSION_H_

namespace lohan {

// The release of lohand, liblohan_client and lohanctl (they ship together).
inline constexpr char kLohanVersion[] = "0.1.0";

// proto/lohan.proto's ProtocolVersion: a major mismatch is refused at Hello.
inline constexpr unsigned kProtocolMajor = 1;
inline constexpr unsigned kProtocolMinor = 0;

}  // namespace lohan

#endif  // LOHAN_WIRE_VERSION_H_
