#!/usr/bin/env bash
# tools/install_grpc_release.sh's arguments: --help, and anything else refused with exit 2 before
# it touches the machine (it runs no dpkg-query, apt-get or build then).
set -u
script=tools/install_grpc_release.sh
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$script" --help) || fail "--help exited $?"
echo "$out" | grep -q "^usage: tools/install_grpc_release.sh" || fail "--help printed: $out"
for bad in "--bogus" "-h extra" "--help --help" "$(head -c 5000 /dev/zero | tr '\0' 'x')" $'\x01\x7f;$(id)'; do
  # shellcheck disable=SC2086
  err=$(PATH=/nonexistent "$BASH" "$script" $bad 2>&1 >/dev/null)
  code=$?
  [ $code -eq 2 ] || fail "'${bad:0:40}' exited $code, not 2: $err"
  echo "$err" | grep -q "unexpected argument" || fail "'${bad:0:40}': $err"
done
echo "PASS"
