#!/usr/bin/env bash
# scripts/test.sh's own stages, on a copy whose set-up, sanitizer stage and ctest are stand-ins:
# the packages are installed first, once; the sanitizer build runs beside the main build and
# suites at nice 19 in its own process group of the same session, installing nothing; a failed main suite stops it and gives ctest's status; a failed build gives its own,
# with its log; the log is never written through a link.
#   tools/test_test_script.sh
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'pkill -f -- "$dir/" 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$dir/scripts" "$dir/tools" "$dir/bin" "$dir/build"
cp "$src/scripts/test.sh" "$dir/scripts/"
cp "$src/tools/record_times.py" "$dir/tools/"
git -C "$dir" init -q
cat > "$dir/scripts/bootstrap.sh" <<'EOF'
#!/usr/bin/env bash
echo "bootstrap $* (no apt: ${WRAPCERT_NO_APT:-0})"
[ "${1:-}" != wrapcert_main_suites ] || exit "${MAIN_BUILD_STATUS:-0}"
EOF
cat > "$dir/scripts/sanitize.sh" <<'EOF'
#!/usr/bin/env bash
if [ "${1:-}" = --build-only ]; then
  # What the build ran as: its nice, whether it leads its own process group, its session.
  echo "sanitizer build: nice $(nice) pgid $(ps -o pgid= -p $$) pid $$ sid $(ps -o sid= -p $$) apt ${WRAPCERT_NO_APT:-0}"
  sleep "${BUILD_SECONDS:-1}"
  exit "${BUILD_STATUS:-0}"
fi
echo "sanitizer suites"
EOF
cat > "$dir/bin/ctest" <<'EOF'
#!/usr/bin/env bash
echo "main suites: sid $(ps -o sid= -p $$)"
sleep 1
exit "${CTEST_STATUS:-0}"
EOF
chmod +x "$dir/scripts/"*.sh "$dir/bin/ctest"
run() { PATH="$dir/bin:$PATH" "$dir/scripts/test.sh" > "$dir/out.txt" 2>&1; }

# Everything passes: every stage ran, the build as it should, the times recorded.
run || { cat "$dir/out.txt"; fail "test.sh failed where every stage passed"; }
grep -q "sanitizer suites" "$dir/out.txt" || fail "the sanitizer suites did not run"
line=$(grep "sanitizer build: " "$dir/out.txt") || fail "the sanitizer build's log was not shown"
read -r _ _ _ nice _ pgid _ pid _ sid _ no_apt <<< "$line"
[ "$no_apt" = 1 ] || fail "the sanitizer build may install packages beside the main build"
[ "$nice" = 19 ] || fail "the sanitizer build ran at nice $nice, not 19"
[ "$pgid" = "$pid" ] || fail "the sanitizer build is not in a process group of its own"
main_sid=$(sed -n 's/^main suites: sid *//p' "$dir/out.txt")
[ "$(grep -m1 '^bootstrap' "$dir/out.txt")" = "bootstrap --packages (no apt: 0)" ] ||
  fail "the packages were not installed first: $(grep '^bootstrap' "$dir/out.txt")"
grep -q "^bootstrap wrapcert_main_suites (no apt: 0)" "$dir/out.txt" || fail "no main build"
[ "$sid" = "$main_sid" ] || fail "the sanitizer build is in another session (another autogroup)"
/usr/bin/python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))["seconds"]
assert set(s) == {"build", "main suites", "sanitizer build after the main suites",
                  "sanitizer suites", "total"}, s' "$dir/build/test-times.json" ||
  fail "the stages recorded are not the four"

# A failed main suite: its status, and nothing of the build left running.
CTEST_STATUS=8 BUILD_SECONDS=30 run
code=$?
[ "$code" -eq 8 ] || fail "a failed main suite gave $code, not 8"
sleep 0.5
if pgrep -f -- "$dir/scripts/sanitize.sh" > /dev/null; then fail "the sanitizer build kept running"; fi

# A failed main build: its status, no suites run, nothing of the sanitizer build left running.
MAIN_BUILD_STATUS=5 BUILD_SECONDS=30 run
code=$?
[ "$code" -eq 5 ] || fail "a failed main build gave $code, not 5"
if grep -q "main suites" "$dir/out.txt"; then fail "the main suites ran after a failed build"; fi
sleep 0.5
if pgrep -f -- "$dir/scripts/sanitize.sh" > /dev/null; then fail "the sanitizer build kept running after the main build failed"; fi

# A failed sanitizer build: its status, its log shown, no suites run.
BUILD_STATUS=3 run
code=$?
[ "$code" -eq 3 ] || fail "a failed sanitizer build gave $code, not 3"
grep -q "sanitizer build: " "$dir/out.txt" || fail "the failed build's log was not shown"
if grep -q "sanitizer suites" "$dir/out.txt"; then fail "the suites ran after a failed build"; fi

# The log's path is a link: refused, nothing written where it points.
rm -f "$dir/build/sanitizer-build.log"
ln -s "$dir/elsewhere" "$dir/build/sanitizer-build.log"
run && fail "test.sh wrote its log through a link"
grep -q "not a regular file" "$dir/out.txt" || fail "the refusal does not say why"
[ ! -e "$dir/elsewhere" ] || fail "something was written through the link"
echo "scripts/test.sh: the sanitizer build beside the main build and suites, stopped and reported as it should"
