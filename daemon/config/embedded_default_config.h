#ifndef LOHAN_DAEMON_CONFIG_EMBEDDED_DEFAULT_CONFIG_H_
#define LOHAN_DAEMON_CONFIG_EMBEDDED_DEFAULT_CONFIG_H_

namespace lohan {

// The text of deploy/lohand.toml, embedded at build time: the one source of
// every default.
extern const char kEmbeddedDefaultConfigToml[];

}  // namespace lohan

#endif  // LOHAN_DAEMON_CONFIG_EMBEDDED_DEFAULT_CONFIG_H_
