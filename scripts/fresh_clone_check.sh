#!/usr/bin/env bash
# The README's two commands, exactly as written, on a fresh clone of this repository.
#
#   scripts/fresh_clone_check.sh [REPO]      (default: the repository this script is in)
#
# 1. `make run` starts poot-serve in the foreground: this script runs it in the background,
#    waits (bounded) for GET /health to answer 200, sends one chat completion, then stops it.
# 2. `make test` must pass.
# Both commands are read from README.md's "The two commands" section, so the check fails when
# the README and the Makefile drift apart. Exit status: 0 only if both pass.
set -euo pipefail

repo="${1:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}"
work="$(mktemp -d "${TMPDIR:-/tmp}/poot-fresh.XXXXXX")"
port="${POOT_CHECK_PORT:-18431}"
log="$work/run.log"
server=""

cleanup() {
    if [[ -n "$server" ]] && kill -0 "$server" 2>/dev/null; then
        kill -- "-$server" 2>/dev/null || kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
    fi
}
trap cleanup EXIT

git clone -q "$repo" "$work/poot"
# Tests read real checkpoints at ../shared/models, beside the checkout (CI has the same copy).
shared="$(cd "$repo/.." && pwd)/shared"
[[ -d "$shared" ]] && ln -s "$shared" "$work/shared"
cd "$work/poot"

# The fenced commands under "## The two commands", in order.
mapfile -t commands < <(awk '/^## The two commands/{on=1; next} /^## /{on=0} on && /^```/{f=!f; next} on && f' README.md)
if [[ "${#commands[@]}" -ne 2 ]]; then
    echo "README.md's 'The two commands' section has ${#commands[@]} commands, expected 2" >&2
    exit 1
fi
echo "main job: ${commands[0]}"
echo "tests:    ${commands[1]}"

# 1. The main job, on a port of our own (SERVE_ARGS is the Makefile's documented hook).
set -m
SERVE_ARGS="--port $port" bash -c "${commands[0]}" >"$log" 2>&1 &
server=$!
set +m
deadline=$((SECONDS + ${POOT_CHECK_TIMEOUT_S:-1800}))
until curl -fsS "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"ok"'; do
    if ! kill -0 "$server" 2>/dev/null; then
        echo "the main job exited before it was healthy; its log:" >&2
        tail -50 "$log" >&2
        exit 1
    fi
    if ((SECONDS > deadline)); then
        echo "the main job was not healthy within the time limit; its log:" >&2
        tail -50 "$log" >&2
        exit 1
    fi
    sleep 2
done
grep -q "127.0.0.1:$port" "$log" || { echo "the main job did not print where it listens" >&2; exit 1; }
model="$(curl -fsS "http://127.0.0.1:$port/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')"
curl -fsS "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$model\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 8}" \
    | python3 -c 'import json,sys; r=json.load(sys.stdin); print("reply:", repr(r["choices"][0]["message"]["content"]))'
cleanup
server=""
echo "main job: ok"

# 2. The tests.
bash -c "${commands[1]}"
echo "tests: ok"
echo "fresh-clone check passed in $work/poot"
