#!/bin/sh
# with_fsize_limit.sh KIB COMMAND...: runs COMMAND with RLIMIT_FSIZE = KIB KiB and SIGXFSZ ignored,
# so writing past the limit fails with EFBIG instead of killing the process.
trap '' XFSZ
ulimit -f "$1"
shift
exec "$@"
