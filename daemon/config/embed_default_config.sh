#!/bin/sh
# Turns deploy/lohand.toml into a C++ source defining kEmbeddedDefaultConfigToml.
set -eu
in=$1
out=$2
if grep -q ')lohan_toml"' "$in"; then
  echo "embed_default_config: $in contains the raw-string delimiter" >&2
  exit 1
fi
{
  echo '#include "daemon/config/embedded_default_config.h"'
  echo 'namespace lohan {'
  echo 'const char kEmbeddedDefaultConfigToml[] = R"lohan_toml('
  cat "$in"
  echo ')lohan_toml";'
  echo '}  // namespace lohan'
} >"$out"
